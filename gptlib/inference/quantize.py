"""Chapter 13.3: quantization as a map from float weights to a few bits, and back.

Two maps, each applied along the last dimension of a tensor, each followed by its inverse so that
the result is the float tensor a quantized model computes with:

* **absmax, per row** (LLM.int8's vector-wise scale): delta = max_j |w_j| / (2^(b-1) - 1) for the
  row, q = round(w / delta) in {-(2^(b-1) - 1), ..., 2^(b-1) - 1}, w ~ delta q. Int8 at b = 8.
* **blockwise with a scale and a minimum** (GGUF's Q4_1 at b = 4): blocks of 32 numbers,
  delta = (max - min) / (2^b - 1), q = round((w - min) / delta) in {0, ..., 2^b - 1}, delta and min
  stored as float16, w ~ delta q + min.

Rounding to the nearest level moves a number by at most delta / 2 (:func:`error_bound` adds what
the float16 storage of delta and min costs). The uniform-noise model treats the error of each
weight as uniform on [-delta/2, delta/2] and independent: variance delta^2 / 12, and for a product
X W the error X E has variance sum_k x_k^2 delta_k^2 / 12 (:func:`product_noise_variance`).
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from ..runtime import all_finite, check_finite_weights, check_int

__all__ = [
    "Quantized",
    "absmax_quantize",
    "blockwise_codes",
    "blockwise_quantize",
    "error_bound",
    "q4_1_pack",
    "product_noise_variance",
    "quantized_bytes",
    "quantize_model",
]

F16_UNIT = 2.0**-11  # float16 rounds a normal number x to within |x| 2^-11
F16_SUBNORMAL = 2.0**-25  # ... and a subnormal one to within 2^-25


class Quantized(NamedTuple):
    """A tensor after quantization and back: ``values`` (what the model computes with), ``step``
    (delta of each number, the same shape), ``minimum`` (the block's minimum for blockwise maps,
    else zeros) and ``codes`` (the integers q, as int64)."""

    values: Tensor
    step: Tensor
    minimum: Tensor
    codes: Tensor


F16_MAX = 65504.0  # the largest finite float16


def _check_float(x: Tensor) -> Tensor:
    """x (detached) as float32, after checking that it is a floating-point tensor with >= 1 dim,
    finite, and within float32's range (the maps compute in float32)."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError(
            "x must be a floating-point tensor with >= 1 dim, got "
            f"{getattr(x, 'dtype', type(x).__name__)}"
        )
    if x.device.type == "meta":
        raise ValueError("x is on the meta device: it has no values to quantize")
    if not all_finite([x]):
        raise ValueError("x must be finite")
    x32 = x.detach().float()  # x itself when float32; float16 and bfloat16 fit in float32
    if x.dtype.itemsize > 4 and not all_finite([x32]):
        raise ValueError(
            f"x must lie within float32's range (|x| <= 3.4e38), got |x| up to "
            f"{float(x.detach().abs().max()):.3g}"
        )
    return x32


