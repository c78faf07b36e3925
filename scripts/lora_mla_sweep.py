"""Chapter 14's training runs, precomputed (the chapter reads models/lora_mla_sweep.json).

LoRA: the English model (dropout 0) fine-tuned on the training text of one Brown genre with
``gptlib.recipes.fine_tune``, by LoRA at each rank of ``--ranks`` and by full fine-tuning, with
each seed of ``--seeds`` (the seed draws A and the batches); each run is scored on the genre's
held-out text and on the held-out text of the other genres (Chapter 8's split). The full runs also
give the singular values of their updates W_full - W, matrix by matrix.

Attention: the three models of ``gptlib.recipes.ATTENTION_VARIANTS`` (multi-head, grouped-query,
latent) trained from seed 0 with the English model's recipe (``PRESETS["cpu"]``: AdamW, its peak
and final rates, weight decay, clipping, a warm-up of 5% of the steps, windows of 128 tokens with
stride 64 on the Brown training split, its tokenizer), shortened to ``--attn-steps`` steps of
``--attn-batch`` windows drawn from the first ``--attn-fraction`` of the training text, and scored
on
evenly spaced validation windows.

Truncation (``--truncation``, added to an existing output): each full run is repeated, and its
update of every adapted matrix is cut to its best rank-k approximation (k of ``TRUNCATION_RANKS``,
the other parameters as fine-tuned); each cut model is scored as above. The repeated run must score
as the stored one, so the cut models are those of the stored runs.

Each part runs in a process of its own with one torch thread (the LoRA runs one process per seed),
as the chapter, which re-runs the first steps of the LoRA run of rank 4 and
seed 0 and checks them against the stored losses.

    nice -n 10 python scripts/lora_mla_sweep.py        # writes models/lora_mla_sweep.json
    python scripts/lora_mla_sweep.py --ranks 4 --seeds 0 --steps 5 --attn-steps 5 --out /tmp/s.json
    nice -n 10 python scripts/lora_mla_sweep.py --truncation   # adds the cut full updates
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from gptlib.data import load_english
from gptlib.recipes import (
    ATTENTION_VARIANTS,
    FINE_TUNE,
    PRESETS,
    attention_variant,
    english_without_dropout,
    fine_tune,
    genre_texts,
)
from gptlib.runtime import atomic_write, seed_everything
from gptlib.tokenizers import BPETokenizer
from gptlib.trainer import Trainer
from gptlib.training import make_windows, windows_loss

ROOT = Path(__file__).resolve().parent.parent
ENGLISH = ROOT / "models" / "english"
N_EVAL = 64  # windows per held-out score
TRUNCATION_RANKS = (0, 16, 64)  # ranks the full fine-tuning's updates are cut to
ADAPTED = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out")  # LoRA's targets, by kind


def spaced(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n windows evenly spaced over (x, y) (all of them if there are fewer).

    >>> x = torch.arange(10)[:, None]
    >>> spaced(x, x, 4)[0].flatten().tolist()
    [0, 3, 6, 9]
    """
    if len(x) <= n:
        return x, y
    i = torch.linspace(0, len(x) - 1, n).long()
    return x[i], y[i]


def cumulative_energy(delta: torch.Tensor) -> list[float]:
    """The share of ||delta||_F^2 held by its best rank-k approximation, k = 1, 2, ...
    (Eckart-Young).

    >>> cumulative_energy(torch.diag(torch.tensor([2.0, 1.0])))
    [0.8, 1.0]
    """
    s2 = torch.linalg.svdvals(delta.double()) ** 2
    return (s2.cumsum(0) / s2.sum()).tolist()


def truncate(delta: torch.Tensor, k: int) -> torch.Tensor:
    """The best rank-k approximation of ``delta`` in the Frobenius norm (Eckart-Young).

    >>> truncate(torch.diag(torch.tensor([3.0, 2.0, 1.0])), 2).diag().tolist()
    [3.0, 2.0, 0.0]
    """
    U, S, Vh = torch.linalg.svd(delta.double(), full_matrices=False)
    return ((U[:, :k] * S[:k]) @ Vh[:k]).to(delta.dtype)


def truncated_models(base, full, ranks=TRUNCATION_RANKS):
    """For each k of ``ranks``: a copy of the fully fine-tuned ``full`` whose update of every
    adapted matrix (W_full - W_base) is cut to rank k, the other parameters as fine-tuned."""
    before = dict(base.named_parameters())
    for k in ranks:
        cut = copy.deepcopy(full)
        with torch.no_grad():
            for name, W in cut.named_parameters():
                if name.split(".")[-1] in ADAPTED:
                    W.copy_(before[name] + truncate(W - before[name], k))
        yield k, cut


