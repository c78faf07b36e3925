"""Chapter 11: training on one device as it is done at scale — memory, precision, accumulation.

    model state       16 bytes per parameter for AdamW in mixed precision:
                      bf16 weights 2 + bf16 gradients 2 + fp32 master weights 4 + two fp32 moments 8
    activations       per pre-LN block, the tensors autograd keeps for the backward pass:
                      B T (4 d_model + 4 d_attn + 2 d_mlp + n_heads + 4) numbers (fused attention)
    accumulation      sum over n micro-batches of grad(L_j / n) = grad of the large batch's mean
    loss
    checkpointing     keep only each block's input; recompute the rest during the backward pass
    live memory       the bytes a computation holds at each moment, forward and backward (LiveBytes)
    loss scaling      fp16 gradients below 2^-24 round to 0; multiply the loss by S, divide grads by
    S
    ZeRO 1 / 2 / 3    shard optimiser state / + gradients / + weights over R data-parallel ranks

N is the number of parameters (as in 6 N n_tok), R the world size, the number of devices a model
state is sharded over.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from .attention import d_head_of
from .runtime import check_float, check_int, check_positive_int
from .training import lm_loss

__all__ = [
    "adamw_bytes_per_parameter",
    "tensor_bytes",
    "model_state_bytes",
    "master_weights_step",
    "activation_elements",
    "saved_tensor_bytes",
    "LiveBytes",
    "accumulate_gradients",
    "checkpointed_logits",
    "backward_turn_peaks",
    "unit_roundoff",
    "relative_rounding_error",
    "amp_gradients",
    "ZERO_STAGES",
    "zero_bytes_per_device",
]

# =============================================================================================
# Bytes per parameter
# =============================================================================================


def adamw_bytes_per_parameter(layout: str = "mixed") -> dict[str, int]:
    """What AdamW keeps per parameter, in bytes, for two ways of training.

    ``"mixed"`` (ZeRO's accounting, Megatron's layout): bf16 weights and gradients for the
    forward and backward passes, an fp32 master copy of the weights that the update is applied
    to, and Adam's two fp32 moments. ``"fp32"``: everything in fp32, no master copy (also what
    ``torch.autocast`` keeps between steps: it casts the fp32 weights to bf16 on the fly).

    >>> d = adamw_bytes_per_parameter("mixed"); d, sum(d.values())
    ({'weights': 2, 'gradients': 2, 'master weights': 4, 'moments': 8}, 16)
    >>> sum(adamw_bytes_per_parameter("fp32").values())
    16
    """
    if layout == "mixed":
        return {"weights": 2, "gradients": 2, "master weights": 4, "moments": 8}
    if layout == "fp32":
        return {"weights": 4, "gradients": 4, "master weights": 0, "moments": 8}
    raise ValueError(f"layout must be 'mixed' or 'fp32', got {layout!r}")


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``: views of one storage count once.

    >>> x = torch.zeros(10)
    >>> tensor_bytes([x, x[:5], x.view(2, 5), torch.zeros(3, dtype=torch.bfloat16)])
    46
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def model_state_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None, master: Iterable[Tensor] = ()
) -> dict[str, int]:
    """Bytes held by the weights, their gradients, the optimiser's state and any master copies.

    Counted from the tensors themselves (:func:`tensor_bytes`), so it is what the training state
    really occupies; AdamW's ``step`` counters (one number per tensor) land in ``"optimizer"``.
    """
    params = list(model.parameters())
    state = (
        []
        if optimizer is None
        else [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    )
    return {
        "weights": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params),
        "master weights": tensor_bytes(master),
        "optimizer": tensor_bytes(state),
    }


@torch.no_grad()
def master_weights_step(
    model: nn.Module, master: list[Tensor], optimizer: torch.optim.Optimizer
) -> None:
    """One mixed-precision update: apply the model's low-precision gradients to its fp32 ``master``
    copies with ``optimizer``, then round the updated master weights back into the model.

    ``master`` holds fp32 leaf tensors made from ``model.parameters()`` in order, and ``optimizer``
    updates them (``torch.optim.AdamW(master, ...)``). The fp32 gradients exist only during the
    call (frameworks convert them bucket by bucket); between steps the state is 16 bytes per
    parameter.
    """
    params = list(model.parameters())
    if len(params) != len(master):
        raise ValueError(
            f"master must hold one tensor per parameter ({len(params)}), got {len(master)}"
        )
    for p, m in zip(params, master):
        if m.dtype != torch.float32 or m.shape != p.shape:
            raise ValueError(
                f"master must hold fp32 copies of the parameters, got {m.dtype} {tuple(m.shape)} "
                f"for {tuple(p.shape)}"
            )
    for p, m in zip(params, master):
        m.grad = None if p.grad is None else p.grad.float()
    optimizer.step()
    for p, m in zip(params, master):
        m.grad = None  # free the transient fp32 gradients
        p.copy_(m)  # round to the model's dtype (bf16)


# =============================================================================================
# Activation memory
# =============================================================================================


def activation_elements(
    B: int,
    T: int,
    d_model: int,
    n_heads: int,
    d_mlp: int | None = None,
    d_head: int | None = None,
    attention: str = "fused",
) -> int:
    """Numbers that autograd keeps for the backward pass of one pre-LN block of gptlib (no dropout).

    Per token: the block input and LN_1's output (2 d_model), the products Q, K, V (3 d_attn), the
    attention output, which W_O multiplies (d_attn), the residual Y and LN_2's output (2 d_model),
    the MLP's pre-activation and activation (2 d_mlp), and each LayerNorm's mean and 1/std (4).
    The fused kernel (``scaled_dot_product_attention``) keeps one log-sum-exp per head (n_heads)
    and recomputes the pattern in the backward pass; the readable path (``fused=False``, which
    forms the pattern as in Chapter 4) keeps the scores, exp(scores - max) and the pattern
    (3 n_heads T per token), a max and a sum per row (2 n_heads), and copies of Q, K, V in the
    heads' layout (3 d_attn) instead of the products:

        fused:   B T (4 d_model + 4 d_attn + 2 d_mlp + n_heads + 4)
        pattern: B T (4 d_model + 4 d_attn + 2 d_mlp + 4) + B n_heads (3 T^2 + 2 T)

    (d_attn = n_heads d_head.) The parameters are not activations and are not counted.

    >>> activation_elements(1, 1, 4, 1, d_mlp=16)  # 4*4 + 4*4 + 2*16 + 1 + 4
    69
    """
    for name, v in (("B", B), ("T", T)):
        check_positive_int(name, v)
    d_head = d_head_of(d_model, n_heads, d_head)
    d_mlp = 4 * d_model if d_mlp is None else d_mlp
    check_positive_int("d_mlp", d_mlp)
    d_attn = n_heads * d_head
    if attention == "fused":
        return B * T * (4 * d_model + 4 * d_attn + 2 * d_mlp + n_heads + 4)
    if attention == "pattern":
        return B * T * (4 * d_model + 4 * d_attn + 2 * d_mlp + 4) + B * n_heads * (
            3 * T * T + 2 * T
        )
    raise ValueError(f"attention must be 'fused' or 'pattern', got {attention!r}")


def saved_tensor_bytes(
    fn: Callable[..., Tensor], *args, exclude: Iterable[Tensor] = (), **kwargs
) -> tuple[Tensor, int]:
    """Run ``fn(*args, **kwargs)`` and count the bytes of the tensors autograd saves for backward.

    Every tensor an operation stores for its backward pass goes through
    ``torch.autograd.graph.saved_tensors_hooks``; they are counted by distinct storage
    (:func:`tensor_bytes`), leaving out the storages of ``exclude`` (pass the parameters: they
    exist anyway). Returns (the output, the bytes).

    >>> x = torch.ones(1000, requires_grad=True)
    >>> _, n = saved_tensor_bytes(lambda t: t.exp().sum(), x)  # exp keeps its result: 1000 floats
    >>> n
    4000
    """
    saved: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    return out, tensor_bytes(t for t in saved if t.untyped_storage().data_ptr() not in skip)


class LiveBytes(TorchDispatchMode):
    """Counts, while active, the bytes of the storages that operations create and that are still
    alive.

    Every operation (forward, backward, recomputation) passes through PyTorch's dispatcher, and
    this mode sees its outputs: a new storage is added to ``now`` and subtracted when Python's
    garbage collector frees it. ``peak`` is the largest ``now`` since the start or the last
    :meth:`reset_peak`. A storage that existed before is counted too if an operation returns it
    (a view, an in-place update), unless it is in ``exclude``: pass the parameters and their
    gradients. What it measures is the memory a device allocator would hold for these tensors,
    without its rounding to blocks.

    >>> with LiveBytes() as mem:
    ...     a = torch.ones(1000)      # 4000 bytes
    ...     b = a.exp()               # 4000 more
    ...     del a                     # freed
    >>> mem.now, mem.peak
    (4000, 8000)
    """

    def __init__(self, exclude: Iterable[Tensor] = ()):
        super().__init__()
        self._skip = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
        self._live: dict[int, int] = {}
        self.now = self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self._live.pop(key, 0)

    def reset_peak(self) -> int:
        """Starts a new peak at the current bytes; returns the peak that ended."""
        old, self.peak = self.peak, self.now
        return old

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in self._live or key in self._skip or storage.nbytes() == 0:
                    continue
                self._live[key] = storage.nbytes()
                self.now += storage.nbytes()
                weakref.finalize(storage, self._free, key)  # runs when the storage is freed
        self.peak = max(self.peak, self.now)
        return out


# =============================================================================================
# Gradient accumulation and activation checkpointing
# =============================================================================================


def accumulate_gradients(
    model: nn.Module, ids: Tensor, targets: Tensor, n_micro: int, forward: Callable | None = None
) -> float:
    """Add to the model's ``.grad`` the gradient of the batch's mean loss, ``n_micro`` micro-batches
    at a time.

    With equal micro-batches, L = (1/n) sum_j L_j, so grad L = sum_j grad(L_j / n): each micro-batch
    runs forward and backward on its own (its activations freed before the next) and the
    gradients add up in ``.grad``. Returns the batch's mean loss. ``forward`` maps ids to logits
    (default: ``model``). Zero the gradients before, step the optimiser after.
    """
    check_positive_int("n_micro", n_micro)
    if ids.shape[0] % n_micro:
        raise ValueError(f"n_micro={n_micro} must divide the batch size {ids.shape[0]}")
    forward = model if forward is None else forward
    total = 0.0
    for x, y in zip(ids.chunk(n_micro), targets.chunk(n_micro)):  # (B / n_micro, T) each
        loss = lm_loss(forward(x), y) / n_micro
        loss.backward()
        total += loss.item()
    return total


def checkpointed_logits(model: nn.Module, ids: Tensor) -> Tensor:
    """A GPT's logits with every block under ``torch.utils.checkpoint``: the forward pass keeps only
    each block's input, and the backward pass recomputes the block before differentiating it.

    Equal to ``model(ids)``, with the same gradients; saved memory per block falls from
    :func:`activation_elements` to B T d_model numbers, for about one extra forward pass.
    """
    x = model.input_stream(ids)  # (B, T, d_model)
    for blk in model.blocks:
        x = checkpoint(blk, x, use_reentrant=False)  # (B, T, d_model); RNG state kept for dropout
    return model.read_out(x)  # (B, T, d_vocab)


def backward_turn_peaks(
    model: nn.Module, ids: Tensor, targets: Tensor, checkpointed: bool = False
) -> tuple[int, list[int]]:
    """The bytes held at the end of a GPT's forward pass, and the peak of each turn of its backward
    pass.

    Turns come in the order the backward pass takes them: the read-out (LN_f, W_U and the loss),
    then block L, ..., block 1; a turn starts when the gradient of its output is ready (a tensor
    hook). Bytes are those of :class:`LiveBytes`, parameters and gradients left out (gradients
    are allocated first, so the backward pass accumulates into them in place). With
    ``checkpointed``, every block runs under ``torch.utils.checkpoint``, as in
    :func:`checkpointed_logits`.
    """
    params = list(model.parameters())
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    turns: list[int] = []
    with LiveBytes(exclude=params + [p.grad for p in params]) as mem:
        x = model.input_stream(ids)  # (B, T, d_model)
        for blk in model.blocks:
            x = (
                checkpoint(blk, x, use_reentrant=False) if checkpointed else blk(x)
            )  # (B, T, d_model)
            x.register_hook(
                lambda grad: turns.append(mem.reset_peak())
            )  # the turn of the block above ends
        loss = lm_loss(model.read_out(x), targets)
        forward = mem.now
        mem.reset_peak()
        loss.backward()
        turns.append(mem.reset_peak())
    return forward, turns


# =============================================================================================
# Reduced precision
# =============================================================================================


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of rounding a (normal) real number to ``dtype``: 2^-(p+1) for p
    stored mantissa bits, half of ``torch.finfo(dtype).eps``.

    >>> [unit_roundoff(t) for t in (torch.bfloat16, torch.float16)]
    [0.00390625, 0.00048828125]
    >>> unit_roundoff(torch.float32) == 2**-24
    True
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return torch.finfo(dtype).eps / 2


def relative_rounding_error(x: Tensor, dtype: torch.dtype) -> float:
    """The largest |round(x) - x| / |x| over the non-zero entries of x after a round trip through
    ``dtype``.

    >>> x = torch.tensor([1.0, 2.0, 0.5])  # powers of two are exact
    >>> relative_rounding_error(x, torch.bfloat16)
    0.0
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if not isinstance(x, Tensor) or not bool(torch.isfinite(x).all()):
        raise ValueError("x must be a tensor of finite numbers")
    x = x.double()
    nz = x[x != 0]
    if nz.numel() == 0:
        raise ValueError("x must have a non-zero entry")
    return float(((nz.to(dtype).double() - nz).abs() / nz.abs()).max())


