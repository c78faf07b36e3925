"""Re-execute chapter notebooks in place, deterministically, storing outputs and widget state.

    python scripts/execute.py chapters/01_tokens.ipynb [more.ipynb ...]
    python scripts/execute.py --all

Outputs that nbval later compares are produced on the CPU (CUDA hidden), with a fixed hash seed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
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
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every chapters/*.ipynb")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    paths = sorted((ROOT / "chapters").glob("*.ipynb")) if args.all else args.notebooks
    if not paths:
        ap.error("give notebooks or --all")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the stored outputs come from the CPU
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for p in paths:
        print(f"executing {p} ...", flush=True)
        print(f"  {execute(Path(p), args.timeout):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
