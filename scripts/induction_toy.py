"""Chapter 8's induction toy, trained in full and stored (``models/induction_toy``).

    nice -n 10 python scripts/induction_toy.py [--out models/induction_toy]

The recipe is :func:`gptlib.recipes.train_induction_toy`: 500 AdamW steps of the attention-only
toy, its held-out loss on both halves of [r, r] every 10 steps. The chapter reruns its first 50
steps, compares them with the stored curve and then loads the stored weights. One thread, every
random source seeded: a rerun on the same kernels writes the same files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gptlib.recipes import save_induction_toy, train_induction_toy

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "induction_toy")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, curve = train_induction_toy()
    save_induction_toy(args.out, model, curve)
    first, repeated = curve[-1][1:]
    print(
        f"{len(curve)} points; step {curve[-1][0]}: first half {first:.3f}, "
        f"repeated half {repeated:.3f}; {time.perf_counter() - t0:.1f} s -> {args.out}"
    )


if __name__ == "__main__":
    main()
