"""Chapter 8's trainer: AdamW with the schedule of :mod:`gptlib.training`, evaluation, checkpoints.

The mathematics (windows, the loss, the schedule, one optimiser step) lives in
:mod:`gptlib.training`;
this module runs it over many steps and keeps what a long run needs to survive interruption: a
checkpoint in gptlib's one file format (:mod:`gptlib.files`), validated before anything is restored.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .files import model_fields, model_tensors, read_file, write_file
from .runtime import (
    autocast,
    check_finite_weights,
    check_float,
    check_ids,
    check_int,
    check_positive_int,
)
from .state import check_optimizer_state, check_random_states, check_state, pack, unpack
from .training import lm_loss, lr_at, param_groups, train_step

__all__ = ["TrainConfig", "History", "Trainer"]


@dataclass(frozen=True)
class TrainConfig:
    """What a :class:`Trainer` does: ints are ints (``bool`` refused), floats finite and in
    range."""

    steps: int = 300
    batch_size: int = 16
    max_lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 8
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_batches"):
            check_positive_int(name, getattr(self, name))
        check_int("warmup", self.warmup, lo=0, hi=self.steps)
        check_int("seed", self.seed, lo=0, hi=2**63 - 1)
        max_lr = check_float("max_lr", self.max_lr, 0.0, lo_open=True)
        check_float("min_lr", self.min_lr, 0.0, max_lr)
        check_float("weight_decay", self.weight_decay, 0.0)
        check_float("grad_clip", self.grad_clip, 0.0, lo_open=True)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {self.betas!r}")
        for i, b in enumerate(self.betas):
            check_float(f"betas[{i}]", b, 0.0, 1.0, hi_open=True)
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))


@dataclass
class History:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)


def _check_windows(
    name: str, pair, d_vocab: int | None, n_ctx: int | None
) -> tuple[Tensor, Tensor]:
    """``pair`` as (x, y): 2-D integer tensors of one shape, ids in [0, d_vocab), at most n_ctx
    wide."""
    if not (
        isinstance(pair, (tuple, list))
        and len(pair) == 2
        and all(isinstance(t, Tensor) for t in pair)
    ):
        raise ValueError(
            f"{name} must be a pair of tensors (x, y) as make_windows returns, got "
            f"{type(pair).__name__}"
        )
    x, y = pair
    if x.dim() != 2 or x.shape != y.shape or len(x) < 1:
        raise ValueError(
            f"{name}: x and y must be (n_windows, T) with the same shape and n_windows >= 1, "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if n_ctx is not None and x.shape[1] > n_ctx:
        raise ValueError(
            f"{name}: windows of {x.shape[1]} tokens are longer than the model's n_ctx={n_ctx}"
        )
    for part, t in (("x", x), ("y", y)):
        check_ids(t, d_vocab or torch.iinfo(torch.int64).max, f"{name} {part}")
    return x, y


class Trainer:
    """AdamW, warm-up + cosine schedule, gradient clipping, periodic evaluation, checkpoints.

    Batches are drawn from the windows with a seeded generator, so a run is reproducible and a run
    resumed from a checkpoint continues exactly as the uninterrupted one. The data are checked once
    here (ids in range, x and y of one shape); every step checks that the loss and the gradients are
    finite before the optimiser moves, so a non-finite model or a diverging run is an error, never
    a silently ruined model.
    """

    def __init__(
        self,
        model,
        train: tuple[Tensor, Tensor],
        val: tuple[Tensor, Tensor] | None,
        config: TrainConfig,
    ):
        if not isinstance(config, TrainConfig):
            raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
        if not isinstance(model, torch.nn.Module) or not any(True for _ in model.parameters()):
            raise ValueError(
                f"model must be a torch.nn.Module with parameters, got {type(model).__name__}"
            )
        mc = getattr(model, "config", None)
        d_vocab, n_ctx = getattr(mc, "d_vocab", None), getattr(mc, "n_ctx", None)
        self.model, self.config = model, config
        self.train_x, self.train_y = _check_windows("train", train, d_vocab, n_ctx)
        self.val = None if val is None else _check_windows("val", val, d_vocab, n_ctx)
        self._check_model_finite()
        self.device = next(model.parameters()).device
        self.opt = torch.optim.AdamW(
            param_groups(model, config.weight_decay),
            lr=config.max_lr,
            betas=config.betas,
            fused=self.device.type == "cuda",
        )
        self.gen = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.history = History()
        self._torn = (
            False  # True once a step was interrupted part-way: no checkpoint until one is loaded
        )

    def _check_model_finite(self) -> None:
        check_finite_weights(self.model)

    def lr(self) -> float:
        c = self.config
        return lr_at(self.step, c.max_lr, c.warmup, c.steps, c.min_lr)

    def _batch(self, x: Tensor, y: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        i = torch.randint(0, len(x), (self.config.batch_size,), generator=gen)
        return x[i].to(self.device), y[i].to(self.device)

    def loss_on(self, x: Tensor, y: Tensor) -> Tensor:
        with autocast(self.device):
            logits = self.model(x)
        return lm_loss(logits, y)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``eval_batches`` fixed batches of the validation windows."""
        if self.val is None:
            raise ValueError("no validation windows were given")
        was = self.model.training
        self.model.eval()
        try:
            g = torch.Generator().manual_seed(self.config.seed + 1)  # the same batches every time
            losses = [
                float(self.loss_on(*self._batch(*self.val, g)))
                for _ in range(self.config.eval_batches)
            ]
        finally:
            self.model.train(was)
        return sum(losses) / len(losses)

    def run(self, n_steps: int | None = None, progress: bool = False) -> History:
        """Train for ``n_steps`` (default: up to ``config.steps``); return the history so far.

        A step whose loss or gradient norm is not finite raises ``ValueError`` before the weights
        change. An exception (or Ctrl-C) in the middle of a step leaves the trainer with part of
        that step done: :meth:`save_checkpoint` then refuses until :meth:`load_checkpoint`.
        """
        c = self.config
        if n_steps is not None:
            check_int("n_steps", n_steps, lo=0)
        end = c.steps if n_steps is None else min(c.steps, self.step + n_steps)
        self._check_model_finite()
        self.model.train()
        bar = tqdm(total=end - self.step, disable=not progress, desc="training", leave=False)
        try:
            while self.step < end:
                self._torn = True  # from the batch draw to the end of the bookkeeping
                lr = self.lr()
                for group in self.opt.param_groups:
                    group["lr"] = lr
                x, y = self._batch(self.train_x, self.train_y, self.gen)
                loss = train_step(self.model, self.loss_on(x, y), self.opt, c.grad_clip)
                self.history.step.append(self.step)
                self.history.loss.append(loss)
                self.history.lr.append(lr)
                self.step += 1
                if self.val is not None and (self.step % c.eval_every == 0 or self.step == c.steps):
                    self.history.eval_step.append(self.step)
                    self.history.eval_loss.append(self.evaluate())
                self._torn = False
                bar.update(1)
                bar.set_postfix(loss=f"{self.history.loss[-1]:.3f}")
        finally:
            bar.close()
        return self.history

    # --- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path) -> Path:
        """The model, its config, the optimiser's moments, the step, the history and every random
        state, in one gptlib file (:mod:`gptlib.files`) written in one atomic step; returns the
        path.
        The file is also a model file: ``GPT.load(path)`` reads the model from it.

        Only between steps: after a step was interrupted part-way, this raises ``ValueError``.
        """
        if self._torn:
            raise ValueError(
                f"step {self.step} was interrupted part-way, so the trainer holds part of it; a "
                "checkpoint "
                "now would not resume the run exactly (load the last checkpoint, or start again)"
            )
        rng = {
            "batches": self.gen.get_state(),
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        tree = {
            "step": self.step,
            "train_config": asdict(self.config),
            "history": asdict(self.history),
            "optimizer": self.opt.state_dict(),
            "rng": rng,
        }
        structure, trainer_tensors = pack(tree, "trainer")
        tensors = {**model_tensors(self.model), **trainer_tensors}
        return write_file(path, tensors, {**model_fields(self.model), "trainer": structure})

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint` for the same model and config.

        Everything is validated first, then restored: a damaged file or a field that does not fit
        (model class, config, a tensor, the step, the history, the optimiser, a random state)
        raises ``ValueError`` naming the file and the field, and leaves the trainer as it was.
        """
        model_state, tree = self._validated_checkpoint(Path(path))
        self._torn = True  # until every part is restored
        self.model.load_state_dict({k: v.to(self.device) for k, v in model_state.items()})
        self.opt.load_state_dict(tree["optimizer"])
        self.step = tree["step"]
        self.history = History(**tree["history"])
        rng = tree["rng"]
        self.gen.set_state(rng["batches"])
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self._torn = False

    def _validated_checkpoint(self, path: Path) -> tuple[dict[str, Tensor], dict]:
        tensors, fields = read_file(path)

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{path}: field {name!r} {why}")

        if fields.get("model") != type(self.model).__name__:
            raise bad(
                "model",
                f"is {fields.get('model')!r}, this trainer's model is a "
                f"{type(self.model).__name__}",
            )
        ours, theirs = model_fields(self.model).get("config"), fields.get("config")
        if ours is not None and theirs != ours:
            theirs = theirs if isinstance(theirs, dict) else {}
            raise bad(
                "config",
                "differs from this trainer's model in "
                f"{sorted(k for k in {*ours, *theirs} if ours.get(k) != theirs.get(k))}",
            )
        model_state = check_state(
            self.model, {k: v for k, v in tensors.items() if "/" not in k}, str(path)
        )
        if "trainer" not in fields:
            raise bad("trainer", "is missing: a model file, not a training checkpoint")
        tree = unpack(fields["trainer"], tensors, f"{path}: field 'trainer'", "trainer")
        if not isinstance(tree, dict) or {
            "step",
            "train_config",
            "history",
            "optimizer",
            "rng",
        } - set(tree):
            raise bad("trainer", "must hold step, train_config, history, optimizer and rng")
        try:
            stored = TrainConfig(**tree["train_config"])
        except (TypeError, ValueError) as e:
            raise bad("trainer.train_config", f"is invalid: {e}") from None
        if stored != self.config:
            diff = [
                f.name
                for f in dataclasses.fields(TrainConfig)
                if getattr(stored, f.name) != getattr(self.config, f.name)
            ]
            raise bad("trainer.train_config", f"differs from this trainer's config in {diff}")
        step, h = tree["step"], tree["history"]
        if (
            isinstance(step, bool)
            or not isinstance(step, int)
            or not 0 <= step <= self.config.steps
        ):
            raise bad("trainer.step", f"must be an int in [0, {self.config.steps}], got {step!r}")
        names = sorted(f.name for f in dataclasses.fields(History))
        finite = lambda xs: all(isinstance(v, float) and math.isfinite(v) for v in xs)  # noqa: E731
        if not (
            isinstance(h, dict)
            and sorted(h) == names
            and h["step"] == list(range(step))
            and len(h["loss"]) == len(h["lr"]) == step
            and finite(h["loss"])
            and finite(h["lr"])
            and isinstance(h["eval_step"], list)
            and all(isinstance(v, int) and 0 < v <= step for v in h["eval_step"])
            and isinstance(h["eval_loss"], list)
            and len(h["eval_loss"]) == len(h["eval_step"])
            and finite(h["eval_loss"])
        ):
            raise bad(
                "trainer.history",
                f"does not describe steps 0 … {step - 1} (lists {names}, finite losses, one per "
                "step)",
            )
        lr = (
            h["lr"][-1] if step else self.opt.param_groups[0]["lr"]
        )  # the last step's, or the initial one
        check_optimizer_state(
            self.opt, tree["optimizer"], f"{path}: field 'trainer.optimizer'", step=step, lr=lr
        )
        tree["rng"] = check_random_states(tree["rng"], f"{path}: field 'trainer.rng'")
        if {"batches", "torch", "python"} - set(tree["rng"]):
            raise bad("trainer.rng", "must hold the states batches, torch and python")
        return model_state, tree
