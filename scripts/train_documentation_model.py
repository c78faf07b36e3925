"""Train the documentation model, models/small (`make small-model`): Chapter 8's example of
overfitting.

    python scripts/train_documentation_model.py [--out models/small] [--steps N]

The recipe is ``gptlib.recipes.DOCUMENTATION_RUN`` on Python's help pages
(``gptlib.data.load_corpus``):
a 2048-token BPE trained on the first 90% of the text, and a GPT of 1.07M parameters trained on it
for 1200 steps. Writes model.safetensors (GPT.save: the config inside), tokenizer.json and
train_log.json
(its losses, with the torch version and thread count it was made with). Every random source is
seeded and torch runs on two threads, so on the same kind of machine two runs write identical files
(reductions are summed in an order that depends on the thread count: a reproduction must use two).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

import torch

from gptlib.recipes import DOCUMENTATION_RUN, train_documentation_model
from gptlib.runtime import atomic_write

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "small")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="override the recipe's 1200 steps (e.g. a short check)",
    )
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    rc = DOCUMENTATION_RUN
    if args.steps is not None:
        rc = rc.but(
            steps=args.steps,
            warmup=min(rc.train.warmup, args.steps),
            eval_every=min(rc.train.eval_every, args.steps),
        )
    torch.set_num_threads(2)  # reductions are summed in the same order on every run
    r = train_documentation_model(rc, progress=args.progress)
    made_by = "scripts/train_documentation_model.py" + (
        f" --steps {args.steps}" if args.steps is not None else ""
    )
    log = {
        **r["log"],
        "made_by": made_by,
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    r["model"].save(args.out)
    r["tokenizer"].save(args.out / "tokenizer.json")
    atomic_write(args.out / "train_log.json", json.dumps(log, indent=1) + "\n")
    for f in sorted(args.out.iterdir()):
        print(
            f"{f.name:<20} {f.stat().st_size:>9,} bytes  sha256 "
            f"{hashlib.sha256(f.read_bytes()).hexdigest()[:16]}"
        )
    print(
        f"final validation loss {log['final_val_loss']}, perplexity {log['final_val_perplexity']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
