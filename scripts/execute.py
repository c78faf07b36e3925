"""Re-execute chapter notebooks in place, deterministically, storing outputs and widget state.

    python scripts/execute.py chapters/01_tokens.ipynb [more.ipynb ...]
    python scripts/execute.py --all
    python scripts/execute.py --strip-only chapters/*.ipynb   # no execution: drop stored widget
    code

Outputs that nbval later compares are produced on the CPU (CUDA hidden), with a fixed hash seed.
Execution counts are renumbered 1..n and widget model ids (random uuids in the kernel) are renamed
to ids derived from the notebook's name and the widgets' order, so re-executing an unchanged
notebook rewrites the same file. The book's widgets are stored with their data and without their
code (``_esm``, ``_css``: gptlib.widgets.stored.strip_code); the book's build adds the current code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from gptlib.widgets.stored import strip_code

ROOT = Path(__file__).resolve().parents[1]
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MODEL_REF = re.compile(r"IPY_MODEL_([0-9a-f]{32})")


def stable_widget_ids(nb, name: str):
    """The notebook with its widget model ids renamed deterministically (same 32-hex form).

    Order: models shown in outputs, cell by cell, each followed depth-first by the models its
    state refers to (``IPY_MODEL_<id>``, e.g. its layout); then any model never shown, ordered by
    its content. The new id of the i-th model is md5(f"{name}:{i}").
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    if not state:
        return nb
    order: list[str] = []

    def visit(mid: str) -> None:
        if mid in order or mid not in state:
            return
        order.append(mid)
        refs = MODEL_REF.findall(json.dumps(state[mid].get("state", {}), sort_keys=True))
        for ref in refs:
            visit(ref)

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view and "model_id" in view:
                visit(view["model_id"])
    rest = [m for m in state if m not in order]
    content = lambda m: MODEL_REF.sub("", json.dumps(state[m], sort_keys=True))  # noqa: E731
    for mid in sorted(rest, key=content):
        visit(mid)
    text = nbformat.writes(nb)
    for i, mid in enumerate(order):
        text = text.replace(mid, hashlib.md5(f"{name}:{i}".encode()).hexdigest())
    return nbformat.reads(text, as_version=4)


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    # Execution counts renumbered 1..n so the stored file does not change between runs.
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            n += 1
            cell.execution_count = n
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = n
            cell.metadata.pop("execution", None)
    nb = stable_widget_ids(nb, path.name)
    strip_code(nb)
    write(nb, path)
    return elapsed


def write(nb, path: Path) -> None:
    """``nb`` written to ``path`` atomically."""
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


def strip_only(path: Path) -> int:
    """The stored widget code removed from ``path`` without executing it; the characters removed.
    The file is rewritten only when it held some."""
    nb = nbformat.read(path, as_version=4)
    removed = strip_code(nb)
    if removed:
        write(nb, path)
    return removed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every chapters/*.ipynb")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument(
        "--strip-only",
        action="store_true",
        help="do not execute: only remove the widget code the notebooks store",
    )
    args = ap.parse_args()
    paths = sorted((ROOT / "chapters").glob("*.ipynb")) if args.all else args.notebooks
    if not paths:
        ap.error("give notebooks or --all")
    if args.strip_only:
        for p in paths:
            print(f"{p}: {strip_only(Path(p)):,} characters of widget code removed", flush=True)
        return 0
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the stored outputs come from the CPU
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for p in paths:
        print(f"executing {p} ...", flush=True)
        print(f"  {execute(Path(p), args.timeout):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
