"""Run every chapter on CUDA (for the GPU check of the book), without touching the stored outputs.

    python scripts/run_chapters_cuda.py [--out DIR]

Each notebook is executed with nbclient in a copy; the executed copies (with their outputs) go to
DIR for inspection. Exits non-zero if any chapter raised.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "cuda-run")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    print(
        "CUDA available:",
        torch.cuda.is_available(),
        torch.cuda.get_device_name() if torch.cuda.is_available() else "",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb,
            timeout=args.timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        t0 = time.perf_counter()
        try:
            client.execute()
            status = "ok"
        except CellExecutionError as e:
            status = "FAILED"
            failed.append(path.name)
            (args.out / f"{path.stem}.error.txt").write_text(str(e))
        nbformat.write(nb, args.out / path.name)
        print(f"{path.name:<32} {status:<7} {time.perf_counter() - t0:6.1f} s", flush=True)
    print("failed:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
