"""Chapter 4: attention — the masked row softmax, heads, multi-head layers and a KV cache.

For one head h with per-head weights W_Q^h, W_K^h, W_V^h (d_model, d_head) and W_O^h
(d_head, d_model), acting on the rows of X (T, d_model):

    A^h = softmax*( X W_Q^h (X W_K^h)^T / sqrt(d_head) )        (T, T), causally masked rows
    h(X) = A^h X W_V^h W_O^h = A^h X W_OV^h                      (T, d_model)

and the layer is the sum of its heads, which equals concat_h(A^h X W_V^h) W_O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hooks import HookPoint

__all__ = [
    "softmax",
    "causal_mask",
    "attention_pattern",
    "attention",
    "head_pattern",
    "head_output",
    "KVCache",
    "MultiHeadAttention",
]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax along ``dim`` (rows by default): exp(x - max) / sum exp(x - max).

    Entries equal to -inf get probability 0; a row that is entirely -inf is an error upstream.

    >>> softmax(torch.tensor([[1000.0, 1000.0], [0.0, float("-inf")]]))
    tensor([[0.5000, 0.5000],
            [1.0000, 0.0000]])
    """
    m = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)


def causal_mask(T: int, T_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Additive causal mask M of shape (T, T_k): 0 where query i may see key j, -inf above.

    The T queries are the *last* T of the T_k positions (T_k >= T; T_k > T with a KV cache),
    so query i sits at position i + T_k - T and sees keys j <= i + T_k - T.

    >>> causal_mask(3)
    tensor([[0., -inf, -inf],
            [0., 0., -inf],
            [0., 0., 0.]])
    """
    T_k = T if T_k is None else T_k
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if T_k < T:
        raise ValueError(f"T_k must be >= T={T}, got {T_k}")
    i = torch.arange(T, device=device)[:, None] + (T_k - T)
    j = torch.arange(T_k, device=device)[None, :]
    return torch.zeros(T, T_k, device=device).masked_fill(j > i, float("-inf"))


def attention_pattern(q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """The attention pattern softmax(q k^T / sqrt(d_head) + mask), (..., T, T_k); rows sum to 1.

    q: (..., T, d_head), k: (..., T_k, d_head), mask: additive, broadcastable to (..., T, T_k).
    The mask is cast to the scores' dtype, so half-precision inputs stay half precision.

    >>> attention_pattern(torch.zeros(2, 1), torch.zeros(2, 1), causal_mask(2)).tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    for name, t in (("q", q), ("k", k)):
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., T, d_head), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_head, got {q.shape[-1]} and {k.shape[-1]}")
    if mask is not None:
        m_shape = ((1, 1) + tuple(mask.shape))[-2:]  # the last two dims, a scalar or vector padded with 1s
        if any(m not in (1, n) for m, n in zip(m_shape, (q.shape[-2], k.shape[-2]))):
            raise ValueError(f"mask must broadcast to (T, T_k) = ({q.shape[-2]}, {k.shape[-2]}), got shape {tuple(mask.shape)}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T_k)
    if mask is not None:
        scores = scores + mask.to(scores.dtype)
    return softmax(scores, dim=-1)  # (..., T, T_k)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention; returns (pattern @ v, pattern), the pattern of :func:`attention_pattern`.

    v: (..., T_k, d_v). Two positions with equal scores: position 0 sees only itself, position 1
    averages both values.

    >>> q = k = torch.zeros(2, 1)
    >>> v = torch.tensor([[1.0], [3.0]])
    >>> out, pattern = attention(q, k, v, causal_mask(2))
    >>> out.flatten().tolist(), pattern.tolist()
    ([1.0, 2.0], [[1.0, 0.0], [0.5, 0.5]])
    """
    if v.dim() < 2:
        raise ValueError(f"v must have at least 2 dims (..., T_k, d_v), got shape {tuple(v.shape)}")
    if k.dim() >= 2 and k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}")
    pattern = attention_pattern(q, k, mask)  # (..., T, T_k)
    return pattern @ v, pattern


def _check_head_args(X: Tensor, W_QK: Tensor, d_head: int) -> None:
    if X.dim() < 2:
        raise ValueError(f"X must have shape (..., T, d_model), got {tuple(X.shape)}")
    d_model = X.shape[-1]
    if W_QK.shape != (d_model, d_model):
        raise ValueError(f"W_QK must have shape (d_model, d_model) = ({d_model}, {d_model}), got {tuple(W_QK.shape)}")
    if d_head < 1:
        raise ValueError(f"d_head must be >= 1, got {d_head}")


def head_pattern(X: Tensor, W_QK: Tensor, d_head: int, *, causal: bool = True) -> Tensor:
    """The pattern A = softmax*(X W_QK X^T / sqrt(d_head)) of one head, (..., T, T).

    Entry (i, j) comes from the bilinear form x_i W_QK x_j^T on rows i and j of X (d_model,).
    With two positions, W_QK = I and d_head = 1, row 1 weighs its two keys by e^(x_1.x_0), e^(x_1.x_1):

    >>> X = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    >>> head_pattern(X, torch.eye(2), d_head=1)
    tensor([[1.0000, 0.0000],
            [0.2689, 0.7311]])
    """
    _check_head_args(X, W_QK, d_head)
    scores = X @ W_QK @ X.transpose(-2, -1) / math.sqrt(d_head)  # (..., T, T)
    if causal:
        scores = scores + causal_mask(X.shape[-2], device=X.device).to(scores.dtype)
    return softmax(scores, dim=-1)


def head_output(
    X: Tensor,
    W_QK: Tensor,
    W_OV: Tensor,
    d_head: int,
    *,
    pattern: Tensor | None = None,
    causal: bool = True,
) -> tuple[Tensor, Tensor]:
    """One attention head in the notes' form h(X) = A X W_OV; returns (h(X), A).

    X: (..., T, d_model); W_QK, W_OV: (d_model, d_model). A is ``head_pattern(X, W_QK, d_head)``
    unless a fixed ``pattern`` (..., T, T) is given, in which case the head is linear in X.

    >>> X = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    >>> out, A = head_output(X, torch.eye(2), 2 * torch.eye(2), d_head=1)
    >>> out
    tensor([[0.0000, 0.0000],
            [1.4621, 0.0000]])
    """
    _check_head_args(X, W_QK, d_head)
    T, d_model = X.shape[-2:]
    if W_OV.shape != (d_model, d_model):
        raise ValueError(f"W_OV must have shape (d_model, d_model) = ({d_model}, {d_model}), got {tuple(W_OV.shape)}")
    if pattern is None:
        pattern = head_pattern(X, W_QK, d_head, causal=causal)  # (..., T, T)
    elif tuple(pattern.shape[-2:]) != (T, T):
        raise ValueError(f"pattern must have shape (..., T, T) = (..., {T}, {T}), got {tuple(pattern.shape)}")
    return pattern @ X @ W_OV, pattern  # (..., T, d_model)


@dataclass
class KVCache:
    """Keys and values of the positions processed so far, per layer: (B, n_heads, T_past, d_head).

    Under the causal mask a key or value at position j depends only on tokens <= j, so once
    computed it never changes; generation appends one position per step.
    """

    n_layers: int
    k: list[Tensor | None] = field(default_factory=list)
    v: list[Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        self.k = [None] * self.n_layers
        self.v = [None] * self.n_layers

    def __len__(self) -> int:
        """The number of cached positions (those of layer 0)."""
        return 0 if self.k[0] is None else self.k[0].shape[-2]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values for ``layer``; return all keys and values so far."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=-2)  # (B, n_heads, T_past + T, d_head)
            v = torch.cat([self.v[layer], v], dim=-2)
        self.k[layer], self.v[layer] = k, v
        return k, v


class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention with separate W_Q, W_K, W_V, W_O, as in the notes.

    Shapes: W_Q, W_K, W_V (d_model, n_heads*d_head); W_O (n_heads*d_head, d_model).
    ``fused`` (default ``True``) runs PyTorch's ``scaled_dot_product_attention`` kernel;
    ``fused=False`` runs the readable path, which computes the pattern with :func:`attention_pattern` and
    passes it through ``hook_pattern`` (see :func:`gptlib.hooks.capture_patterns`). Both compute the
    same function. ``layer`` is this layer's index in a :class:`KVCache`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        causal: bool = True,
        fused: bool = True,
        layer: int = 0,
    ):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {d_model}")
        if n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {n_heads}")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"n_heads={n_heads} must divide d_model={d_model} (or give d_head)")
            d_head = d_model // n_heads
        if d_head < 1:
            raise ValueError(f"d_head must be >= 1, got {d_head}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.causal, self.dropout, self.fused, self.layer = causal, dropout, fused, layer
        d_attn = n_heads * d_head
        self.W_Q = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_K = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_V = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_O = nn.Parameter(torch.empty(d_attn, d_model))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(W, std=0.02)
        if bias:
            self.b_Q = nn.Parameter(torch.zeros(d_attn))
            self.b_K = nn.Parameter(torch.zeros(d_attn))
            self.b_V = nn.Parameter(torch.zeros(d_attn))
            self.b_O = nn.Parameter(torch.zeros(d_model))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        self.hook_pattern = HookPoint()  # (B, n_heads, T, T_k), on the readable path only
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    # --- the per-head matrices of the notes -------------------------------------------------
    def head_weights(self, h: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_Q^h, W_K^h, W_V^h (d_model, d_head) and W_O^h (d_head, d_model) of head ``h``."""
        if not 0 <= h < self.n_heads:
            raise ValueError(f"h must be in [0, {self.n_heads}), got {h}")
        s = slice(h * self.d_head, (h + 1) * self.d_head)
        return self.W_Q[:, s], self.W_K[:, s], self.W_V[:, s], self.W_O[s, :]

    def W_QK(self, h: int) -> Tensor:
        """The query-key matrix W_Q^h (W_K^h)^T, (d_model, d_model), of rank <= d_head."""
        W_Q, W_K, _, _ = self.head_weights(h)
        return W_Q @ W_K.T

    def W_OV(self, h: int) -> Tensor:
        """The output-value matrix W_V^h W_O^h, (d_model, d_model), of rank <= d_head."""
        _, _, W_V, W_O = self.head_weights(h)
        return W_V @ W_O

    # --- forward ----------------------------------------------------------------------------
    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). With a cache, x holds the positions after the cached ones."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        # Q, K and V in one matrix product: [Q | K | V] = X [W_Q | W_K | W_V] + [b_Q | b_K | b_V].
        # The three weights stay separate parameters; concatenating them per call is cheap and
        # one large product is faster than three small ones (forward and backward).
        W_qkv = torch.cat([self.W_Q, self.W_K, self.W_V], dim=1)  # (d_model, 3 n_heads d_head)
        x2 = x.reshape(B * T, self.d_model)
        if self.b_Q is None:
            qkv = x2 @ W_qkv
        else:
            qkv = torch.addmm(torch.cat([self.b_Q, self.b_K, self.b_V]), x2, W_qkv)  # (B*T, 3 n_heads d_head)
        q, k, v = (
            t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, n_heads, T, d_head)
            for t in qkv.split(self.n_heads * self.d_head, dim=1)
        )
        if cache is not None:
            k, v = cache.append(self.layer, k, v)  # (B, n_heads, T_k, d_head), T_k = T_past + T
        T_k = k.shape[-2]
        p_drop = self.dropout if self.training else 0.0
        if not self.fused:
            mask = causal_mask(T, T_k, device=x.device) if self.causal else None
            pattern = self.hook_pattern(attention_pattern(q, k, mask))  # (B, n_heads, T, T_k)
            z = self.attn_drop(pattern) @ v  # (B, n_heads, T, d_head)
        else:
            if not self.causal or T == 1:
                z = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
            elif T_k == T:
                z = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True)
            else:
                keep = causal_mask(T, T_k, device=x.device) == 0  # (T, T_k) boolean: True = may attend
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p_drop)
        z = z.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, n_heads*d_head)
        out = z @ self.W_O if self.b_O is None else torch.addmm(self.b_O, z.view(B * T, -1), self.W_O).view(B, T, -1)
        return self.resid_drop(out)  # (B, T, d_model)
