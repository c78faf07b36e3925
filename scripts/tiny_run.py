"""Chapter 8's first training run (8.4), trained in full and stored (``models/tiny_run``).

    nice -n 10 python scripts/tiny_run.py [--out models/tiny_run]

The recipe is :func:`gptlib.recipes.train_tiny_run`: 300 AdamW steps of the ``tiny`` preset on
the documentation text, tokenized by the book's BPE of 1024 tokens. The chapter reruns its first
steps, compares their losses with the stored history and then loads the stored weights. One
thread, every random source seeded: a rerun on the same kernels writes the same files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gptlib.data import book_tokenizer, load_corpus, train_val_split
from gptlib.recipes import save_tiny_run, train_tiny_run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "tiny_run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    train_text, val_text = train_val_split(load_corpus(), 0.1)  # as the chapter splits it
    tok = book_tokenizer()
    train_ids = torch.tensor(tok.encode(train_text))
    val_ids = torch.tensor(tok.encode(val_text))
    model, hist = train_tiny_run(train_ids, val_ids, tok.vocab_size)
    save_tiny_run(args.out, model, hist)
    print(
        f"{len(hist.step)} steps; validation loss at step {hist.eval_step[-1]}: "
        f"{hist.eval_loss[-1]:.3f}; {time.perf_counter() - t0:.1f} s -> {args.out}"
    )


if __name__ == "__main__":
    main()
