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
from .files import model_fields, model_tensors, read_fields, read_file, save_model, write_file
from .lora import LoRA, attention_mlp_targets
from .mla import mla_model
from .model import GPT, GPTConfig
from .modern import ModernConfig, ModernGPT
from .rlhf import (
    RewardModel,
    dpo,
    ppo,
    preference_pairs,
    reference_logprobs,
    response_mask,
    sample_responses,
    sequence_logprob,
    sft,
    train_reward_model,
)
from .rlhf.toy_task import SentenceTask
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
    "TINY_RUN",
    "tiny_run_config",
    "train_tiny_run",
    "save_tiny_run",
    "load_tiny_run",
    "INDUCTION_TOY",
    "induction_toy_halves",
    "train_induction_toy",
    "save_induction_toy",
    "load_induction_toy",
    "RLHF_STEPS",
    "RLHFRuns",
    "train_rlhf_runs",
    "save_rlhf_runs",
    "load_rlhf_runs",
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


# --- Chapter 8's first training run (8.4): the tiny preset on the documentation text ------------
TINY_RUN = TrainConfig(steps=300, batch_size=16, eval_every=50)
"""8.4's optimisation: 300 AdamW steps of 16 windows, the validation loss every 50 steps."""
_HISTORY_KEYS = ("step", "loss", "lr", "eval_step", "eval_loss")


def tiny_run_config(d_vocab: int) -> GPTConfig:
    """8.4's model: the ``tiny`` preset with ``n_ctx = 64`` over a vocabulary of ``d_vocab``.

    >>> tiny_run_config(1024).n_ctx
    64
    """
    return GPTConfig.preset("tiny", d_vocab=check_int("d_vocab", d_vocab, 2), n_ctx=64)


