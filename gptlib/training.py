"""Chapter 8: training — windows with a stride, cross-entropy, the schedule, one optimiser step,
the loss over windows.

For a window x_1..x_{N+1} of the token stream the model reads x_1..x_N and is scored on predicting
x_2..x_{N+1}: the loss is the mean of -log P(x_{t+1} | x_{<=t}) over the N positions, i.e. the
cross-entropy between the targets and the softmax of the logits. Its exponential is the perplexity.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .runtime import autocast, check_float, check_ids, check_int, check_positive_int, check_targets

__all__ = [
    "make_windows",
    "cross_entropy_from_formula",
    "lm_loss",
    "perplexity",
    "lr_at",
    "train_step",
    "param_groups",
    "WindowsLoss",
    "windows_loss",
]


def make_windows(
    ids: Tensor | list[int], n_ctx: int, stride: int, d_vocab: int | None = None
) -> tuple[Tensor, Tensor]:
    """Inputs and targets of length ``n_ctx``, windows starting every ``stride`` tokens.

    Window i reads ids[i*stride : i*stride + n_ctx] and its target is the same shifted by one.
    ``ids`` must be integer token ids (a 1-D integer tensor or a list of ints), >= 0 and, when
    ``d_vocab`` is given, < d_vocab.

    >>> x, y = make_windows(list(range(10)), n_ctx=4, stride=3)
    >>> x.tolist(), y.tolist()
    ([[0, 1, 2, 3], [3, 4, 5, 6]], [[1, 2, 3, 4], [4, 5, 6, 7]])
    """
    check_positive_int("n_ctx", n_ctx)
    check_positive_int("stride", stride)
    if d_vocab is not None:
        check_positive_int("d_vocab", d_vocab)
    if not isinstance(ids, Tensor):
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
            raise ValueError(
                f"ids must be a 1-D integer tensor or a list of ints, got {type(ids).__name__}"
            )
        bad = next(
            (i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)), None
        )
        if bad is not None:
            raise ValueError(f"ids must be ints, got {bad!r}")
        try:
            ids = torch.tensor(list(ids), dtype=torch.long)
        except (OverflowError, RuntimeError) as e:
            raise ValueError(f"ids must be token ids: {e}") from None
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"ids must be integer token ids, got dtype {ids.dtype}")
    if d_vocab is not None:
        check_ids(ids, d_vocab)
    elif len(ids) and int(ids.min()) < 0:
        raise ValueError(f"ids must be >= 0, got {int(ids.min())}")
    ids = ids.long()
    if len(ids) < n_ctx + 1:
        raise ValueError(f"ids has {len(ids)} tokens, fewer than n_ctx + 1 = {n_ctx + 1}")
    windows = ids.unfold(0, n_ctx + 1, stride)  # (n_windows, n_ctx + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def _check_logits(logits: object, targets: object) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError(
            "logits must be a floating-point tensor (..., d_vocab), got "
            f"{getattr(logits, 'dtype', type(logits).__name__)}"
        )
    if not isinstance(targets, Tensor):
        raise ValueError(f"targets must be an integer tensor, got {type(targets).__name__}")


def cross_entropy_from_formula(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over positions of -log softmax(logits)[target], with log softmax = y - logsumexp(y).

    logits: (..., d_vocab), targets: (...) integer ids.

    >>> round(float(cross_entropy_from_formula(torch.zeros(2, 4), torch.tensor([0, 3]))), 4)  # ln 4
    1.3863
    """
    _check_logits(logits, targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits (..., d_vocab) and targets (...) must agree, got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    check_targets(targets, logits.shape[-1])
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -log_probs.gather(-1, targets[..., None])[..., 0].mean()


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The training loss: mean next-token cross-entropy over all B T positions, computed in float32.

    logits (B, T, d_vocab), targets (B, T) ids in [0, d_vocab), at least one. Every position is
    scored (PyTorch's ``ignore_index=-100`` has no meaning here and is refused). Equal to
    :func:`cross_entropy_from_formula`.

    >>> round(float(lm_loss(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))), 4)  # ln 4
    1.3863
    """
    _check_logits(logits, targets)
    if logits.shape[:-1] != targets.shape or targets.dim() != 2:
        raise ValueError(
            f"logits (B, T, d_vocab) and targets (B, T) must agree, got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64 or int32 ids, got {targets.dtype}")
    check_targets(targets, logits.shape[-1])  # every target scored: no ignore_index, no empty mean
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def perplexity(loss: float | Tensor) -> float:
    """exp(mean negative log-likelihood): the size of a uniform vocabulary with the same loss.

    ``loss`` is a cross-entropy in nats: >= 0, and small enough for its exponential to be a float.

    >>> round(perplexity(math.log(50)), 6)
    50.0
    """
    if isinstance(loss, Tensor):
        if loss.numel() != 1:
            raise ValueError(
                f"loss must be a number or a one-element tensor, got shape {tuple(loss.shape)}"
            )
        loss = loss.item()
    return math.exp(check_float("loss", loss, 0.0, _MAX_EXP))


_MAX_EXP = math.log(sys.float_info.max)  # 709.78...: exp of anything larger overflows a float


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Linear warm-up to ``max_lr`` over ``warmup`` steps, then a cosine down to ``min_lr`` at
    ``total``.

    >>> [round(lr_at(s, 1.0, 2, 6), 3) for s in range(7)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146, 0.0]
    """
    check_int("step", step, lo=0)
    check_int("warmup", warmup)
    check_int("total", total)
    check_float("max_lr", max_lr, 0.0)
    check_float("min_lr", min_lr, 0.0, max_lr)  # the cosine decays: it never rises to min_lr
    if warmup < 0 or total < 1 or warmup > total:
        raise ValueError(
            f"need 0 <= warmup <= total and total >= 1, got warmup={warmup}, total={total}"
        )
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def train_step(
    model: torch.nn.Module,
    loss: Tensor,
    optimizer: torch.optim.Optimizer,
    grad_clip: float | None = None,
) -> float:
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
    if grad_clip is not None:
        check_float("grad_clip", grad_clip, 0.0, lo_open=True)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    # One device synchronisation reads both: a diverging run can keep a finite loss a step longer
    # than finite gradients.
    value, grad_norm = torch.stack(
        [loss.detach().float().reshape(()), norm.detach().float().to(loss.device)]
    ).tolist()
    if not math.isfinite(value) or not math.isfinite(grad_norm):
        raise ValueError(
            f"the loss is {value} and the gradient norm {grad_norm}: training diverged or the "
            "model holds "
            "non-finite weights; the step was not taken"
        )
    optimizer.step()
    return value


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices (2-D parameters, embeddings included), none on biases
    and LayerNorm gains (1-D). This is the book's rule (nanoGPT's too); GPT-2's own was not
    published."""
    check_float("weight_decay", weight_decay, 0.0)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# --- the loss over windows: the measurement every script and Chapter 8 make
# ------------------------


@dataclass(frozen=True)
class WindowsLoss:
    """The mean loss over a set of windows: nats per token and, when byte lengths were given, bits
    per byte."""

    nats_per_token: float
    bits_per_byte: float | None
    tokens: int  # the targets scored
    bytes: int | None  # their UTF-8 bytes


@torch.no_grad()
def windows_loss(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    byte_lengths: Tensor | list[int] | None = None,
    batch_size: int = 32,
) -> WindowsLoss:
    """The loss of ``model`` over every window (x, y), in eval mode, ``batch_size`` windows at a
    time.

    x, y: (n, T) inputs and targets (:func:`make_windows`). The total of -log P(target) over all n T
    targets is divided by their number (nats per token) and, given ``byte_lengths`` (d_vocab,), the
    UTF-8 length of each token, by ln 2 times their bytes (bits per byte, comparable across
    tokenizers). Batches run under :func:`gptlib.runtime.autocast` on the model's device (bf16 on a
    CUDA GPU that has it); the logits are scored in float32. The model's training mode is restored.

    >>> model = torch.nn.Embedding(4, 4)  # ids (n, T) -> logits (n, T, 4)
    >>> _ = torch.nn.init.zeros_(model.weight)  # uniform over 4 tokens: ln 4 nats, 2 bits per token
    >>> x, y = make_windows(list(range(4)) * 3, n_ctx=5, stride=5)
    >>> r = windows_loss(model, x, y, byte_lengths=[2, 2, 2, 2])  # 2 bytes/token: 1 bit/byte
    >>> round(r.nats_per_token, 4), round(r.bits_per_byte, 4), r.tokens, r.bytes
    (1.3863, 1.0, 10, 20)
    """
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(
            f"x and y must both have shape (n, T), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if len(x) == 0:
        raise ValueError("x holds no window")
    check_positive_int("batch_size", batch_size)
    d_vocab = getattr(getattr(model, "config", None), "d_vocab", None)
    if d_vocab is not None:
        check_ids(x, d_vocab, "x")
        check_targets(y, d_vocab, "y")
    if byte_lengths is not None:
        byte_lengths = _check_byte_lengths(byte_lengths, y)
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), batch_size):
        with autocast(dev):
            logits = model(x[i : i + batch_size].to(dev))  # (b, T, d_vocab)
        targets = y[i : i + batch_size].flatten().to(dev)  # (b T,)
        if i == 0 and d_vocab is None:  # a model without a config: the logits give d_vocab
            check_targets(y, logits.shape[-1], "y")
        total += float(F.cross_entropy(logits.float().flatten(0, 1), targets, reduction="sum"))
    model.train(was)
    n_tokens = y.numel()
    if byte_lengths is None:
        return WindowsLoss(total / n_tokens, None, n_tokens, None)
    n_bytes = int(byte_lengths[y].sum())
    return WindowsLoss(total / n_tokens, total / (math.log(2) * n_bytes), n_tokens, n_bytes)


def _check_byte_lengths(byte_lengths: Tensor | list[int], y: Tensor) -> Tensor:
    """``byte_lengths`` as a 1-D integer tensor of lengths >= 0 covering every id of ``y``, whose
    targets hold at least one byte; else ``ValueError`` naming ``byte_lengths``."""
    try:
        lengths = torch.as_tensor(byte_lengths)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"byte_lengths must be a list or tensor of ints: {e}") from None
    if lengths.dim() != 1 or lengths.dtype not in (
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    ):
        raise ValueError(
            f"byte_lengths must be a 1-D list or tensor of ints, got shape {tuple(lengths.shape)} "
            f"and dtype {lengths.dtype}"
        )
    if len(lengths) and int(lengths.min()) < 0:
        raise ValueError(f"byte_lengths must be >= 0, got {int(lengths.min())}")
    if int(y.max()) >= len(lengths):
        raise ValueError(
            f"byte_lengths must give the length of every token id in y, got {len(lengths)} lengths "
            f"for ids up to {int(y.max())}"
        )
    if int(lengths[y].sum()) == 0:
        raise ValueError(
            "byte_lengths gives the targets 0 bytes in all: bits per byte are undefined"
        )
    return lengths