def _check_result(values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values`` cast to ``dtype``, refused if the cast makes an infinity (a value rounded past
    the dtype's largest number)."""
    out = values.to(dtype)
    if not all_finite([out]):
        raise ValueError(
            f"x's quantized values do not fit in its dtype {dtype}: they round past "
            f"{torch.finfo(dtype).max:.6g}"
        )
    return out


def absmax_quantize(x: Tensor, bits: int = 8) -> Quantized:
    """Symmetric quantization of each row (last dimension) with its own scale delta = max|x| / L,
    L = 2^(bits-1) - 1: q = round(x / delta) in {-L, ..., L}, values delta q (float32 delta).

    >>> r = absmax_quantize(torch.tensor([[1.0, -0.5, 0.26], [0.0, 0.0, 0.0]]), bits=3)  # L = 3
    >>> r.codes.tolist(), r.values.tolist()[0]
    ([[3, -2, 1], [0, 0, 0]], [1.0, -0.6666666865348816, 0.3333333432674408])
    """
    x32 = _check_float(x)
    if x.shape[-1] < 1:
        raise ValueError(f"x's rows must hold >= 1 number, got shape {tuple(x.shape)}")
    bits = check_int("bits", bits, lo=2, hi=16)
    L = 2 ** (bits - 1) - 1
    step = x32.abs().amax(dim=-1, keepdim=True) / L  # (..., 1)
    q = torch.round(x32 / torch.where(step > 0, step, 1.0)).clamp(-L, L)
    step = step.expand_as(x32)
    return Quantized(_check_result(step * q, x.dtype), step, torch.zeros_like(x32), q.long())


def blockwise_codes(x: Tensor, bits: int = 4, block: int = 32) -> tuple[Tensor, Tensor, Tensor]:
    """The stored form of blockwise quantization along the last dimension: codes q (..., n_blocks,
    block) in {0, ..., 2^bits - 1}, and delta and min (..., n_blocks, 1) as float16. q is computed
    as llama.cpp does, trunc((x - min) / delta + 1/2) with delta and min in float32 (at bits = 4
    these are GGUF's Q4_1 bytes, :func:`q4_1_pack`).

    >>> q, d, m = blockwise_codes(torch.arange(4.0), bits=2, block=4)
    >>> q.tolist(), d.item(), m.item()
    ([[0, 1, 2, 3]], 1.0, 0.0)
    """
    x32 = _check_float(x)
    bits, block = check_int("bits", bits, lo=1, hi=8), check_int("block", block, lo=1)
    if x.shape[-1] % block:
        raise ValueError(
            f"x's last dimension must be a multiple of block={block}, got shape {tuple(x.shape)}"
        )
    blocks = x32.unflatten(-1, (-1, block))  # (..., n_blocks, block)
    lo, hi = torch.aminmax(blocks, dim=-1, keepdim=True)  # (..., n_blocks, 1) each
    d = (hi - lo) / (2**bits - 1)
    d16, lo16 = d.half(), lo.half()
    if not bool(torch.isfinite(d16).all() & torch.isfinite(lo16).all()):
        raise ValueError(
            f"x has a block whose scale (max - min) / {2**bits - 1} or minimum float16 cannot "
            f"hold (|.| <= {F16_MAX:g}): the largest are {float(d.abs().max()):.3g} and "
            f"{float(lo.abs().max()):.3g}"
        )
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = (blocks - lo).mul_(inv).add_(0.5).trunc_().clamp_(0, 2**bits - 1)  # in place: one copy
    return q.long(), d16, lo16


def blockwise_quantize(x: Tensor, bits: int = 4, block: int = 32) -> Quantized:
    """Blockwise quantization with a scale and a minimum and back: values delta q + min, delta and
    min read from float16 as the file stores them. At bits = 4, block = 32 this is Q4_1.

    >>> r = blockwise_quantize(torch.tensor([0.0, 0.1, 0.5, 3.0]), bits=2, block=4)  # delta = 1
    >>> r.values.tolist(), r.step.tolist()
    ([0.0, 0.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0])
    """
    q, d, lo = blockwise_codes(x, bits, block)
    d, lo = d.float().expand(q.shape), lo.float().expand(q.shape)
    values = (d * q + lo).flatten(-2)
    return Quantized(_check_result(values, x.dtype), d.flatten(-2), lo.flatten(-2), q.flatten(-2))


def error_bound(r: Quantized, bits: int, blockwise: bool) -> Tensor:
    """A bound on |quantized - x| for every number: delta / 2, plus, for a blockwise map, what
    storing
    delta and min in float16 can cost, 2^-11 (|min| + (2^b - 1) delta) + 2^-25 (1 + (2^b - 1)) (the
    last term for subnormal float16 numbers). An absmax scale is kept in float32: delta / 2 plus
    float32's rounding of x / delta and of delta q, 2^-22 L delta with L = 2^(b-1) - 1 the top
    level.

    >>> x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    >>> r = blockwise_quantize(x, bits=3)
    >>> bool(((r.values - x).abs() <= error_bound(r, 3, blockwise=True)).all())
    True
    """
    if not isinstance(r, Quantized):
        raise ValueError(f"r must be a Quantized, got {type(r).__name__}")
    bits = check_int("bits", bits, lo=1, hi=16)
    if not isinstance(blockwise, bool):
        raise ValueError(f"blockwise must be True or False, got {blockwise!r}")
    if not blockwise:
        return r.step / 2 + 2.0**-22 * (2 ** (bits - 1) - 1) * r.step
    L = 2**bits - 1
    return r.step / 2 + F16_UNIT * (r.minimum.abs() + L * r.step) + F16_SUBNORMAL * (1 + L)


def q4_1_pack(x: Tensor) -> bytes:
    """GGUF's Q4_1 bytes for x (a multiple of 32 numbers in its last dimension): per block of 32,
    delta and min as float16, then 16 bytes, byte i holding q_i in its low and q_(i+16) in its
    high four bits (20 bytes per 32 numbers, 5 bits per weight).

    >>> len(q4_1_pack(torch.zeros(2, 32)))
    40
    """
    q, d, lo = (t.cpu() for t in blockwise_codes(x, bits=4, block=32))
    q = q.reshape(-1, 32).to(torch.uint8).numpy()
    nibbles = q[:, :16] | (q[:, 16:] << np.uint8(4))  # (n_blocks, 16)
    d16 = d.reshape(-1, 1).numpy().view(np.uint8)  # (n_blocks, 2)
    m16 = lo.reshape(-1, 1).numpy().view(np.uint8)
    return np.concatenate([d16, m16, nibbles], axis=-1).tobytes()


def product_noise_variance(X: Tensor, step: Tensor) -> Tensor:
    """The uniform-noise model's variance of the error of X W when each weight W_kj moves by an
    independent uniform error on [-delta_kj/2, delta_kj/2]: sum_k X_nk^2 delta_kj^2 / 12, (N, d_out)
    for X (N, d_in) and step (d_in, d_out).

    >>> v = product_noise_variance(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.6], [0.3]]))
    >>> round(v.item(), 6)  # (1 x 0.36 + 4 x 0.09) / 12
    0.06
    """
    for name, t in (("X", X), ("step", step)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise ValueError(
                f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}"
            )
    if X.dim() != 2 or step.dim() != 2 or X.shape[1] != step.shape[0]:
        raise ValueError(
            f"X must be (N, d_in) and step (d_in, d_out), got {tuple(X.shape)}, {tuple(step.shape)}"
        )
    if not bool(torch.isfinite(X).all()):
        raise ValueError("X must be finite")
    if not bool((torch.isfinite(step) & (step >= 0)).all()):
        raise ValueError("step must hold finite numbers >= 0 (quantization steps)")
    return (X.double() ** 2) @ (step.double() ** 2) / 12


def quantized_bytes(numel: int, rows: int, method: str, bits: int, block: int = 32) -> int:
    """Bytes a matrix of ``numel`` numbers in ``rows`` rows takes: ``"absmax"`` b bits per number
    and a float32 scale per row (the delta :func:`absmax_quantize` computes with);
    ``"blockwise"`` b bits per number and two float16 per block (GGUF's Q4_1 at b = 4).

    >>> quantized_bytes(576 * 576, 576, "blockwise", 4)  # Q4_1: 20 bytes per 32 numbers
    207360
    """
    if method not in ("absmax", "blockwise"):
        raise ValueError(f"method must be 'absmax' or 'blockwise', got {method!r}")
    numel, rows = check_int("numel", numel, lo=0), check_int("rows", rows, lo=0)
    bits = check_int("bits", bits, lo=2 if method == "absmax" else 1, hi=16)
    block = check_int("block", block, lo=1)
    if method == "absmax":
        return (numel * bits + 7) // 8 + 4 * rows
    return (numel * bits + 7) // 8 + 4 * (numel // block)


def _along_input(name: str, W: Tensor) -> Tensor:
    """W with the summed (input) index last: a weight x @ W sums over its rows, so W.T; an embedding
    table (W_E, W_pos: rows looked up, and W_U = W_E^T sums over W_E's columns) as it is."""
    return W if name.endswith(("W_E", "W_pos")) else W.T


@torch.no_grad()
def quantize_model(
    model: nn.Module, method: str, bits: int, block: int = 32
) -> tuple[nn.Module, int, int]:
    """A copy of ``model`` with every matrix quantized and back (vectors, the norms' gains and the
    biases, stay float32), blocks and rows running along the index each product sums over.
    Returns (the copy, the matrices' float32 bytes, their quantized bytes).

    >>> from gptlib.model import GPT, GPTConfig
    >>> small, before, after = quantize_model(GPT(GPTConfig.preset("tiny")), "blockwise", 4)
    >>> round(before / after, 2)  # 32 bits against 5 per number
    6.4
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if method not in ("absmax", "blockwise"):
        raise ValueError(f"method must be 'absmax' or 'blockwise', got {method!r}")
    bits = check_int(
        "bits", bits, lo=2 if method == "absmax" else 1, hi=16 if method == "absmax" else 8
    )
    block = check_int("block", block, lo=1)
    check_finite_weights(model)
    out = copy.deepcopy(model)
    before = after = 0
    for name, W in out.named_parameters():
        if W.dim() != 2:
            continue
        Wt = _along_input(name, W)
        try:
            r = (
                absmax_quantize(Wt, bits)
                if method == "absmax"
                else blockwise_quantize(Wt, bits, block)
            )
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        Wt.copy_(r.values)  # in place: Wt is a view of W
        before += 4 * W.numel()
        after += quantized_bytes(
            W.numel(), Wt.shape[0] if method == "absmax" else 0, method, bits, block
        )
    return out, before, after
