"""How the book's shipped models are made: run configurations, presets and the training run.

``models/english`` (`make model`, ``scripts/train_small_model.py``) is the English model of Chapters
7
to 9: the GPT of :data:`PRESETS` trained on the Brown corpus's training split with
:class:`gptlib.trainer.Trainer`, its tokenizer trained on the same text. ``scripts/sweep.py`` chose
its
size from runs of this same recipe. ``models/small`` (`make small-model`,
``scripts/train_documentation_model.py``) is the documentation model, Chapter 8's example of
overfitting: :data:`DOCUMENTATION_RUN` on Python's help pages (:func:`train_documentation_model`).
A :class:`RunConfig` holds everything that decides a run; every random source is seeded, so on the
CPU a run repeats byte for byte at the same thread count.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .circuits import repeated_sequences
from .data import (
    brown_documents,
    english_split,
    load_corpus,
    load_english,
    token_byte_lengths,
    train_val_split,
)
from .files import read_fields
from .lora import LoRA, attention_mlp_targets
from .mla import mla_model
from .model import GPT, GPTConfig
from .modern import ModernConfig, ModernGPT
from .runtime import atomic_write, check_file, check_float, check_int, seed_everything
from .sampling import generate
from .tokenizers import BPETokenizer
from .trainer import History, TrainConfig, Trainer
from .training import make_windows, perplexity, windows_loss

__all__ = [
    "RunConfig",
    "PRESETS",
    "SHIPPED_DTYPE",
    "PROMPTS",
    "corpus_ids",
    "train_run",
    "samples",
    "DOCUMENTATION_RUN",
    "train_documentation_model",
    "FINE_TUNE",
    "english_without_dropout",
    "genre_texts",
    "fine_tune",
    "ATTENTION_VARIANTS",
    "attention_variant",
    "INDUCTION_TOY",
    "induction_toy_halves",
    "train_induction_toy",
    "save_induction_toy",
    "load_induction_toy",
]


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
        if not isinstance(self.model, GPTConfig):
            raise ValueError(f"model must be a GPTConfig, got {type(self.model).__name__}")
        if not isinstance(self.train, TrainConfig):
            raise ValueError(f"train must be a TrainConfig, got {type(self.train).__name__}")
        check_float("train_fraction", self.train_fraction, 0.0, 1.0, lo_open=True)

    def but(self, **changes) -> RunConfig:
        """A copy with fields of the model config, the training config or ``train_fraction``
        changed;
        the model's derived sizes (d_head, d_mlp) are derived again."""
        model_fields = {f.name for f in fields(GPTConfig)} - {"d_head", "d_mlp"}
        train_fields = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(changes) - model_fields - train_fields - {"train_fraction"})
        if unknown:
            raise ValueError(f"unknown run fields {unknown}")
        m = {k: v for k, v in changes.items() if k in model_fields}
        t = {k: v for k, v in changes.items() if k in train_fields}
        model = (
            GPTConfig(**{**self.model.to_dict(), "d_head": None, "d_mlp": None, **m})
            if m
            else self.model
        )
        return replace(
            self,
            model=model,
            train=replace(self.train, **t),
            train_fraction=changes.get("train_fraction", self.train_fraction),
        )


PRESETS = {
    # Two CPU threads, 63 minutes measured on a 2-core machine. The size comes from the sweep
    # (sweep.json): at d_model 256 the Trainer turned 69% of the matmul rate into model FLOPs, at
    # d_model 128 50% (its throughput table; bench/bench_train.py measured 79-81% at this config).
    "cpu": RunConfig(
        GPTConfig(d_vocab=4096, n_ctx=128, d_model=256, n_heads=4, n_layers=4, dropout=0.1),
        TrainConfig(
            steps=4000,
            batch_size=32,
            max_lr=2e-3,
            min_lr=2e-4,
            warmup=200,
            eval_every=200,
            eval_batches=16,
        ),
    ),
    # With CUDA: the same recipe, larger and longer, in bf16 autocast; the files stay a few MB.
    # Not bit-reproducible, and not yet run.
    "cuda": RunConfig(
        GPTConfig(d_vocab=4096, n_ctx=256, d_model=256, n_heads=4, n_layers=6, dropout=0.1),
        TrainConfig(
            steps=6000,
            batch_size=64,
            max_lr=1e-3,
            min_lr=1e-4,
            warmup=300,
            eval_every=200,
            eval_batches=32,
        ),
    ),
}
# The weights are rounded to fp16 when training ends (relative error at most 2^-11), halving the
# files; every figure in train_log.json is measured on the rounded weights.
SHIPPED_DTYPE = torch.float16
PROMPTS = ["He said that", "She looked at", "The President said"]