def _rounded(value):
    """Floats to 4 decimals, inside dicts and lists too.

    >>> _rounded({"loss": [1.234567, 2.0], "seed": 5})
    {'loss': [1.2346, 2.0], 'seed': 5}
    """
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _keep(args, name: str, part: dict) -> dict:
    """Write one finished part next to the output (kept if a later part fails); return it."""
    atomic_write(
        args.out.parent / f".{args.out.stem}.{name}.json", json.dumps(_rounded(part)) + "\n"
    )
    return part


def lora_sweep(args, seeds: list[int]) -> dict:
    torch.set_num_threads(1)
    tok = BPETokenizer.load(ENGLISH / "tokenizer.json")
    ft = FINE_TUNE
    base = english_without_dropout(ENGLISH)
    train_text, genre_val, other_val = genre_texts(ft["genre"])
    n_ctx = ft["n_ctx"]
    train = make_windows(torch.tensor(tok.encode(train_text)), n_ctx, n_ctx)
    evals = {
        name: spaced(*make_windows(torch.tensor(tok.encode(text)), n_ctx, n_ctx), N_EVAL)
        for name, text in (("genre", genre_val), ("other", other_val))
    }

    def scores(model) -> dict:
        return {name: windows_loss(model, x, y).nats_per_token for name, (x, y) in evals.items()}

    result = {
        "train_windows": len(train[0]),
        "eval_windows": N_EVAL,
        "base": scores(base),
        "runs": [],
    }
    full_parameters = sum(p.numel() for p in base.parameters())
    energy: dict[str, list[list[float]]] = {}
    for seed in seeds:
        for r in args.ranks + [None]:
            t0 = time.time()
            model, hist = fine_tune(base, train, r, seed, steps=args.steps)
            run = {
                "method": "full" if r is None else "lora",
                "r": r,
                "seed": seed,
                "trained": full_parameters if r is None else model.num_parameters(),
                **scores(model),
                "loss": hist.loss,
                "seconds": round(time.time() - t0, 1),
            }
            if r is None:  # the update of every adapted matrix, as LoRA's targets name them
                trained = dict(model.named_parameters())
                for name, W in base.named_parameters():
                    if name.split(".")[-1] in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out"):
                        energy.setdefault(name.split(".")[-1], []).append(
                            cumulative_energy(trained[name].detach() - W.detach())
                        )
            result["runs"].append(run)
            print(
                f"lora r={r} seed={seed}: genre {run['genre']:.4f} other {run['other']:.4f} "
                f"({run['seconds']} s)",
                flush=True,
            )
    result["full_update_energy"] = energy  # per matrix kind: one curve per layer and seed
    return _keep(args, f"lora-{'-'.join(map(str, seeds))}", result)


def truncation_sweep(args, seed: int, stored: dict) -> dict:
    """Repeat the full run of ``seed``, check it scores as ``stored``, score its cut updates."""
    torch.set_num_threads(1)
    tok = BPETokenizer.load(ENGLISH / "tokenizer.json")
    base = english_without_dropout(ENGLISH)
    train_text, genre_val, other_val = genre_texts(FINE_TUNE["genre"])
    n_ctx = FINE_TUNE["n_ctx"]
    train = make_windows(torch.tensor(tok.encode(train_text)), n_ctx, n_ctx)
    evals = {
        name: spaced(*make_windows(torch.tensor(tok.encode(text)), n_ctx, n_ctx), N_EVAL)
        for name, text in (("genre", genre_val), ("other", other_val))
    }

    def scores(model) -> dict:
        return {
            name: round(windows_loss(model, x, y).nats_per_token, 4)
            for name, (x, y) in evals.items()
        }

    full, _ = fine_tune(base, train, None, seed, steps=args.steps)
    again = scores(full)
    if again != {k: stored[k] for k in again}:
        raise ValueError(f"the full run of seed {seed} scores {again}, stored {stored}")
    out = {str(k): scores(cut) for k, cut in truncated_models(base, full)}
    print(f"full seed={seed}: cut to rank k: {out}", flush=True)
    return out


