"""The content hash of what ``python -m gptlib.export`` reads, kept in a stamp file that changes
only when the hash does: ``make book`` exports a live model again only when its stamp is newer than
its manifest.

What the export reads: the model's files (``models/english/*``; for SmolLM2 the cached GGUF and
its dequantized safetensors and tokenizer), the source of every gptlib module the export imports
(its import closure, read from the ``import`` statements of ``gptlib.export`` and, transitively, of
each gptlib module they name, function-level imports included, so that it follows modules that
move), and the versions of the libraries that write the graph.

    python scripts/export_inputs.py english .cache/export/english.sha256
    python scripts/export_inputs.py smollm2 .cache/export/smollm2.sha256
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "gptlib"
ENTRY = "gptlib.export"
# the libraries whose versions decide the graph's bytes
LIBRARIES = ("torch", "onnx", "onnxscript", "numpy", "safetensors")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of the module ``name`` under ``root`` (``a/b.py`` or ``a/b/__init__.py``),
    or ``None`` when ``name`` is not a module there (a function or class imported by name).

    >>> module_file("gptlib.model").relative_to(ROOT).as_posix()
    'gptlib/model.py'
    >>> module_file("gptlib.tokenizers").relative_to(ROOT).as_posix()
    'gptlib/tokenizers/__init__.py'
    >>> module_file("gptlib.model.GPT") is None
    True
    """
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(path: Path, name: str) -> set[str]:
    """The absolute names that the module ``name`` (source ``path``) imports anywhere in its body:
    ``import a.b`` gives ``a.b``; ``from .x import y`` gives the package's ``x`` and ``x.y``."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return names


def import_closure(entry: str = ENTRY, root: Path = ROOT) -> list[Path]:
    """The source files of ``entry`` and of every module of its package that it imports,
    directly or not, with the packages' ``__init__.py`` that importing them runs; sorted. A
    package entry (``gptlib/export/``) brings its ``__main__.py`` (what ``python -m`` runs).

    >>> files = [p.relative_to(ROOT).as_posix() for p in import_closure()]
    >>> {"gptlib/__init__.py", "gptlib/model.py", "gptlib/attention.py"} <= set(files)
    True
    >>> "gptlib/trainer.py" in files
    False
    """
    top = entry.partition(".")[0]
    todo, seen, files = [entry], set(), set()
    if module_file(f"{entry}.__main__", root) is not None:
        todo.append(f"{entry}.__main__")
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__.py and a/b/__init__.py
            todo.append(".".join(parts[:i]))
        path = module_file(name, root)
        if path is None:
            continue
        files.add(path)
        todo.extend(n for n in _imported(path, name) if n.partition(".")[0] == top)
    return sorted(files)


def model_files(model: str) -> list[Path]:
    """The files of the model that the export reads: ``english`` or ``smollm2``."""
    if model == "english":
        return sorted(p for p in (ROOT / "models" / "english").iterdir() if p.is_file())
    if model == "smollm2":
        from gptlib.assets import asset_path
        from gptlib.gguf import ASSET, _export_paths

        return [asset_path(ASSET), *_export_paths()]
    raise ValueError(f"model must be 'english' or 'smollm2', got {model!r}")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def inputs_text(model: str) -> str:
    """One line per input (``sha256  name``; a library ``version  name``): what the stamp holds."""
    lines = []
    for path in model_files(model):
        if not path.is_file():
            raise FileNotFoundError(f"{path} (an input of the {model} export) does not exist")
        lines.append(f"{_sha256_file(path)}  {path.name}")
    for path in import_closure():
        lines.append(f"{_sha256_file(path)}  {path.relative_to(ROOT).as_posix()}")
    for lib in LIBRARIES:
        try:
            lines.append(f"{metadata.version(lib)}  {lib}")
        except metadata.PackageNotFoundError:
            lines.append(f"-  {lib}")
    return "\n".join(lines) + "\n"


def update_stamp(stamp: Path, text: str) -> bool:
    """Write ``text`` to ``stamp`` (atomically) only when it differs from what is there, so that
    the file's time changes only with its contents; ``True`` when it was written."""
    from gptlib.runtime import atomic_write

    stamp = Path(stamp)
    if stamp.is_file() and stamp.read_text("utf-8") == text:
        return False
    stamp.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(stamp, text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=["english", "smollm2"])
    parser.add_argument("stamp", type=Path, help="the stamp file, rewritten only on a change")
    args = parser.parse_args(argv)
    text = inputs_text(args.model)
    changed = update_stamp(args.stamp, text)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    state = "changed: the export runs" if changed else "unchanged: no export"
    print(f"{args.model} export inputs {digest} ({len(text.splitlines())} files) {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