def corpus_ids(
    d_vocab: int, train_fraction: float = 1.0
) -> tuple[BPETokenizer, torch.Tensor, torch.Tensor, str, str]:
    """The tokenizer trained on the training text only, and both texts encoded."""
    check_float(
        "train_fraction", train_fraction, 0.0, 1.0, lo_open=True
    )  # before the corpus is read
    check_int("d_vocab", d_vocab, lo=257)
    train_text, val_text = load_english()
    train_text = train_text[: int(len(train_text) * train_fraction)]
    tok = BPETokenizer.train(train_text, d_vocab)
    return (
        tok,
        torch.tensor(tok.encode(train_text)),
        torch.tensor(tok.encode(val_text)),
        train_text,
        val_text,
    )


def train_run(
    rc: RunConfig, data=None, progress: bool = False, dev: torch.device | None = None
) -> dict:
    """Train one model; return it with its tokenizer, history and figures (train and validation).

    ``data`` is what :func:`corpus_ids` returns (to share one tokenizer between runs); the figures
    ``val`` and ``train`` are :class:`gptlib.training.WindowsLoss` of the weights rounded to
    :data:`SHIPPED_DTYPE`: every validation window, and as many training windows spread evenly
    over the training stream.
    """
    seed_everything(0)
    tok, train_ids, val_ids, _, _ = (
        data if data is not None else corpus_ids(rc.model.d_vocab, rc.train_fraction)
    )
    dev = dev or torch.device("cpu")
    n_ctx = rc.model.n_ctx
    model = GPT(rc.model).to(dev)
    trainer = Trainer(
        model,
        make_windows(train_ids, n_ctx, n_ctx // 2),
        make_windows(val_ids, n_ctx, n_ctx),
        rc.train,
    )
    t0 = time.perf_counter()
    hist = trainer.run(progress=progress)
    wall = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():  # the shipped weights are stored in fp16: score exactly those
        for p in model.parameters():
            p.copy_(p.to(SHIPPED_DTYPE).to(p.dtype))
    val_x, val_y = make_windows(val_ids, n_ctx, n_ctx)  # the whole validation text
    # as many training windows as validation windows, evenly spaced over the training stream
    starts = torch.linspace(0, len(train_ids) - n_ctx - 1, len(val_x)).long()
    train_w = torch.stack([train_ids[s : s + n_ctx + 1] for s in starts.tolist()])  # (n, n_ctx + 1)
    byte_lengths = token_byte_lengths(tok)
    return {
        "model": model,
        "tokenizer": tok,
        "history": hist,
        "wall_s": wall,
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "tokens_seen": rc.train.steps * rc.train.batch_size * n_ctx,
        "epochs": rc.train.steps * rc.train.batch_size * n_ctx / len(train_ids),
        "parameters": model.num_parameters(),
        "val": windows_loss(model, val_x, val_y, byte_lengths),
        "train": windows_loss(model, train_w[:, :-1], train_w[:, 1:], byte_lengths),
    }


def samples(model: GPT, tok: BPETokenizer, n_tokens: int = 60, seed: int = 0) -> list[str]:
    """One seeded sample per prompt of :data:`PROMPTS`, temperature 0.6, top-p 0.9, on the CPU (a
    model elsewhere is copied there; the caller's model stays where it is)."""
    check_int("n_tokens", n_tokens, lo=0)
    check_int("seed", seed, lo=0)
    if next(model.parameters()).device.type != "cpu":
        model = copy.deepcopy(model).to("cpu")
    out = []
    for k, prompt in enumerate(PROMPTS):
        g = torch.Generator().manual_seed(seed + k)
        ids = generate(
            model,
            torch.tensor(tok.encode(prompt)),
            n_tokens,
            temperature=0.6,
            top_p=0.9,
            generator=g,
        )
        out.append(tok.decode(ids.tolist()))
    return out


# --- the documentation model (models/small) ----------------------------------------------------

# Chapter 8's overfitting example: a 2048-token BPE and a GPT of d_model 128 on the training split
# (90%) of Python's help pages, 1200 steps of 16 windows of 128 tokens, about 21 passes over its
# 116 thousand tokens. Weights stay in float32.
DOCUMENTATION_RUN = RunConfig(
    GPTConfig(d_vocab=2048, n_ctx=128, d_model=128, n_heads=4, n_layers=4, dropout=0.1),
    TrainConfig(
        steps=1200,
        batch_size=16,
        max_lr=3e-3,
        min_lr=3e-4,
        warmup=50,
        eval_every=100,
        eval_batches=16,
    ),
)


def train_documentation_model(rc: RunConfig = DOCUMENTATION_RUN, progress: bool = False) -> dict:
    """Train the documentation model; return it with its tokenizer and its log (train_log.json).

    The validation loss of the log is the Trainer's (``eval_batches`` fixed batches of the held-out
    windows); the training loss is that of the training batches, dropout on.
    """
    seed_everything(0)
    train_text, val_text = train_val_split(load_corpus(), 0.1)
    train_text = train_text[: int(len(train_text) * rc.train_fraction)]
    tok = BPETokenizer.train(train_text, rc.model.d_vocab)
    train_ids, val_ids = torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text))
    n_ctx, tc = rc.model.n_ctx, rc.train
    model = GPT(rc.model)
    hist = Trainer(
        model, make_windows(train_ids, n_ctx, n_ctx // 2), make_windows(val_ids, n_ctx, n_ctx), tc
    ).run(progress=progress)
    model.eval()
    log = {
        "train_config": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in tc.__dict__.items()
        },
        "tokens_seen": tc.steps * tc.batch_size * n_ctx,
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "final_train_loss": round(sum(hist.loss[-50:]) / 50, 4),
        "final_val_loss": round(hist.eval_loss[-1], 4),
        "final_val_perplexity": round(perplexity(hist.eval_loss[-1]), 2),
        "eval_step": hist.eval_step,
        "eval_loss": [round(v, 4) for v in hist.eval_loss],
        "loss_every_10": [round(v, 4) for v in hist.loss[::10]],
    }
    return {"model": model, "tokenizer": tok, "history": hist, "log": log}