def attention_sweep(args) -> dict:
    torch.set_num_threads(1)
    tok = BPETokenizer.load(ENGLISH / "tokenizer.json")
    train_text, val_text = load_english()
    train_text = train_text[
        : int(len(train_text) * args.attn_fraction)
    ]  # as RunConfig.train_fraction
    train_ids, val_ids = torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text))
    n_ctx = ATTENTION_VARIANTS["mha"][0].n_ctx
    val = spaced(*make_windows(val_ids, n_ctx, n_ctx), args.attn_eval)
    recipe = PRESETS["cpu"].train
    tc = (
        PRESETS["cpu"]
        .but(
            steps=args.attn_steps,
            batch_size=args.attn_batch,
            warmup=max(1, args.attn_steps // 20),
            eval_every=args.attn_steps,
            eval_batches=1,
        )
        .train
    )
    out = {
        "train_config": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in tc.__dict__.items()
        },
        "train_fraction": args.attn_fraction,
        "train_tokens": len(train_ids),
        "recipe_steps": recipe.steps,
        "recipe_batch_size": recipe.batch_size,
        "eval_windows": len(val[0]),
        "runs": {},
    }
    for name, (config, latent) in ATTENTION_VARIANTS.items():
        seed_everything(0)
        model = attention_variant(name)
        t0 = time.time()
        hist = Trainer(model, make_windows(train_ids, n_ctx, n_ctx // 2), None, tc).run()
        d_head = config.d_head
        cache = latent[0] + latent[1] if latent else 2 * config.n_kv_heads * d_head
        out["runs"][name] = {
            "config": config.__dict__,
            "latent": None if latent is None else {"d_c": latent[0], "d_R": latent[1]},
            "parameters": model.num_parameters(),
            "cache_per_token_layer": cache,
            "val": windows_loss(model, *val).nats_per_token,
            "loss": hist.loss,
            "seconds": round(time.time() - t0, 1),
        }
        print(
            f"{name}: val {out['runs'][name]['val']:.4f} ({out['runs'][name]['seconds']} s)",
            flush=True,
        )
    return _keep(args, "attention", out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=FINE_TUNE["steps"], help="fine-tuning steps")
    ap.add_argument("--attn-steps", type=int, default=80)
    ap.add_argument("--attn-batch", type=int, default=8)
    ap.add_argument(
        "--attn-fraction", type=float, default=0.1, help="the share of the training text used"
    )
    ap.add_argument(
        "--attn-eval", type=int, default=64, help="validation windows of the attention runs"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "lora_mla_sweep.json")
    ap.add_argument(
        "--truncation",
        action="store_true",
        help="add the full runs' updates cut to low rank to the existing --out",
    )
    args = ap.parse_args()
    if min(args.ranks) < 1:
        raise ValueError(f"ranks must be >= 1, got {args.ranks}")
    if args.truncation:
        result = json.loads(args.out.read_text())
        full = [run for run in result["lora"]["runs"] if run["r"] is None]
        with ProcessPoolExecutor(
            len(full), mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            cuts = [pool.submit(truncation_sweep, args, run["seed"], run) for run in full]
            for run, cut in zip(full, cuts):
                run["truncated"] = cut.result()
        atomic_write(args.out, json.dumps(_rounded(result), indent=1) + "\n")
        print(f"added the truncated updates to {args.out}")
        return
    t0 = time.time()
    result = {
        "what": "Chapter 14's LoRA and full fine-tuning runs per rank and seed, "
        "and its three attention layers; "
        "made by scripts/lora_mla_sweep.py with one torch thread",
        "fine_tune": FINE_TUNE,
        "ranks": args.ranks,
        "seeds": args.seeds,
        "steps": args.steps,
        "torch": torch.__version__,
    }
    with ProcessPoolExecutor(
        len(args.seeds) + 1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        attention = pool.submit(attention_sweep, args)
        parts = [pool.submit(lora_sweep, args, [seed]) for seed in args.seeds]
        parts = [p.result() for p in parts]
    lora = {**parts[0], "runs": [run for p in parts for run in p["runs"]]}
    energy = {
        k: [curve for p in parts for curve in p["full_update_energy"][k]]
        for k in parts[0]["full_update_energy"]
    }
    # mean over the layers and seeds of each matrix's cumulative energy
    lora["full_update_energy"] = {k: torch.tensor(v).mean(0).tolist() for k, v in energy.items()}
    result["lora"] = lora
    result["attention"] = attention.result()
    result["seconds"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, json.dumps(_rounded(result), indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
