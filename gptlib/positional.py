"""Chapter 2: where a token sits — learned positions W_pos and sinusoidal encodings.

Both add a vector that depends only on the position p to the token embedding in row p:
X_0 = X W_E + PE[:T] (learned: PE = W_pos, trained; sinusoidal: a fixed matrix).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .embedding import learned_table
from .runtime import check_float, check_int, check_positive_int

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_encoding",
    "relative_rotation",
    "LearnedPositional",
    "SinusoidalPositional",
]


def _check_sizes(d_model: int, base: float) -> float:
    check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be a positive even int, got {d_model!r}")
    return check_float("base", base, 1.0, lo_open=True)


def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> Tensor:
    """The angular frequencies omega_i = base^(-2i/d_model), i = 0 … d_model/2 - 1 (float64).

    Column pair (2i, 2i+1) of the encoding turns at omega_i radians per position.

    >>> sinusoidal_frequencies(4)
    tensor([1.0000, 0.0100], dtype=torch.float64)
    """
    base = _check_sizes(d_model, base)
    i = torch.arange(d_model // 2, dtype=torch.float64)  # pair index
    return torch.exp(-(2 * i / d_model) * math.log(base))  # (d_model/2,)


def sinusoidal_encoding(
    n_ctx: int, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The sinusoidal position matrix PE of shape (n_ctx, d_model), positions counted from 0.

    With the pair index i and omega_i from :func:`sinusoidal_frequencies`:
    PE[p, 2i] = sin(p omega_i),  PE[p, 2i+1] = cos(p omega_i). Computed in float64, returned in
    ``dtype``.

    >>> sinusoidal_encoding(2, 4)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000],
            [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    check_positive_int("n_ctx", n_ctx)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    omega = sinusoidal_frequencies(d_model, base)  # (d_model/2,)
    p = torch.arange(n_ctx, dtype=torch.float64)[:, None]  # (n_ctx, 1)
    angle = p * omega[None, :]  # (n_ctx, d_model/2)
    pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1)  # (n_ctx, d_model/2, 2)
    return pe.reshape(n_ctx, d_model).to(dtype)  # (n_ctx, d_model): sin, cos, sin, cos, …


def relative_rotation(k: int, d_model: int, base: float = 10000.0) -> Tensor:
    """R_k, the (d_model, d_model) matrix with PE[p + k] = PE[p] @ R_k for every position p
    (float64).

    R_k is block-diagonal; block i rotates the pair (sin, cos) by the angle k omega_i:
    [[cos k omega_i, -sin k omega_i], [sin k omega_i, cos k omega_i]]. It does not depend on p.

    >>> relative_rotation(1, 2)
    tensor([[ 0.5403, -0.8415],
            [ 0.8415,  0.5403]], dtype=torch.float64)
    """
    k = check_int("k", k)
    angle = k * sinusoidal_frequencies(d_model, base)  # (d_model/2,)
    c, s = torch.cos(angle), torch.sin(angle)
    blocks = torch.stack(
        [torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2
    )  # (d_model/2, 2, 2)
    return torch.block_diag(*blocks)  # (d_model, d_model)


def _check_len(T: int, n_ctx: int, offset: int) -> None:
    check_int("T", T, lo=0)
    check_int("offset", offset, lo=0)
    if offset + T > n_ctx:
        raise ValueError(f"positions {offset}..{offset + T - 1} exceed n_ctx={n_ctx}")


class LearnedPositional(nn.Module):
    """Learned positions: row p of ``W_pos`` (n_ctx, d_model) is added at position p.

    ``forward(T, offset)`` returns rows offset … offset + T - 1, shape (T, d_model).
    """

    def __init__(self, n_ctx: int, d_model: int):
        super().__init__()
        self.n_ctx, self.d_model = n_ctx, d_model
        self.W_pos = learned_table("n_ctx", n_ctx, d_model, std=0.01)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_len(T, self.n_ctx, offset)
        return self.W_pos[offset : offset + T]  # (T, d_model)

    def extra_repr(self) -> str:
        return f"n_ctx={self.n_ctx}, d_model={self.d_model}"


class SinusoidalPositional(nn.Module):
    """Fixed sinusoidal positions, held in the registered buffer ``PE`` (n_ctx, d_model).

    A buffer moves with ``.to(device)`` / ``.to(dtype)`` and is listed by ``buffers()``. It is
    registered with ``persistent=False``: PE is a function of (n_ctx, d_model, base), so it is
    rebuilt on construction instead of being written into every checkpoint.
    """

    def __init__(self, n_ctx: int, d_model: int, base: float = 10000.0):
        super().__init__()
        self.n_ctx, self.d_model, self.base = n_ctx, d_model, _check_sizes(d_model, base)
        # built on the meta device (shapes only) the table has no values to compute: any
        # arithmetic on a meta tensor would import torch._dynamo (about 2 s of CPU a process)
        PE = torch.empty(n_ctx, d_model)  # (n_ctx, d_model), on the device being built on
        if not PE.is_meta:
            PE = sinusoidal_encoding(n_ctx, d_model, base).to(PE.device)
        self.register_buffer("PE", PE, persistent=False)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_len(T, self.n_ctx, offset)
        return self.PE[offset : offset + T]  # (T, d_model)

    def extra_repr(self) -> str:
        return f"n_ctx={self.n_ctx}, d_model={self.d_model}, base={self.base}"