# --- Chapter 14's runs: LoRA against full fine-tuning, and three attention layers ----------------

# Fine-tuning the English model on one Brown genre (scripts/lora_mla_sweep.py, Chapter 14):
# windows of 64 tokens, batches of 8, 30 steps, AdamW without weight decay, 3 warm-up steps, a
# cosine to a
# tenth of the peak rate; the LoRA factors on every block's W_Q, W_K, W_V, W_O, W_in and W_out.
FINE_TUNE = {
    "genre": "j",
    "n_ctx": 64,
    "batch_size": 8,
    "steps": 30,
    "warmup": 3,
    "lr_lora": 2e-3,
    "lr_full": 2e-4,
    "alpha": 8.0,
}


def english_without_dropout(path) -> GPT:
    """The shipped English model with dropout 0 (fine-tuning then computes the function it
    trains)."""
    shipped = GPT.load(path)
    model = GPT(replace(shipped.config, dropout=0.0))
    model.load_state_dict(shipped.state_dict())
    return model.eval()


def genre_texts(genre: str) -> tuple[str, str, str]:
    """Chapter 8's split seen through one genre: the genre's training text, its held-out text, and
    the held-out text of every other genre (Brown samples joined by blank lines, as
    load_english)."""
    if not isinstance(genre, str) or len(genre) != 1:
        raise ValueError(f"genre must be one letter of the Brown genres, got {genre!r}")
    train_names, val_names = english_split()
    docs = dict(brown_documents())
    if not any(n[1] == genre for n in val_names):
        raise ValueError(f"genre {genre!r} has no held-out sample in Chapter 8's split")

    def join(names):
        return "\n\n".join(docs[n] for n in names) + "\n"

    return (
        join([n for n in train_names if n[1] == genre]),
        join([n for n in val_names if n[1] == genre]),
        join([n for n in val_names if n[1] != genre]),
    )