def amp_gradients(
    module: nn.Module,
    loss_fn: Callable[[], Tensor],
    dtype: torch.dtype | None,
    loss_scale: float | None = None,
) -> dict[str, Tensor]:
    """The gradients of ``loss_fn()`` (which calls ``module``) computed under
    ``torch.autocast(dtype)``.

    ``dtype=None`` computes in fp32. With ``loss_scale``, the backward pass runs on
    ``torch.amp.GradScaler``'s scaled loss S L and the gradients are unscaled (divided by S, in
    fp32) afterwards, as in training; a gradient that overflowed comes back as inf or nan.
    """
    if loss_scale is not None:
        check_float("loss_scale", loss_scale, 0.0, lo_open=True)
    device_type = next(module.parameters()).device.type
    module.zero_grad(set_to_none=True)
    if dtype is None:
        loss = loss_fn()
    else:
        with torch.autocast(device_type=device_type, dtype=dtype):
            loss = loss_fn()
    if loss_scale is None:
        loss.backward()
    else:
        scaler = torch.amp.GradScaler(device_type, init_scale=loss_scale)
        scaler.scale(loss).backward()
        scaler.unscale_(torch.optim.SGD(module.parameters(), lr=0.0))  # divides every .grad by S
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


# =============================================================================================
# ZeRO: sharding the model state over R data-parallel devices
# =============================================================================================

