"""Chapter 2: where a token sits — learned positions W_pos and sinusoidal encodings.

Both add a vector depending only on the position p to the token embedding of row p.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["sinusoidal_encoding", "LearnedPositional", "SinusoidalPositional"]


def sinusoidal_encoding(n_ctx: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The sinusoidal position matrix PE of shape (n_ctx, d_model), positions counted from 0.

    For the pair index i = 0, 1, …, d_model/2 - 1 and angular frequency
    omega_i = base^(-2i/d_model):  PE[p, 2i] = sin(p omega_i),  PE[p, 2i+1] = cos(p omega_i).

    >>> sinusoidal_encoding(2, 4)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000],
            [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    if d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number, got {d_model}")
    if base <= 1:
        raise ValueError(f"base must be > 1, got {base}")
    p = torch.arange(n_ctx, dtype=torch.float64)[:, None]  # (n_ctx, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)[None, :]  # (1, d_model/2)
    angle = p * torch.exp(-(2 * i / d_model) * math.log(base))  # (n_ctx, d_model/2)
    pe = torch.empty(n_ctx, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(torch.float32)


def _check_len(T: int, n_ctx: int, offset: int) -> None:
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if offset + T > n_ctx:
        raise ValueError(f"positions {offset}..{offset + T - 1} exceed n_ctx={n_ctx}")


class LearnedPositional(nn.Module):
    """Learned positions: row p of ``W_pos`` (n_ctx, d_model) is added at position p."""

    def __init__(self, n_ctx: int, d_model: int):
        super().__init__()
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        self.n_ctx, self.d_model = n_ctx, d_model
        self.W_pos = nn.Parameter(torch.empty(n_ctx, d_model))
        nn.init.normal_(self.W_pos, std=0.01)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_len(T, self.n_ctx, offset)
        return self.W_pos[offset : offset + T]  # (T, d_model)


class SinusoidalPositional(nn.Module):
    """Fixed sinusoidal positions, held as a registered buffer so ``.to(device)`` moves them."""

    def __init__(self, n_ctx: int, d_model: int, base: float = 10000.0):
        super().__init__()
        self.n_ctx, self.d_model = n_ctx, d_model
        self.register_buffer("PE", sinusoidal_encoding(n_ctx, d_model, base), persistent=False)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_len(T, self.n_ctx, offset)
        return self.PE[offset : offset + T]  # (T, d_model)