def fine_tune(
    base: GPT,
    train: tuple[torch.Tensor, torch.Tensor],
    r: int | None,
    seed: int,
    steps: int = FINE_TUNE["steps"],
    n_steps: int | None = None,
) -> tuple[torch.nn.Module, History]:
    """Fine-tune ``base`` on the windows ``train`` with :data:`FINE_TUNE`'s settings: LoRA of rank
    ``r`` (A drawn from ``seed``), or every parameter of a copy when ``r`` is None. The batches
    are drawn from ``seed`` too; ``n_steps`` stops after that many of the ``steps`` of the schedule
    (the first steps of the run, exactly). Returns the trained model (a :class:`gptlib.lora.LoRA` or
    a GPT)
    and the Trainer's history; ``base`` is left as it was, apart from being frozen by LoRA."""
    check_int("seed", seed, lo=0)
    ft = FINE_TUNE
    if r is None:
        model, lr = copy.deepcopy(base), ft["lr_full"]
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        model = LoRA(
            base, attention_mlp_targets(base), r, ft["alpha"], torch.Generator().manual_seed(seed)
        )
        lr = ft["lr_lora"]
    tc = TrainConfig(
        steps=steps,
        batch_size=ft["batch_size"],
        max_lr=lr,
        min_lr=lr / 10,
        warmup=ft["warmup"],
        weight_decay=0.0,
        eval_every=steps,
        eval_batches=1,
        seed=seed,
    )
    hist = Trainer(model, train, None, tc).run(n_steps)
    return model.eval(), hist


# Three attention layers in one small Llama-style model (RoPE, RMSNorm, SwiGLU): multi-head,
# grouped-query with one key/value head, and latent attention with d_c = 48, d_R = 16. d_mlp makes
# up the attention's parameters, so the three totals agree to within 256 numbers of 0.90 million.
ATTENTION_VARIANTS = {
    "mha": (
        ModernConfig(
            d_vocab=4096,
            n_ctx=128,
            d_model=128,
            n_layers=2,
            n_heads=4,
            n_kv_heads=4,
            d_mlp=320,
            rope_base=10000.0,
        ),
        None,
    ),
    "gqa": (
        ModernConfig(
            d_vocab=4096,
            n_ctx=128,
            d_model=128,
            n_layers=2,
            n_heads=4,
            n_kv_heads=1,
            d_mlp=384,
            rope_base=10000.0,
        ),
        None,
    ),
    "mla": (
        ModernConfig(
            d_vocab=4096,
            n_ctx=128,
            d_model=128,
            n_layers=2,
            n_heads=4,
            n_kv_heads=4,
            d_mlp=331,
            rope_base=10000.0,
        ),
        (48, 16),
    ),
}


def attention_variant(name: str) -> ModernGPT:
    """A freshly initialised model of :data:`ATTENTION_VARIANTS` (seed the generator first)."""
    if name not in ATTENTION_VARIANTS:
        raise ValueError(f"name must be one of {sorted(ATTENTION_VARIANTS)}, got {name!r}")
    config, latent = ATTENTION_VARIANTS[name]
    return ModernGPT(config) if latent is None else mla_model(config, *latent)


