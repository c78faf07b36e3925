"""The small measured sweep behind the shipped model's config: size, context, vocabulary, data
budget.

    python scripts/sweep.py [--runs base,v1024,...] [--out models/english/sweep.json] [--threads 1]

Each run trains from the same seed on the Brown training split (the tokenizer too is trained on the
training split only) and is scored on the whole validation split, in nats per token and in bits per
byte, so runs with different vocabularies compare. Every run of the first round changes one thing
from ``base``; the second round (``long-*``) trains
the leaders six times longer.
Results are merged into --out by run name (two processes may run disjoint --runs into two files).
Timings depend on the machine's load; compare the losses, and time only within one process
(the throughput axis times its sizes in alternating rounds, ``gptlib.timing``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gptlib.flops import matmul_flops_per_s, training_flops
from gptlib.model import GPT
from gptlib.recipes import PRESETS, RunConfig, corpus_ids, samples, train_run
from gptlib.runtime import atomic_write
from gptlib.timing import alternating_rounds
from gptlib.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

BASE = PRESETS["cpu"].but(
    d_vocab=2048,
    d_model=128,
    dropout=0.0,
    batch_size=16,
    steps=200,
    max_lr=3e-3,
    min_lr=3e-4,
    warmup=20,
    eval_every=50,
    eval_batches=8,
)
RUNS: dict[str, RunConfig] = {
    "base": BASE,
    # vocabulary
    "v1024": BASE.but(d_vocab=1024),
    "v4096": BASE.but(d_vocab=4096),
    # size
    "d192": BASE.but(d_model=192),
    "L6": BASE.but(n_layers=6),
    # context (the same tokens per step)
    "ctx64": BASE.but(n_ctx=64, batch_size=32),
    "ctx256": BASE.but(n_ctx=256, batch_size=8),
    # data budget: tokens seen
    "steps100": BASE.but(steps=100),
    "steps400": BASE.but(steps=400),
}
# Second round, 6x the tokens: the leaders of the first round, where their differences are larger
# than those of the first few hundred steps.
LONG = BASE.but(steps=1200, warmup=50, eval_every=100)
RUNS.update(
    {
        "long-base": LONG,
        "long-v4096": LONG.but(d_vocab=4096),
        "long-v4096-d192": LONG.but(d_vocab=4096, d_model=192),
        "long-v4096-L6": LONG.but(d_vocab=4096, n_layers=6),
    }
)

# Third axis: speed. At a fixed wall-clock budget the tokens a size can see depend on how well its
# matrix products fill the CPU; measured on random tokens at the shipped preset's batch and context.
SPEED_SIZES = (128, 192, 256)


def throughput(rc: RunConfig, sizes=SPEED_SIZES, rounds: int = 3, steps: int = 4) -> dict:
    """Trainer tokens/s and model FLOP/s over the matmul rate for each d_model (rounds
    interleaved)."""
    out: dict[str, dict] = {}
    trainers = {}
    for d in sizes:
        r = rc.but(d_model=d)
        torch.manual_seed(0)
        data = torch.randint(
            0,
            r.model.d_vocab,
            (1024, r.model.n_ctx + 1),
            generator=torch.Generator().manual_seed(1),
        )
        trainers[d] = (r, Trainer(GPT(r.model), (data[:, :-1], data[:, 1:]), None, r.train))
        trainers[d][1].run(1)  # warm-up
    rates = []
    times = alternating_rounds(
        {d: (lambda t=t: t.run(steps)) for d, (_, t) in trainers.items()},
        rounds,
        warmup=0,
        per_call=steps,
        after_round=lambda: rates.append(matmul_flops_per_s(1024, repeats=3, products=8)),
    )
    rate = statistics.median(rates)
    for d in sizes:
        r, trainer = trainers[d]
        t = statistics.median(times[d])
        tokens = r.train.batch_size * r.model.n_ctx
        out[f"d{d}"] = {
            "d_model": d,
            "parameters": trainer.model.num_parameters(),
            "tokens_per_s": round(tokens / t),
            "tokens_per_hour_M": round(3600 * tokens / t / 1e6, 1),
            "mfu_vs_matmul": round(training_flops(r.model, tokens) / t / rate, 3),
        }
    return {
        "threads": torch.get_num_threads(),
        "matmul_gflops": round(rate / 1e9, 1),
        "batch_size": rc.train.batch_size,
        "n_ctx": rc.model.n_ctx,
        "n_layers": rc.model.n_layers,
        "d_vocab": rc.model.d_vocab,
        "dropout": rc.model.dropout,
        "sizes": out,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs", default=",".join(RUNS), help=f"comma-separated names from {list(RUNS)}"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "english" / "sweep.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--throughput",
        action="store_true",
        help="measure only the speed of each size (SPEED_SIZES)",
    )
    args = ap.parse_args()
    if args.throughput:
        torch.set_num_threads(args.threads)
        results = json.loads(args.out.read_text()) if args.out.is_file() else {}
        results["throughput"] = throughput(PRESETS["cpu"])
        atomic_write(args.out, json.dumps(results, indent=1) + "\n")
        print(json.dumps(results["throughput"], indent=1))
        return 0
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise ValueError(f"--runs must name runs from {list(RUNS)}, got {unknown}")
    torch.set_num_threads(args.threads)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data: dict[tuple[int, float], tuple] = {}
    for name in names:
        rc = RUNS[name]
        key = (rc.model.d_vocab, rc.train_fraction)
        if key not in data:
            data[key] = corpus_ids(*key)
        t0 = time.perf_counter()
        r = train_run(rc, data=data[key])
        results.setdefault("runs", {})[name] = {
            "run_config": asdict(rc),
            "parameters": r["parameters"],
            "tokens_seen": r["tokens_seen"],
            "epochs": round(r["epochs"], 3),
            "val_nats_per_token": round(r["val"].nats_per_token, 4),
            "val_bits_per_byte": round(r["val"].bits_per_byte, 4),
            "train_nats_per_token": round(r["train"].nats_per_token, 4),
            "train_bits_per_byte": round(r["train"].bits_per_byte, 4),
            "eval_step": r["history"].eval_step,
            "val_loss_curve": [round(v, 4) for v in r["history"].eval_loss],
            "train_s": round(r["wall_s"], 1),
            "tokens_per_s": round(r["tokens_seen"] / r["wall_s"]),
            "threads": args.threads,
            "sample": samples(r["model"], r["tokenizer"], n_tokens=30)[0],
        }
        results["runs"] = dict(sorted(results["runs"].items()))
        atomic_write(args.out, json.dumps(results, indent=1) + "\n")
        x = results["runs"][name]
        print(
            f"{name:<9} params {x['parameters']:>9,}  tokens {x['tokens_seen']:>9,}  val "
            f"{x['val_nats_per_token']:.3f} nats/token "
            f"{x['val_bits_per_byte']:.3f} bits/byte  train {x['train_bits_per_byte']:.3f} "
            "bits/byte  "
            f"{x['tokens_per_s']:,} tokens/s  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
