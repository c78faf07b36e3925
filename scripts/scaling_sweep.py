"""Train a handful of sizes of the book's GPT on the book's corpus for Chapter 11's scaling-law fit.

    nice -n 10 python scripts/scaling_sweep.py [--out models/scaling_sweep.json] [--steps 300]

Every size sees the same tokens (the same seeded batches, ``--steps`` x 16 windows of 64 tokens,
about two passes over the 116k training tokens of Python's help pages, ``gptlib.data.load_corpus``)
through a 2048-token BPE trained on the training split (the documentation model's tokenizer,
byte for byte the same as models/small/tokenizer.json). Writes one JSON record per size: its shape,
its parameter counts (all, and without the embeddings, N), the tokens it trained on, its final
training loss and its loss on every validation window (``gptlib.training.windows_loss``). Each size
takes under two minutes on one CPU core; the chapter reads the JSON and fits L(N) live. Every random
source is seeded (weights, batches).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from gptlib.data import load_corpus, train_val_split
from gptlib.model import GPT, GPTConfig
from gptlib.runtime import atomic_write, seed_everything
from gptlib.scaling import non_embedding_parameters
from gptlib.tokenizers import BPETokenizer
from gptlib.trainer import TrainConfig, Trainer
from gptlib.training import make_windows, windows_loss

ROOT = Path(__file__).resolve().parents[1]

N_CTX = 64
SIZES = [  # (n_layers, d_model, n_heads)
    (1, 16, 2),
    (2, 32, 2),
    (2, 64, 4),
    (3, 96, 4),
    (4, 128, 4),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "scaling_sweep.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    train_text, val_text = train_val_split(load_corpus(), 0.1)
    tok = BPETokenizer.train(train_text, 2048)
    train_ids = torch.tensor(tok.encode(train_text))
    train = make_windows(train_ids, N_CTX, N_CTX // 2)
    val = make_windows(torch.tensor(tok.encode(val_text)), N_CTX, N_CTX)
    tc = TrainConfig(
        steps=args.steps,
        batch_size=16,
        max_lr=3e-3,
        min_lr=3e-4,
        warmup=30,
        eval_every=args.steps,
        eval_batches=1,
    )
    runs = []
    for n_layers, d_model, n_heads in SIZES:
        seed_everything(0)
        config = GPTConfig(
            d_vocab=tok.vocab_size, n_ctx=N_CTX, d_model=d_model, n_heads=n_heads, n_layers=n_layers
        )
        model = GPT(config)
        t0 = time.perf_counter()
        hist = Trainer(model, train, None, tc).run()
        seconds = time.perf_counter() - t0
        run = {
            "n_layers": n_layers,
            "d_model": d_model,
            "n_heads": n_heads,
            "params": model.num_parameters(),
            "N": non_embedding_parameters(model),
            "tokens": tc.steps * tc.batch_size * N_CTX,
            "train_loss": round(sum(hist.loss[-20:]) / 20, 4),
            "val_loss": round(windows_loss(model, *val, batch_size=64).nats_per_token, 4),
            "seconds": round(seconds, 1),
        }
        runs.append(run)
        print(json.dumps(run), flush=True)
    out = {
        "what": "validation loss of GPTs of five sizes trained on the same tokens "
        "of the book's corpus",
        "script": "scripts/scaling_sweep.py",
        "d_vocab": tok.vocab_size,
        "n_ctx": N_CTX,
        "train_config": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in tc.__dict__.items()
        },
        "train_tokens": len(train_ids),
        "val_windows": len(val[0]),
        "threads": args.threads,
        "runs": runs,
    }
    atomic_write(args.out, json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