# --- Chapter 8's induction toy: an attention-only model that learns to copy ---------------------
INDUCTION_TOY = GPTConfig(
    d_vocab=64, n_ctx=48, d_model=64, n_heads=4, n_layers=2, attn_only=True, tie_weights=False
)
"""The toy's shape: period up to p = n_ctx / 2 = 24 over 64 tokens, two layers of four heads."""


def induction_toy_halves(model: GPT, seqs: torch.Tensor) -> tuple[float, float]:
    """The mean loss on the first half of each [r, r] in ``seqs`` (tokens 1..p-1, unpredictable)
    and on its repeated half (tokens p+1..2p-1); ``seqs`` is (B, 2p)."""
    p = seqs.shape[1] // 2
    with torch.no_grad():
        logits = model(seqs[:, :-1]).transpose(1, 2)  # (B, |V|, 2p-1)
        nll = F.cross_entropy(logits, seqs[:, 1:], reduction="none")  # (B, 2p-1)
    return float(nll[:, : p - 1].mean()), float(nll[:, p:].mean())


def train_induction_toy(
    steps: int = 500, every: int = 10
) -> tuple[GPT, list[tuple[int, float, float]]]:
    """Chapter 8's induction toy: :data:`INDUCTION_TOY` from seed 0, AdamW at 3e-3, each step 64
    sequences of a fresh random block of period 4..24 repeated to n_ctx + 1 tokens (generator
    seed 1). Returns the model and the curve ``(step, first half, repeated half)`` measured by
    :func:`induction_toy_halves` every ``every`` steps (and after the last) on 64 held-out [r, r]
    with p = 24 (generator seed 2). The first k steps of a longer run are the run of k steps."""
    steps = check_int("steps", steps, 0)
    every = check_int("every", every, 1)
    p, V = INDUCTION_TOY.n_ctx // 2, INDUCTION_TOY.d_vocab
    torch.manual_seed(0)
    model = GPT(INDUCTION_TOY)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g_train = torch.Generator().manual_seed(1)
    probe = repeated_sequences(64, p, V, torch.Generator().manual_seed(2))  # (64, 2p) held out
    curve = []
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            curve.append((step, *induction_toy_halves(model, probe)))
        if step == steps:
            break
        period = int(torch.randint(4, p + 1, (), generator=g_train))  # new every step
        x = repeated_sequences(64, period, V, g_train, total=2 * p + 1)  # (64, 2p+1)
        loss = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, curve


def save_induction_toy(folder, model: GPT, curve: list) -> Path:
    """Write ``folder/model.safetensors`` and ``folder/curve.json`` (the curve and the weights'
    sha256, so that a pair that does not belong together is refused), each atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = model.save(folder / "model.safetensors")
    record = {
        "weights_sha256": read_fields(weights)["sha256"],
        "curve": [[int(s), float(a), float(b)] for s, a, b in curve],
    }
    return atomic_write(folder / "curve.json", json.dumps(record, allow_nan=False) + "\n")


def load_induction_toy(folder) -> tuple[GPT, list[tuple[int, float, float]]]:
    """The model and curve :func:`save_induction_toy` wrote; a damaged or mismatched file raises
    ``ValueError`` naming it."""
    folder = Path(folder)
    hint = "run scripts/induction_toy.py"
    weights = check_file(folder / "model.safetensors", "weights", hint=hint)
    source = check_file(folder / "curve.json", "curve", hint=hint)
    try:
        record = json.loads(source.read_text())
        rows = [(int(s), float(a), float(b)) for s, a, b in record["curve"]]
        sha = record["weights_sha256"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: not an induction-toy curve ({e!r})") from None
    steps = [s for s, _, _ in rows]
    if not rows or steps != sorted(set(steps)) or not all(map(math.isfinite, sum(rows, ()))):
        raise ValueError(f"{source}: curve must be increasing steps with finite losses")
    model = GPT.load(weights)
    if read_fields(weights)["sha256"] != sha:
        raise ValueError(f"{source}: weights_sha256 does not match {weights}")
    if model.config != INDUCTION_TOY:
        raise ValueError(f"{weights}: config is not INDUCTION_TOY")
    model.eval()
    return model, rows