def train_tiny_run(
    train_ids: torch.Tensor, val_ids: torch.Tensor, d_vocab: int, tc: TrainConfig = TINY_RUN
) -> tuple[GPT, History]:
    """Chapter 8's run of 8.4, as its cell trains it: :func:`tiny_run_config` from seed 0,
    training windows of n_ctx tokens at stride n_ctx / 2, validation windows tiled, and a
    :class:`~gptlib.trainer.Trainer` with ``tc``. Returns the model (eval mode) and its history."""
    cfg = tiny_run_config(d_vocab)
    torch.manual_seed(0)
    model = GPT(cfg)
    train_windows = make_windows(train_ids, cfg.n_ctx, cfg.n_ctx // 2)
    val_windows = make_windows(val_ids, cfg.n_ctx, cfg.n_ctx)
    hist = Trainer(model, train_windows, val_windows, tc).run(progress=False)
    return model.eval(), hist


def save_tiny_run(folder, model: GPT, hist: History) -> Path:
    """Write ``folder/model.safetensors`` (float32, as trained) and ``folder/history.json`` (the
    history and the weights' sha256, so that a pair that does not belong together is refused),
    each atomically; returns the JSON file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = model.save(folder / "model.safetensors")
    record = {
        "weights_sha256": read_fields(weights)["sha256"],
        "history": {k: list(getattr(hist, k)) for k in _HISTORY_KEYS},
    }
    return atomic_write(folder / "history.json", json.dumps(record, allow_nan=False) + "\n")


def load_tiny_run(folder, config: GPTConfig) -> tuple[GPT, History]:
    """The model (eval mode, of shape ``config``) and history :func:`save_tiny_run` wrote; a
    missing, damaged or mismatched file raises ``ValueError`` naming it."""
    folder = Path(folder)
    hint = "run scripts/tiny_run.py"
    weights = check_file(folder / "model.safetensors", "weights", hint=hint)
    source = check_file(folder / "history.json", "history", hint=hint)
    try:
        record = json.loads(source.read_text())
        raw, sha = dict(record["history"]), record["weights_sha256"]
        hist = History(
            step=[int(s) for s in raw["step"]],
            loss=[float(v) for v in raw["loss"]],
            lr=[float(v) for v in raw["lr"]],
            eval_step=[int(s) for s in raw["eval_step"]],
            eval_loss=[float(v) for v in raw["eval_loss"]],
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: not a training history ({e!r})") from None
    for steps, values in ((hist.step, (hist.loss, hist.lr)), (hist.eval_step, (hist.eval_loss,))):
        if not steps or steps != sorted(set(steps)) or any(len(v) != len(steps) for v in values):
            raise ValueError(f"{source}: history must be increasing steps, one value per step")
        if not all(math.isfinite(v) for vs in values for v in vs):
            raise ValueError(f"{source}: history values must be finite")
    if read_fields(weights)["sha256"] != sha:
        raise ValueError(f"{source}: weights_sha256 does not match {weights}")
    model = GPT.load(weights)
    if model.config != config:
        raise ValueError(f"{weights}: config is {model.config}, expected {config}")
    return model.eval(), hist


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


# --- Chapter 9's fine-tuning runs: SFT, the reward model, PPO and DPO, stored --------------------
RLHF_STEPS = {"sft": 20, "reward_model": 16, "ppo": 12, "dpo": 20}
"""The length of each of Chapter 9's runs, in optimiser steps (PPO: in sampled batches)."""
_RLHF_FILES = ("sft", "reward_model", "ppo", "dpo", "pairs")  # models/rlhf/NAME.safetensors


@dataclass(frozen=True, eq=False)
class RLHFRuns:
    """Chapter 9's runs (:func:`train_rlhf_runs`): the four trained models, the data made between
    them, the curve of every run (``curves``: ``"sft"``, ``"reward_model"`` and ``"dpo"`` the
    loss of each step, ``"ppo"`` the per-step ``judged``, ``reward`` and ``kl`` of
    :func:`gptlib.rlhf.ppo`) and ``heldout``: -log pi(Y | X) of each of the 256 held-out
    demonstrations under ``"pretrained"`` (the base model) and ``"sft"``."""

    sft: GPT
    reward_model: RewardModel
    ppo: GPT
    dpo: GPT
    samples: torch.Tensor  # (128 K, P + |Y|): SFT's K = 4 responses to the first 128 prompts
    ref_w: torch.Tensor  # (n_train,) float32: log pi_SFT(Y_w | X) of the training pairs
    ref_l: torch.Tensor  # (n_train,) float32: log pi_SFT(Y_l | X)
    curves: dict
    heldout: dict


def train_rlhf_runs(base: GPT, task: SentenceTask) -> RLHFRuns:
    """Chapter 9's pipeline, with the chapter's arguments, from ``base`` (the English model without
    dropout) on ``task`` (``sentence_task(..., n_train=500, n_eval=100, seed=0)``): SFT on the
    demonstrations (the openings the labeller scores 1, less 256 held out by seed 2), K = 4
    responses of SFT to the first 128 training prompts (seed 3) ranked into pairs, 80% of them
    training the reward model, PPO with GRPO's advantage at beta = 0.1 (seed 5) and DPO at
    beta = 0.1 (seed 6), each for :data:`RLHF_STEPS` steps. The first k steps of a run are the run
    of k steps."""
    P, Y_len = task.prompt_len, task.response_len
    demos = task.openings[task.judged(task.openings) == 1.0]
    perm = torch.randperm(len(demos), generator=torch.Generator().manual_seed(2))
    policy_sft, sft_losses = sft(
        base, demos[perm[256:]], P, steps=RLHF_STEPS["sft"], lr=5e-5, seed=2
    )
    g = torch.Generator().manual_seed(3)
    samples = sample_responses(policy_sft, task.train_prompts[:128], Y_len, 4, g)
    Yw, Yl = preference_pairs(samples, task.judged(samples).view(128, 4))
    n_train = int(0.8 * len(Yw))
    rm, rm_losses = train_reward_model(
        policy_sft,
        Yw[:n_train],
        Yl[:n_train],
        steps=RLHF_STEPS["reward_model"],
        lr=6e-4,
        seed=4,
        batch_size=16,
    )
    steps = RLHF_STEPS["ppo"]
    policy_ppo, history = ppo(
        policy_sft, rm, task.train_prompts, Y_len, 0.1, steps, seed=5, judge=task.judged
    )
    ref_w, ref_l = reference_logprobs(policy_sft, Yw[:n_train], Yl[:n_train], P)
    policy_dpo, dpo_losses = dpo(
        policy_sft,
        Yw[:n_train],
        Yl[:n_train],
        P,
        beta=0.1,
        steps=RLHF_STEPS["dpo"],
        seed=6,
        batch_size=8,
        ref_logprobs=(ref_w, ref_l),
    )
    curves = {"sft": sft_losses, "reward_model": rm_losses, "ppo": history, "dpo": dpo_losses}
    held = demos[perm[:256]]  # (256, P + |Y|): demonstrations that SFT never sees
    with torch.no_grad():
        heldout = {
            name: (-sequence_logprob(m, held, response_mask(held, P))).tolist()
            for name, m in (("pretrained", base), ("sft", policy_sft))
        }
    return RLHFRuns(policy_sft, rm, policy_ppo, policy_dpo, samples, ref_w, ref_l, curves, heldout)


def save_rlhf_runs(folder, runs: RLHFRuns) -> Path:
    """Write ``folder/{sft,reward_model,ppo,dpo}.safetensors`` (float32, as trained),
    ``folder/pairs.safetensors`` (the samples and the reference's log-probabilities of the
    training pairs) and ``folder/curves.json`` (every run's curve and each file's sha256, so that
    files that do not belong together are refused), each atomically; returns the JSON file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rm = runs.reward_model
    head = {"head/w_r": rm.w_r, "head/b_r": rm.b_r}
    written = {
        "sft": save_model(runs.sft, folder / "sft.safetensors"),
        "reward_model": write_file(
            folder / "reward_model.safetensors",
            {**model_tensors(rm.backbone), **head},
            model_fields(rm.backbone),
        ),
        "ppo": save_model(runs.ppo, folder / "ppo.safetensors"),
        "dpo": save_model(runs.dpo, folder / "dpo.safetensors"),
        "pairs": write_file(
            folder / "pairs.safetensors",
            {"samples": runs.samples, "ref_w": runs.ref_w, "ref_l": runs.ref_l},
            {},
        ),
    }
    record = {
        "sha256": {k: read_fields(f)["sha256"] for k, f in written.items()},
        "curves": runs.curves,
        "heldout": runs.heldout,
    }
    text = json.dumps(record, indent=1, allow_nan=False) + "\n"
    return atomic_write(folder / "curves.json", text)


def _curve(values, name: str, source: Path) -> list[float]:
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
    ):
        raise ValueError(f"{source}: curve {name!r} must be a non-empty list of finite numbers")
    return [float(v) for v in values]


def load_rlhf_runs(folder, config: GPTConfig) -> RLHFRuns:
    """The runs :func:`save_rlhf_runs` wrote, their models of shape ``config`` (the English model
    without dropout) in eval mode; a missing, damaged or mismatched file raises naming it."""
    folder = Path(folder)
    hint = "run scripts/rlhf_runs.py"
    files = {k: check_file(folder / f"{k}.safetensors", k, hint=hint) for k in _RLHF_FILES}
    source = check_file(folder / "curves.json", "curves", hint=hint)
    try:
        record = json.loads(source.read_text())
        sha, raw = dict(record["sha256"]), dict(record["curves"])
        ppo_raw, held_raw = dict(raw["ppo"]), dict(record["heldout"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source}: not a record of Chapter 9's runs ({e!r})") from None
    curves = {k: _curve(raw.get(k), k, source) for k in ("sft", "reward_model", "dpo")}
    curves["ppo"] = {
        k: _curve(ppo_raw.get(k), f"ppo/{k}", source) for k in ("judged", "reward", "kl")
    }
    for name, n in RLHF_STEPS.items():
        lengths = [len(c) for c in (curves[name].values() if name == "ppo" else [curves[name]])]
        if lengths != [n] * len(lengths):
            raise ValueError(f"{source}: curve {name!r} must have {n} steps, got {lengths}")
    heldout = {k: _curve(held_raw.get(k), f"heldout/{k}", source) for k in ("pretrained", "sft")}
    if len(heldout["pretrained"]) != len(heldout["sft"]):
        raise ValueError(f"{source}: the two heldout lists must have one value per demonstration")
    for name, file in files.items():
        if read_fields(file)["sha256"] != sha.get(name):
            raise ValueError(f"{source}: sha256 of {name!r} does not match {file}")
    models = {}
    for name in ("sft", "reward_model", "ppo", "dpo"):
        model = GPT.load(files[name])
        if model.config != config:
            raise ValueError(f"{files[name]}: config is {model.config}, expected {config}")
        models[name] = model.eval()
    head = read_file(files["reward_model"])[0]
    rm = RewardModel(models["reward_model"])
    with torch.no_grad():
        for name in ("w_r", "b_r"):
            want = getattr(rm, name)
            got = head.get(f"head/{name}")
            if got is None or got.shape != want.shape or not torch.isfinite(got).all():
                raise ValueError(f"{files['reward_model']}: tensor 'head/{name}' is missing or bad")
            want.copy_(got)
    pairs = read_file(files["pairs"])[0]
    if set(pairs) != {"samples", "ref_w", "ref_l"} or pairs["ref_w"].shape != pairs["ref_l"].shape:
        raise ValueError(f"{files['pairs']}: must hold samples, ref_w and ref_l of one shape")
    samples = pairs["samples"]
    if samples.dim() != 2 or int(samples.min()) < 0 or int(samples.max()) >= config.d_vocab:
        raise ValueError(f"{files['pairs']}: samples must be (n, T) token ids of the model")
    return RLHFRuns(
        models["sft"],
        rm.eval(),
        models["ppo"],
        models["dpo"],
        samples,
        pairs["ref_w"],
        pairs["ref_l"],
        curves,
        heldout,
    )
