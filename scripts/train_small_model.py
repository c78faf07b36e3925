"""Train the GPT that the book ships (`make model`) on the Brown corpus, deterministically.

    python scripts/train_small_model.py [--out models/english] [--steps N] [--preset cpu|cuda]

Writes into --out: model.safetensors (GPT.save: fp16 weights, the config inside), tokenizer.json
(BPETokenizer.save)
train_log.json (how it was made: corpus, configs, tokens seen, train and validation curves,
final validation loss in nats per token and bits per byte, torch version, threads) and timing.json
(the wall time of this run, the one file that differs between two runs).
Then it prints a few seeded samples.

On the CPU (preset "cpu", the default without CUDA) a run is byte-for-byte reproducible on the
same kind of machine: every random source is seeded and torch runs on a fixed number of threads
(two by default; the order of every floating-point reduction depends on the thread count, so a
reproduction must use the same number).
With CUDA the "cuda" preset trains a bigger model in bf16; that path is not bit-reproducible.
The recipe (RunConfig, the presets, the training run) is gptlib.recipes; the configs were chosen
with scripts/sweep.py (results in models/english/sweep.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gptlib.assets import ASSETS
from gptlib.recipes import PRESETS, SHIPPED_DTYPE, samples, train_run
from gptlib.runtime import atomic_write

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "english")
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="default: cuda if available, else cpu",
    )
    ap.add_argument(
        "--steps", type=int, default=None, help="override the preset's steps (e.g. a short check)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch CPU threads (a reproduction needs the same number)",
    )
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    preset = args.preset or ("cuda" if torch.cuda.is_available() else "cpu")
    rc = PRESETS[preset]
    if args.steps is not None:
        rc = rc.but(
            steps=args.steps,
            warmup=min(rc.train.warmup, args.steps),
            eval_every=min(rc.train.eval_every, args.steps),
        )
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)  # reductions are summed in the same order on every run
    dev = torch.device("cuda" if preset == "cuda" else "cpu")

    t0 = time.perf_counter()
    r = train_run(rc, progress=args.progress, dev=dev)
    model, tok, hist = r["model"].cpu(), r["tokenizer"], r["history"]
    args.out.mkdir(parents=True, exist_ok=True)
    model.save(args.out, dtype=SHIPPED_DTYPE)
    tok.save(args.out / "tokenizer.json")
    brown = ASSETS["brown"]
    every = max(1, rc.train.steps // 200)
    log = {
        "made_by": "scripts/train_small_model.py"
        + (f" --steps {args.steps}" if args.steps is not None else ""),
        "preset": preset,
        "corpus": {
            "name": "Brown corpus (Francis & Kucera), untagged by gptlib.data.load_english",
            "package": f"npm {brown.package}",
            "sha256": brown.sha256,
            "licence": brown.licence,
            "split": "validation = every 20th of the 500 samples in sorted order (25 samples); "
            "the rest trains",
            "train_tokens": r["train_tokens"],
            "val_tokens": r["val_tokens"],
        },
        "run_config": asdict(rc),
        "parameters": r["parameters"],
        "tokens_seen": r["tokens_seen"],
        "epochs": round(r["epochs"], 3),
        "final_val": {
            k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r["val"]).items()
        },
        "final_train": {
            k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r["train"]).items()
        },
        "curves": {
            "eval_step": hist.eval_step,
            "val_loss": [round(v, 4) for v in hist.eval_loss],
            "train_loss_step": hist.step[::every],
            "train_loss": [
                round(
                    sum(hist.loss[max(0, i - every + 1) : i + 1])
                    / len(hist.loss[max(0, i - every + 1) : i + 1]),
                    4,
                )
                for i in hist.step[::every]
            ],
            "note": "val_loss: eval mode on fixed validation batches; "
            "train_loss: training batches (dropout on) "
            f"averaged over the last {every} steps",
        },
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(dev),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
    }
    atomic_write(args.out / "train_log.json", json.dumps(log, indent=1) + "\n")
    wall = time.perf_counter() - t0
    # The one file that differs between reproductions: how long this run took on this machine.
    atomic_write(
        args.out / "timing.json",
        json.dumps(
            {
                "train_s": round(r["wall_s"], 1),
                "total_s": round(wall, 1),
                "threads": torch.get_num_threads(),
                "device": str(dev),
            }
        )
        + "\n",
    )
    print(
        f"trained {preset} preset: {r['parameters']:,} parameters, {r['tokens_seen']:,} tokens "
        "seen "
        f"({r['epochs']:.2f} epochs) in {r['wall_s']:.0f} s of training ({wall:.0f} s in all)"
    )
    print(
        f"validation: {r['val'].nats_per_token:.4f} nats/token, {r['val'].bits_per_byte:.4f} "
        "bits/byte; "
        f"train: {r['train'].nats_per_token:.4f} nats/token, {r['train'].bits_per_byte:.4f} "
        "bits/byte"
    )
    for f in sorted(args.out.iterdir()):
        print(
            f"{f.name:<20} {f.stat().st_size:>9,} bytes  sha256 "
            f"{hashlib.sha256(f.read_bytes()).hexdigest()[:16]}"
        )
    for text in samples(model, tok):
        print("---\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
