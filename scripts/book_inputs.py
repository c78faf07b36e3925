"""Whether ``make book`` may rebuild only the pages that changed, or must rebuild them all.

Sphinx's incremental build re-reads a page only when its own source changed. That is safe for
what stays inside a page (a notebook's code and outputs), and unsafe for what pages share: an
equation label, a citation, a title, the table of contents, the bibliography, the extensions of
book_ext/ and the widget code they put into each page, the static files and the configuration. A
page that is not re-read keeps a reference to a label that another page dropped, and its warnings
are not raised again, so under ``--warningiserror`` an incremental build after a failed one would
pass without a change. Hence the rule, kept by this script:

* the hash of the shared inputs (every page's Markdown, the notebooks' markdown cells and cell
  tags, the configuration, the bibliography, book_ext/, book_static/, the widget bundles and
  package-lock.json, which pins the mathjax-full that typesets the maths) is
  written to ``STAMP.pending`` before each build, and the Makefile moves it to ``STAMP`` only when
  the build passes;
* ``--all`` (a fresh environment, every page) unless ``STAMP`` holds the same hash, that is unless
  the last build passed and no shared input changed since; then only changed pages are rebuilt.

    python scripts/book_inputs.py _build/.book-inputs   # prints --all or nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# inputs every page may read, hashed whole (files, or folders taken recursively)
SHARED = [
    "_config.yml",
    "_toc.yml",
    "references.bib",
    "book_ext",
    "book_static",
    "gptlib/widgets/static",
    # the npm versions: mathjax-full typesets every page's maths (book_ext/typeset_maths.mjs)
    "package-lock.json",
]


def notebook_shared_text(path: Path) -> str:
    """The parts of a notebook that other pages can see: its markdown cells, every cell's tags
    and the notebook's metadata (JSON, keys sorted); not the code cells' sources or outputs.

    >>> import tempfile
    >>> nb = {"cells": [{"cell_type": "markdown", "source": ["# T"], "metadata": {}},
    ...                 {"cell_type": "code", "source": ["1+1"], "outputs": [],
    ...                  "metadata": {"tags": ["hide-input"]}}], "metadata": {}}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "a.ipynb"
    ...     _ = p.write_text(json.dumps(nb))
    ...     text = notebook_shared_text(p)
    ...     nb["cells"][1]["source"] = ["2+2"]
    ...     _ = p.write_text(json.dumps(nb))
    ...     same = notebook_shared_text(p) == text
    ...     nb["cells"][0]["source"] = ["# U"]
    ...     _ = p.write_text(json.dumps(nb))
    ...     (same, notebook_shared_text(p) == text)
    (True, False)
    """
    nb = json.loads(path.read_text("utf-8"))
    cells = [
        {"type": c["cell_type"], "tags": c.get("metadata", {}).get("tags", [])}
        | ({"source": c["source"]} if c["cell_type"] != "code" else {})
        for c in nb["cells"]
    ]
    return json.dumps({"metadata": nb.get("metadata", {}), "cells": cells}, sort_keys=True)


def shared_hash(root: Path = ROOT) -> str:
    """The sha256 of the shared inputs, each file named by its path under ``root``."""
    digest = hashlib.sha256()
    files = []
    for name in SHARED:
        p = root / name
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    pages = sorted((root / "chapters").glob("*.md")) + sorted((root / "chapters").glob("*.ipynb"))
    for path in files + pages:
        rel = path.relative_to(root).as_posix()
        if not path.is_file():
            data = b"(missing)"
        elif path.suffix == ".ipynb":
            data = notebook_shared_text(path).encode()
        else:
            data = path.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stamp", type=Path, help="the hash of the last build that passed")
    args = parser.parse_args(argv)
    h = shared_hash()
    pending = args.stamp.with_name(args.stamp.name + ".pending")
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(h + "\n", "utf-8")
    same = args.stamp.is_file() and args.stamp.read_text("utf-8").strip() == h
    print("" if same else "--all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
