"""Train the GPT that the book ships (`make model`) on the Brown corpus, deterministically.

    python scripts/train_small_model.py [--out models/english] [--steps N] [--preset cpu|cuda]

Writes into --out: model.safetensors + config.json (GPT.save), tokenizer.json (BPETokenizer.save)
train_log.json (how it was made: corpus, configs, tokens seen, train and validation curves,
final validation loss in nats per token and bits per byte, torch version, threads) and timing.json
(the wall time of this run, the one file that differs between two runs).
Then it prints a few seeded samples.

On the CPU (preset "cpu", the default without CUDA) a run is byte-for-byte reproducible on the
same kind of machine: every random source is seeded and torch runs on a fixed number of threads
(two by default; the order of every floating-point reduction depends on the thread count, so a
reproduction must use the same number).
With CUDA the "cuda" preset trains a bigger model in bf16; that path is not bit-reproducible.
The configs were chosen with scripts/sweep.py (results in models/english/sweep.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptlib.assets import ASSETS  # noqa: E402
from gptlib.data import bits_per_byte, load_english  # noqa: E402
from gptlib.model import GPT, GPTConfig  # noqa: E402
from gptlib.runtime import atomic_write, autocast, seed_everything  # noqa: E402
from gptlib.sampling import generate  # noqa: E402
from gptlib.tokenizers import BPETokenizer  # noqa: E402
from gptlib.training import Trainer, TrainConfig, make_windows  # noqa: E402


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides a run: the model's shape (tokenizer size included), the optimisation,
    and the data budget (the first ``train_fraction`` of the training text).

    >>> rc = PRESETS["cpu"].but(d_model=192, steps=400)
    >>> (rc.model.d_model, rc.model.d_mlp, rc.train.steps)
    (192, 768, 400)
    """

    model: GPTConfig
    train: TrainConfig
    train_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.train_fraction <= 1:
            raise ValueError(f"train_fraction must be in (0, 1], got {self.train_fraction}")

    def but(self, **changes) -> "RunConfig":
        """A copy with fields of the model config, the training config or ``train_fraction`` changed;
        the model's derived sizes (d_head, d_mlp) are derived again."""
        model_fields = {f.name for f in fields(GPTConfig)} - {"d_head", "d_mlp"}
        train_fields = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(changes) - model_fields - train_fields - {"train_fraction"})
        if unknown:
            raise ValueError(f"unknown run fields {unknown}")
        m = {k: v for k, v in changes.items() if k in model_fields}
        t = {k: v for k, v in changes.items() if k in train_fields}
        model = GPTConfig(**{**self.model.to_dict(), "d_head": None, "d_mlp": None, **m}) if m else self.model
        return replace(self, model=model, train=replace(self.train, **t),
                       train_fraction=changes.get("train_fraction", self.train_fraction))


PRESETS = {
    # Two CPU threads, 63 minutes measured on a 2-core machine. The size comes from the sweep
    # (sweep.json): at d_model 256 the Trainer turned 69% of the matmul rate into model FLOPs, at
    # d_model 128 50% (its throughput table; bench/bench_train.py measured 79-81% at this config).
    "cpu": RunConfig(GPTConfig(d_vocab=4096, n_ctx=128, d_model=256, n_heads=4, n_layers=4, dropout=0.1),
                     TrainConfig(steps=4000, batch_size=32, max_lr=2e-3, min_lr=2e-4, warmup=200, eval_every=200,
                                 eval_batches=16)),
    # With CUDA: the same recipe, larger and longer, in bf16 autocast; the files stay a few MB.
    # Not bit-reproducible, and not yet run.
    "cuda": RunConfig(GPTConfig(d_vocab=4096, n_ctx=256, d_model=256, n_heads=4, n_layers=6, dropout=0.1),
                      TrainConfig(steps=6000, batch_size=64, max_lr=1e-3, min_lr=1e-4, warmup=300, eval_every=200,
                                  eval_batches=32)),
}
# The weights are rounded to fp16 when training ends (relative error at most 2^-11), halving the
# files; every figure in train_log.json is measured on the rounded weights.
SHIPPED_DTYPE = torch.float16
PROMPTS = ["He said that", "She looked at", "The President said"]


def corpus_ids(d_vocab: int, train_fraction: float = 1.0) -> tuple[BPETokenizer, torch.Tensor, torch.Tensor, str, str]:
    """The tokenizer trained on the training text only, and both texts encoded."""
    train_text, val_text = load_english()
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    train_text = train_text[: int(len(train_text) * train_fraction)]
    tok = BPETokenizer.train(train_text, d_vocab)
    return tok, torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text)), train_text, val_text


@torch.no_grad()
def windows_loss(model: GPT, tok: BPETokenizer, x: torch.Tensor, y: torch.Tensor, batch: int = 32) -> dict:
    """Loss over windows (x, y), in nats per token and in bits per byte (total nats over the UTF-8
    bytes of the scored target tokens), in eval mode."""
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), batch):
        with autocast(dev):
            logits = model(x[i:i + batch].to(dev))  # (b, n_ctx, d_vocab)
        total += float(torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y[i:i + batch].flatten().to(dev),
                                                         reduction="sum"))
    model.train(was)
    n_tokens = y.numel()
    n_bytes = sum(len(tok.token_bytes(int(t))) for t in y.flatten().tolist())
    nats = total / n_tokens
    return {"nats_per_token": nats, "bits_per_byte": bits_per_byte(nats, n_tokens, n_bytes),
            "tokens": n_tokens, "bytes": n_bytes}


