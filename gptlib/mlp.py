"""Chapter 3: feed-forward networks — activations and the position-wise MLP.

The MLP of a transformer block is two affine maps with a component-wise activation between:
MLP(X) = phi(X W_in + b_in) W_out + b_out, applied to each row (position) of X independently.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

__all__ = ["relu", "gelu", "gelu_tanh", "ACTIVATIONS", "MLP"]


def relu(x: Tensor) -> Tensor:
    """ReLU(x) = max(x, 0), component-wise (on x's own device and dtype).

    >>> relu(torch.tensor([-1.0, 0.0, 2.0]))
    tensor([0., 0., 2.])
    """
    return torch.clamp_min(x, 0)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU, x * Phi(x) with Phi the standard normal CDF: x/2 * (1 + erf(x/sqrt 2)).

    >>> round(float(gelu(torch.tensor(1.0))), 4)
    0.8413
    """
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (HF's ``gelu_new``).

    >>> round(float(gelu_tanh(torch.tensor(1.0))), 4)
    0.8412
    """
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


class MLP(nn.Module):
    """Position-wise feed-forward layer: X -> phi(X W_in + b_in) W_out + b_out.

    Shapes: W_in (d_model, d_mlp), b_in (d_mlp,), W_out (d_mlp, d_model), b_out (d_model,).
    """

    def __init__(self, d_model: int, d_mlp: int, activation: str = "gelu_tanh", bias: bool = True):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {d_model}")
        if d_mlp < 1:
            raise ValueError(f"d_mlp must be >= 1, got {d_mlp}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.d_model, self.d_mlp, self.activation = d_model, d_mlp, activation
        self.phi = ACTIVATIONS[activation]
        self.W_in = nn.Parameter(torch.empty(d_model, d_mlp))
        self.W_out = nn.Parameter(torch.empty(d_mlp, d_model))
        self.b_in = nn.Parameter(torch.zeros(d_mlp)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(d_model)) if bias else None
        nn.init.normal_(self.W_in, std=0.02)
        nn.init.normal_(self.W_out, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must end in d_model={self.d_model}, got shape {tuple(x.shape)}")
        h = x @ self.W_in  # (B, T, d_mlp): pre-activations
        if self.b_in is not None:
            h = h + self.b_in
        h = self.phi(h)  # (B, T, d_mlp): activations
        y = h @ self.W_out  # (B, T, d_model)
        if self.b_out is not None:
            y = y + self.b_out
        return y
