"""Chapter 5: the transformer block — LayerNorm, residual connections, and three block forms.

pre-LN (GPT-2/3):   Y = X + Attn(LN_1(X)),   Z = Y + MLP(LN_2(Y))
post-LN (2017):     Y = LN_1(X + Attn(X)),   Z = LN_2(Y + MLP(Y))
parallel:           Z = X + Attn(LN_1(X)) + MLP(LN_1(X))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .mlp import ACTIVATIONS, MLP

__all__ = ["layer_norm", "LayerNorm", "BLOCK_KINDS", "FUSED_ACTIVATIONS", "gelu_tanh_fused", "Block"]

BLOCK_KINDS = ("pre_ln", "post_ln", "parallel")


def gelu_tanh_fused(x: Tensor) -> Tensor:
    """GELU_tanh by PyTorch's kernel, ``F.gelu(x, approximate="tanh")``: :func:`gptlib.mlp.gelu_tanh`
    up to float rounding.

    >>> x = torch.linspace(-6, 6, 1001)
    >>> float((gelu_tanh_fused(x) - ACTIVATIONS["gelu_tanh"](x)).abs().max()) < 1e-6
    True
    """
    return F.gelu(x, approximate="tanh")


# The activations of gptlib.mlp as PyTorch's fused kernels: the same functions, evaluated in one
# pass forward and one backward instead of a chain of element-wise operations (GELU_tanh is seven).
# They agree with the formulas to float rounding (a few ulps; Chapter 5 and the tests check).
FUSED_ACTIVATIONS = {"gelu_tanh": gelu_tanh_fused, "gelu": F.gelu, "relu": F.relu}


def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float = 1e-5) -> Tensor:
    """LayerNorm of each row: (x - mean) / sqrt(var + eps) * w + b, with the biased variance.

    >>> layer_norm(torch.tensor([[1.0, 3.0]]), torch.ones(2), torch.zeros(2), eps=0.0)
    tensor([[-1.,  1.]])
    """
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased: divide by d, not d - 1
    y = (x - mean) / torch.sqrt(var + eps) * w
    return y if b is None else y + b


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension with gain ``w`` and bias ``b`` (d_model,)."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {d_model}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.d_model, self.eps = d_model, eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # The fused kernel computes exactly layer_norm(x, w, b, eps); Chapter 5 checks it.
        return F.layer_norm(x, (self.d_model,), self.w, self.b, self.eps)


class Block(nn.Module):
    """One transformer block of kind ``pre_ln`` (GPT-2/3), ``post_ln`` or ``parallel``.

    Sub-layers: ``ln_1``, ``attn`` (:class:`MultiHeadAttention`), ``ln_2`` (not in a parallel
    block), ``mlp`` (:class:`MLP`). With ``dropout`` p > 0, training drops entries of the attention
    pattern, of the attention output and of the MLP output with probability p (as GPT-2 does).
    ``layer`` is the block's index in the stack, which its attention layer uses in a :class:`KVCache`.
    ``fused_activation`` (default) evaluates the MLP's activation with PyTorch's fused kernel
    (:data:`FUSED_ACTIVATIONS`), which is faster and equal to the formula up to float rounding;
    ``False`` keeps the formula of :mod:`gptlib.mlp`.

    >>> blk = Block(8, 2, 32).eval()
    >>> X = torch.randn(1, 3, 8)  # (B, T, d_model)
    >>> Y = X + blk.attn(blk.ln_1(X))
    >>> torch.allclose(blk(X), Y + blk.mlp(blk.ln_2(Y)))
    True
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_mlp: int,
        *,
        d_head: int | None = None,
        kind: str = "pre_ln",
        dropout: float = 0.0,
        bias: bool = True,
        activation: str = "gelu_tanh",
        ln_eps: float = 1e-5,
        fused_activation: bool = True,
        layer: int = 0,
    ):
        super().__init__()
        if kind not in BLOCK_KINDS:
            raise ValueError(f"kind must be one of {BLOCK_KINDS}, got {kind!r}")
        self.kind = kind
        self.ln_1 = LayerNorm(d_model, ln_eps, bias)
        self.attn = MultiHeadAttention(d_model, n_heads, d_head, bias=bias, dropout=dropout, layer=layer)
        self.ln_2 = LayerNorm(d_model, ln_eps, bias) if kind != "parallel" else None
        self.mlp = MLP(d_model, d_mlp, activation, bias)
        if fused_activation:
            self.mlp.phi = FUSED_ACTIVATIONS[activation]  # same function, one fused kernel
        self.mlp_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model); ``cache`` is passed to the attention layer."""
        if self.kind == "pre_ln":
            y = x + self.attn(self.ln_1(x), cache)  # (B, T, d_model)
            return y + self.mlp_drop(self.mlp(self.ln_2(y)))
        if self.kind == "post_ln":
            y = self.ln_1(x + self.attn(x, cache))
            return self.ln_2(y + self.mlp_drop(self.mlp(y)))
        h = self.ln_1(x)  # parallel
        return x + self.attn(h, cache) + self.mlp_drop(self.mlp(h))