def train_run(rc: RunConfig, data=None, progress: bool = False, dev: torch.device | None = None) -> dict:
    """Train one model; return it with its tokenizer, history and figures (train and validation)."""
    seed_everything(0)
    tok, train_ids, val_ids, _, _ = data if data is not None else corpus_ids(rc.model.d_vocab, rc.train_fraction)
    dev = dev or torch.device("cpu")
    n_ctx = rc.model.n_ctx
    model = GPT(rc.model).to(dev)
    trainer = Trainer(model, make_windows(train_ids, n_ctx, n_ctx // 2), make_windows(val_ids, n_ctx, n_ctx), rc.train)
    t0 = time.perf_counter()
    hist = trainer.run(progress=progress)
    wall = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():  # the shipped weights are stored in fp16: score exactly those
        for p in model.parameters():
            p.copy_(p.to(SHIPPED_DTYPE).to(p.dtype))
    n_val = len(val_ids)
    val_x, val_y = make_windows(val_ids, n_ctx, n_ctx)  # the whole validation text
    # as many training windows as validation windows, evenly spaced over the training stream
    starts = torch.linspace(0, len(train_ids) - n_ctx - 1, len(val_x)).long()
    train_w = torch.stack([train_ids[s:s + n_ctx + 1] for s in starts.tolist()])  # (n, n_ctx + 1)
    return {
        "model": model, "tokenizer": tok, "history": hist, "wall_s": wall,
        "train_tokens": len(train_ids), "val_tokens": n_val,
        "tokens_seen": rc.train.steps * rc.train.batch_size * n_ctx,
        "epochs": rc.train.steps * rc.train.batch_size * n_ctx / len(train_ids),
        "parameters": model.num_parameters(),
        "val": windows_loss(model, tok, val_x, val_y),
        "train": windows_loss(model, tok, train_w[:, :-1], train_w[:, 1:]),
    }


def samples(model: GPT, tok: BPETokenizer, n_tokens: int = 60, seed: int = 0) -> list[str]:
    """One seeded sample per prompt, temperature 0.6, top-p 0.9, on the CPU."""
    out = []
    for k, prompt in enumerate(PROMPTS):
        g = torch.Generator().manual_seed(seed + k)
        ids = generate(model.cpu(), torch.tensor(tok.encode(prompt)), n_tokens, temperature=0.6, top_p=0.9, generator=g)
        out.append(tok.decode(ids.tolist()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "english")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--steps", type=int, default=None, help="override the preset's steps (e.g. a short check)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (a reproduction needs the same number)")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    preset = args.preset or ("cuda" if torch.cuda.is_available() else "cpu")
    rc = PRESETS[preset]
    if args.steps is not None:
        rc = rc.but(steps=args.steps, warmup=min(rc.train.warmup, args.steps), eval_every=min(rc.train.eval_every, args.steps))
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
        "made_by": "scripts/train_small_model.py" + (f" --steps {args.steps}" if args.steps is not None else ""),
        "preset": preset,
        "corpus": {"name": "Brown corpus (Francis & Kucera), untagged by gptlib.data.load_english",
                   "package": f"npm {brown.package}", "sha256": brown.sha256, "licence": brown.licence,
                   "split": "validation = every 20th of the 500 samples in sorted order (25 samples); the rest trains",
                   "train_tokens": r["train_tokens"], "val_tokens": r["val_tokens"]},
        "run_config": asdict(rc),
        "parameters": r["parameters"],
        "tokens_seen": r["tokens_seen"],
        "epochs": round(r["epochs"], 3),
        "final_val": {k: round(v, 4) if isinstance(v, float) else v for k, v in r["val"].items()},
        "final_train": {k: round(v, 4) if isinstance(v, float) else v for k, v in r["train"].items()},
        "curves": {
            "eval_step": hist.eval_step,
            "val_loss": [round(v, 4) for v in hist.eval_loss],
            "train_loss_step": hist.step[::every],
            "train_loss": [round(sum(hist.loss[max(0, i - every + 1):i + 1]) / len(hist.loss[max(0, i - every + 1):i + 1]), 4)
                           for i in hist.step[::every]],
            "note": "val_loss: eval mode on fixed validation batches; train_loss: training batches (dropout on) "
                    f"averaged over the last {every} steps",
        },
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(dev),
                        "python": platform.python_version(), "machine": platform.machine()},
    }
    atomic_write(args.out / "train_log.json", json.dumps(log, indent=1) + "\n")
    wall = time.perf_counter() - t0
    # The one file that differs between reproductions: how long this run took on this machine.
    atomic_write(args.out / "timing.json", json.dumps({"train_s": round(r["wall_s"], 1), "total_s": round(wall, 1),
                                                       "threads": torch.get_num_threads(), "device": str(dev)}) + "\n")
    print(f"trained {preset} preset: {r['parameters']:,} parameters, {r['tokens_seen']:,} tokens seen "
          f"({r['epochs']:.2f} epochs) in {r['wall_s']:.0f} s of training ({wall:.0f} s in all)")
    print(f"validation: {r['val']['nats_per_token']:.4f} nats/token, {r['val']['bits_per_byte']:.4f} bits/byte; "
          f"train: {r['train']['nats_per_token']:.4f} nats/token, {r['train']['bits_per_byte']:.4f} bits/byte")
    for f in sorted(args.out.iterdir()):
        print(f"{f.name:<20} {f.stat().st_size:>9,} bytes  sha256 {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}")
    for text in samples(model, tok):
        print("---\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
