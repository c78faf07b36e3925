"""Train the small GPT that the book ships (`make model`), deterministically on the CPU.

    python scripts/train_small_model.py [--out models/small] [--steps 1200]

Writes into --out: model.safetensors + config.json (GPT.save), tokenizer.json (BPETokenizer.save)
and train_log.json (losses, final validation loss and perplexity). Running it twice on the same
kind of machine gives byte-identical files: every random source is seeded, the thread count fixed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptlib.data import load_corpus, train_val_split  # noqa: E402
from gptlib.model import GPT, GPTConfig  # noqa: E402
from gptlib.runtime import atomic_write, seed_everything  # noqa: E402
from gptlib.tokenizers import BPETokenizer  # noqa: E402
from gptlib.training import Trainer, TrainConfig, make_windows, perplexity  # noqa: E402

VOCAB, N_CTX = 2048, 128


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "small")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)  # reductions are summed in the same order on every run
    seed_everything(0)

    train_text, val_text = train_val_split(load_corpus(), 0.1)
    tok = BPETokenizer.train(train_text, VOCAB)
    train_ids = torch.tensor(tok.encode(train_text))
    val_ids = torch.tensor(tok.encode(val_text))
    config = GPTConfig.preset("book-small", d_vocab=VOCAB, n_ctx=N_CTX, dropout=0.1)
    model = GPT(config)
    tc = TrainConfig(steps=args.steps, batch_size=16, max_lr=3e-3, min_lr=3e-4, warmup=50, eval_every=100, eval_batches=16)
    trainer = Trainer(model, make_windows(train_ids, N_CTX, N_CTX // 2), make_windows(val_ids, N_CTX, N_CTX), tc)
    hist = trainer.run(progress=args.progress)
    model.eval()

    args.out.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    tok.save(args.out / "tokenizer.json")
    log = {
        "train_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in tc.__dict__.items()},
        "tokens_seen": tc.steps * tc.batch_size * N_CTX,
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "final_train_loss": round(sum(hist.loss[-50:]) / 50, 4),
        "final_val_loss": round(hist.eval_loss[-1], 4),
        "final_val_perplexity": round(perplexity(hist.eval_loss[-1]), 2),
        "eval_step": hist.eval_step,
        "eval_loss": [round(v, 4) for v in hist.eval_loss],
        "loss_every_10": [round(v, 4) for v in hist.loss[::10]],
    }
    atomic_write(args.out / "train_log.json", json.dumps(log, indent=1) + "\n")
    for f in sorted(args.out.iterdir()):
        print(f"{f.name:<20} {f.stat().st_size:>9,} bytes  sha256 {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}")
    print(f"final validation loss {log['final_val_loss']}, perplexity {log['final_val_perplexity']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
