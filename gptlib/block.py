"""Chapter 5: the transformer block — LayerNorm, residual connections, and three block forms.

pre-LN (GPT-2/3):   Y = X + Attn(LN_1(X)),   Z = Y + MLP(LN_2(Y))
post-LN (2017):     Y = LN_1(X + Attn(X)),   Z = LN_2(Y + MLP(Y))
parallel:           Z = X + Attn(LN_1(X)) + MLP(LN_1(X))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .config import BLOCK_KINDS, GPTConfig
from .hooks import HookPoint
from .kvcache import KVCache
from .mlp import MLP
from .runtime import check_float, check_positive_int

__all__ = ["layer_norm", "LayerNorm", "BLOCK_KINDS", "Block"]


def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float = 1e-5) -> Tensor:
    """LayerNorm of each row: (x - mean) / sqrt(var + eps) * w + b, with the biased variance.

    >>> layer_norm(torch.tensor([[1.0, 3.0]]), torch.ones(2), torch.zeros(2), eps=0.0)
    tensor([[-1.,  1.]])
    """
    eps = check_float("eps", eps, 0.0)
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased: divide by d, not d - 1
    y = (x - mean) / torch.sqrt(var + eps) * w
    return y if b is None else y + b


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension with gain ``w`` and bias ``b`` (d_model,); ``eps`` finite,
    >= 0."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        check_positive_int("d_model", d_model)
        if not isinstance(bias, bool):
            raise ValueError(f"bias must be True or False, got {bias!r}")
        self.d_model, self.eps = d_model, check_float("eps", eps, 0.0)
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # The fused kernel computes exactly layer_norm(x, w, b, eps); Chapter 5 checks it.
        return F.layer_norm(x, (self.d_model,), self.w, self.b, self.eps)


class Block(nn.Module):
    """One transformer block of the kind ``config.block``: ``pre_ln`` (GPT-2/3), ``post_ln`` or
    ``parallel``.

    Sub-layers: ``ln_1``, ``attn`` (:class:`MultiHeadAttention`), ``ln_2`` (not in a parallel
    block), ``mlp`` (:class:`MLP`; none with ``config.attn_only``). With ``config.dropout`` p > 0,
    training drops entries of the attention pattern, of the attention output and of the MLP output
    with probability p (as GPT-2 does). ``layer`` is the block's index in the stack, which its
    attention layer uses in a :class:`KVCache`. Attention and MLP run their fused kernels; setting
    ``blk.attn.fused`` or ``blk.mlp.fused`` to ``False`` selects the formulas of Chapters 3 and 4.
    ``hook_resid`` (a :class:`~gptlib.hooks.HookPoint`) sees the block's output (the residual
    stream).

    >>> blk = Block(GPTConfig(d_model=8, n_heads=2, d_mlp=32)).eval()
    >>> X = torch.randn(1, 3, 8)  # (B, T, d_model)
    >>> Y = X + blk.attn(blk.ln_1(X))
    >>> torch.allclose(blk(X), Y + blk.mlp(blk.ln_2(Y)))
    True
    """

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        c = config
        self.kind = c.block
        self.ln_1 = LayerNorm(c.d_model, c.ln_eps, c.bias)
        self.attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.d_head, bias=c.bias, dropout=c.dropout, layer=layer
        )
        self.ln_2 = LayerNorm(c.d_model, c.ln_eps, c.bias) if c.block != "parallel" else None
        self.mlp = MLP(c.d_model, c.d_mlp, c.activation, c.bias)
        self.mlp_drop = nn.Dropout(c.dropout)
        if c.attn_only:  # no MLP sub-layer: Z = X + Attn(LN_1(X)) (Chapter 8's induction heads)
            self.ln_2 = self.mlp = None
        self.hook_resid = HookPoint()  # (B, T, d_model)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model); ``cache`` is passed to the attention layer."""
        return self.hook_resid(self._sublayers(x, cache))

    def _sublayers(self, x: Tensor, cache: KVCache | None) -> Tensor:
        if self.kind == "pre_ln":
            y = x + self.attn(self.ln_1(x), cache)  # (B, T, d_model)
            return y if self.mlp is None else y + self.mlp_drop(self.mlp(self.ln_2(y)))
        if self.kind == "post_ln":
            y = self.ln_1(x + self.attn(x, cache))
            return self.ln_2(y + self.mlp_drop(self.mlp(y)))
        h = self.ln_1(x)  # parallel
        return x + self.attn(h, cache) + self.mlp_drop(self.mlp(h))