ZERO_STAGES = {
    0: "replicated (DDP)",
    1: "optimizer state sharded",
    2: "+ gradients sharded",
    3: "+ weights sharded (FSDP)",
}


def zero_bytes_per_device(
    n_params: float,
    n_devices: int,
    stage: int,
    weight_bytes: int = 2,
    grad_bytes: int = 2,
    optimizer_bytes: int = 12,
) -> float:
    """Model-state bytes on each of ``n_devices`` data-parallel devices under ZeRO ``stage``.

    With N parameters and K = ``optimizer_bytes`` per parameter (fp32 master weights + two
    moments = 12), stage 0 keeps (2 + 2 + K) N on every device; stage 1 divides the K N by R,
    stage 2 also the gradients, stage 3 also the weights. Figure 1 of the ZeRO paper
    (N = 7.5e9, R = 64):

    >>> [round(zero_bytes_per_device(7.5e9, 64, s) / 1e9, 1) for s in range(4)]
    [120.0, 31.4, 16.6, 1.9]
    """
    check_float("n_params", n_params, 0.0, lo_open=True)
    check_positive_int("n_devices", n_devices)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {sorted(ZERO_STAGES)}, got {stage!r}")
    w, g, k = (
        check_int(name, v, lo=0)
        for name, v in (
            ("weight_bytes", weight_bytes),
            ("grad_bytes", grad_bytes),
            ("optimizer_bytes", optimizer_bytes),
        )
    )
    sharded = {0: 0, 1: k, 2: g + k, 3: w + g + k}[stage]
    return n_params * ((w + g + k - sharded) + sharded / n_devices)
