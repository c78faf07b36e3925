"""Chapter 8: training — windows with a stride, cross-entropy, AdamW with a schedule, checkpoints.

For a window x_1..x_{N+1} of the token stream the model reads x_1..x_N and is scored on predicting
x_2..x_{N+1}: the loss is the mean of -log P(x_{t+1} | x_{<=t}) over the N positions, i.e. the
cross-entropy between the targets and the softmax of the logits. Its exponential is the perplexity.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .checkpoint import load_state_checked
from .runtime import atomic_write, autocast

__all__ = [
    "make_windows",
    "cross_entropy_from_formula",
    "lm_loss",
    "perplexity",
    "lr_at",
    "train_step",
    "param_groups",
    "TrainConfig",
    "Trainer",
    "WindowsLoss",
    "windows_loss",
]


def make_windows(ids: Tensor | list[int], n_ctx: int, stride: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets of length ``n_ctx``, windows starting every ``stride`` tokens.

    Window i reads ids[i*stride : i*stride + n_ctx] and its target is the same shifted by one.

    >>> x, y = make_windows(list(range(10)), n_ctx=4, stride=3)
    >>> x.tolist(), y.tolist()
    ([[0, 1, 2, 3], [3, 4, 5, 6]], [[1, 2, 3, 4], [4, 5, 6, 7]])
    """
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if len(ids) < n_ctx + 1:
        raise ValueError(f"ids has {len(ids)} tokens, fewer than n_ctx + 1 = {n_ctx + 1}")
    windows = ids.unfold(0, n_ctx + 1, stride)  # (n_windows, n_ctx + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def cross_entropy_from_formula(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over positions of -log softmax(logits)[target], with log softmax = y - logsumexp(y).

    logits: (..., d_vocab), targets: (...) integer ids.

    >>> round(float(cross_entropy_from_formula(torch.zeros(2, 4), torch.tensor([0, 3]))), 4)  # ln 4
    1.3863
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits (..., d_vocab) and targets (...) must agree, got {tuple(logits.shape)} and {tuple(targets.shape)}")
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -log_probs.gather(-1, targets[..., None])[..., 0].mean()


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The training loss: mean next-token cross-entropy over all B T positions, computed in float32.

    logits (B, T, d_vocab), targets (B, T). Equal to :func:`cross_entropy_from_formula`.

    >>> round(float(lm_loss(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))), 4)  # ln 4
    1.3863
    """
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def perplexity(loss: float | Tensor) -> float:
    """exp(mean negative log-likelihood): the size of a uniform vocabulary with the same loss.

    >>> round(perplexity(math.log(50)), 6)
    50.0
    """
    return math.exp(float(loss))


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Linear warm-up to ``max_lr`` over ``warmup`` steps, then a cosine down to ``min_lr`` at ``total``.

    >>> [round(lr_at(s, 1.0, 2, 6), 3) for s in range(7)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146, 0.0]
    """
    if warmup < 0 or total < 1 or warmup > total:
        raise ValueError(f"need 0 <= warmup <= total and total >= 1, got warmup={warmup}, total={total}")
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def train_step(model: torch.nn.Module, loss: Tensor, optimizer: torch.optim.Optimizer, grad_clip: float | None = None) -> float:
    """One optimiser step on ``loss``: zero the gradients, back-propagate, clip their global norm to
    ``grad_clip`` (if given), step. Returns the loss as a float.

    >>> w = torch.nn.Parameter(torch.tensor([3.0]))
    >>> model = torch.nn.ParameterList([w])
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> train_step(model, (w**2).sum(), opt, grad_clip=1.0)  # gradient 6, clipped to norm 1
    9.0
    >>> round(float(w.detach()), 4)
    2.9
    """
    if grad_clip is not None and grad_clip <= 0:
        raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach())


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices (2-D parameters, embeddings included), none on biases
    and LayerNorm gains (1-D). This is the book's rule (nanoGPT's too); GPT-2's own was not published."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class TrainConfig:
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
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_lr <= 0 or self.min_lr < 0 or self.min_lr > self.max_lr:
            raise ValueError(f"need 0 <= min_lr <= max_lr and max_lr > 0, got {self.min_lr}, {self.max_lr}")
        if self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")
        if not 0 <= self.warmup <= self.steps:
            raise ValueError(f"warmup must be in [0, steps], got {self.warmup}")


@dataclass
class History:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)


class Trainer:
    """AdamW, warm-up + cosine schedule, gradient clipping, periodic evaluation, checkpoints.

    Batches are drawn from the windows with a seeded generator, so a run is reproducible and a run
    resumed from a checkpoint continues exactly as the uninterrupted one.
    """

    def __init__(self, model, train: tuple[Tensor, Tensor], val: tuple[Tensor, Tensor] | None, config: TrainConfig):
        self.model, self.config = model, config
        self.train_x, self.train_y = train
        self.val = val
        if len(self.train_x) < 1:
            raise ValueError("train has no windows")
        self.device = next(model.parameters()).device
        self.opt = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.max_lr, betas=config.betas,
                                     fused=self.device.type == "cuda")
        self.gen = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.history = History()

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
        g = torch.Generator().manual_seed(self.config.seed + 1)  # the same batches every time
        losses = [float(self.loss_on(*self._batch(*self.val, g))) for _ in range(self.config.eval_batches)]
        self.model.train(was)
        return sum(losses) / len(losses)

    def run(self, n_steps: int | None = None, progress: bool = False) -> History:
        """Train for ``n_steps`` (default: up to ``config.steps``); return the history so far."""
        c = self.config
        end = c.steps if n_steps is None else min(c.steps, self.step + n_steps)
        self.model.train()
        bar = tqdm(total=end - self.step, disable=not progress, desc="training", leave=False)
        while self.step < end:
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
            bar.update(1)
            bar.set_postfix(loss=f"{self.history.loss[-1]:.3f}")
        bar.close()
        return self.history

    # --- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path) -> Path:
        """Model, optimiser state, step, history and every RNG state in one file, written atomically.
        The file holds only tensors and plain Python values: ``torch.load(path, weights_only=True)``."""
        state = {
            "format": "gptlib-checkpoint",
            "version": 1,
            "model_config": self.model.config.to_dict() if hasattr(self.model, "config") else None,
            "train_config": asdict(self.config),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.opt.state_dict(),
            "step": self.step,
            "history": asdict(self.history),
            "rng": {"batches": self.gen.get_state(), "torch": torch.get_rng_state(), "python": random.getstate()},
        }
        if torch.cuda.is_available():
            state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
        buf = io.BytesIO()
        torch.save(state, buf)
        return atomic_write(path, buf.getvalue())

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint into this trainer; a different model config fails naming the tensor."""
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - corrupt or foreign file
            raise ValueError(f"{path} is not a readable checkpoint: {e}") from None
        if not isinstance(state, dict) or state.get("format") != "gptlib-checkpoint":
            raise ValueError(f"{path} is not a gptlib checkpoint")
        load_state_checked(self.model, {k: v.to(self.device) for k, v in state["model"].items()}, source=str(path))
        self.opt.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.history = History(**state["history"])
        self.gen.set_state(state["rng"]["batches"])
        torch.set_rng_state(state["rng"]["torch"])
        py = state["rng"]["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])



# --- the loss over windows: the measurement every script and Chapter 8 make ------------------------


@dataclass(frozen=True)
class WindowsLoss:
    """The mean loss over a set of windows: nats per token and, when byte lengths were given, bits per byte."""

    nats_per_token: float
    bits_per_byte: float | None
    tokens: int  # the targets scored
    bytes: int | None  # their UTF-8 bytes


@torch.no_grad()
def windows_loss(
    model: torch.nn.Module, x: Tensor, y: Tensor, byte_lengths: Tensor | list[int] | None = None, batch_size: int = 32
) -> WindowsLoss:
    """The loss of ``model`` over every window (x, y), in eval mode, ``batch_size`` windows at a time.

    x, y: (n, T) inputs and targets (:func:`make_windows`). The total of -log P(target) over all n T
    targets is divided by their number (nats per token) and, given ``byte_lengths`` (d_vocab,), the
    UTF-8 length of each token, by ln 2 times their bytes (bits per byte, comparable across
    tokenizers). Batches run under :func:`gptlib.runtime.autocast` on the model's device (bf16 on a
    CUDA GPU that has it); the logits are scored in float32. The model's training mode is restored.

    >>> model = torch.nn.Embedding(4, 4)  # ids (n, T) -> logits (n, T, 4)
    >>> _ = torch.nn.init.zeros_(model.weight)  # uniform over 4 tokens: ln 4 nats, 2 bits per token
    >>> x, y = make_windows(list(range(4)) * 3, n_ctx=5, stride=5)
    >>> r = windows_loss(model, x, y, byte_lengths=[2, 2, 2, 2])  # 2 bytes per token: 1 bit per byte
    >>> round(r.nats_per_token, 4), round(r.bits_per_byte, 4), r.tokens, r.bytes
    (1.3863, 1.0, 10, 20)
    """
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must both have shape (n, T), got {tuple(x.shape)} and {tuple(y.shape)}")
    if len(x) == 0:
        raise ValueError("x holds no window")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), batch_size):
        with autocast(dev):
            logits = model(x[i:i + batch_size].to(dev))  # (b, T, d_vocab)
        targets = y[i:i + batch_size].flatten().to(dev)  # (b T,)
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets, reduction="sum"))
    model.train(was)
    n_tokens = y.numel()
    if byte_lengths is None:
        return WindowsLoss(total / n_tokens, None, n_tokens, None)
    byte_lengths = torch.as_tensor(byte_lengths)
    if byte_lengths.dim() != 1 or int(y.max()) >= len(byte_lengths) or int(y.min()) < 0:
        raise ValueError(f"byte_lengths must give the length of every token id in y, got shape "
                         f"{tuple(byte_lengths.shape)} for ids up to {int(y.max())}")
    n_bytes = int(byte_lengths[y].sum())
    return WindowsLoss(total / n_tokens, total / (math.log(2) * n_bytes), n_tokens, n_bytes)
