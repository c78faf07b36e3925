"""Chapter 4: attention — the masked row softmax, heads and multi-head layers (the KV cache they
append to is :mod:`gptlib.kvcache`).

For one head h with per-head weights W_Q^h, W_K^h, W_V^h (d_model, d_head) and W_O^h
(d_head, d_model), acting on the rows of X (T, d_model):

    A^h = softmax*( X W_Q^h (X W_K^h)^T / sqrt(d_head) )        (T, T), causally masked rows
    h(X) = A^h X W_V^h W_O^h = A^h X W_OV^h                      (T, d_model)

and the layer is the sum of its heads, which equals concat_h(A^h X W_V^h) W_O.
"""

from __future__ import annotations

import math
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embedding import init_normal_
from .hooks import HookPoint
from .kvcache import KVCache
from .runtime import check_float, check_int, check_positive_int

__all__ = [
    "softmax",
    "causal_mask",
    "attention_pattern",
    "attention",
    "head_pattern",
    "head_output",
    "d_head_of",
    "repeat_kv",
    "attend",
    "non_finite_rows",
    "MultiHeadAttention",
]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax along ``dim`` (rows by default): exp(x - max) / sum exp(x - max).

    Entries equal to -inf get probability 0. A row that is entirely -inf has no distribution and
    comes out as NaN (as with ``torch.softmax``); a causal mask never makes one, since every query
    sees its own position.

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
    T = check_int("T", T, lo=1)
    T_k = T if T_k is None else check_int("T_k", T_k, lo=T)
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
            raise ValueError(
                f"{name} must have at least 2 dims (..., T, d_head), got shape {tuple(t.shape)}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_head, got {q.shape[-1]} and {k.shape[-1]}")
    if mask is not None:
        if not isinstance(mask, Tensor) or not mask.is_floating_point():
            raise ValueError(
                "mask must be an additive float tensor (0 where a key is seen, -inf where not), "
                "got "
                f"{getattr(mask, 'dtype', type(mask).__name__)}; from a boolean keep-mask m: "
                "torch.zeros(m.shape).masked_fill(~m, float('-inf'))"
            )
        m_shape = ((1, 1) + tuple(mask.shape))[
            -2:
        ]  # the last two dims, a scalar or vector padded with 1s
        if any(m not in (1, n) for m, n in zip(m_shape, (q.shape[-2], k.shape[-2]))):
            raise ValueError(
                f"mask must broadcast to (T, T_k) = ({q.shape[-2]}, {k.shape[-2]}), got shape "
                f"{tuple(mask.shape)}"
            )
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T_k)
    if mask is not None:
        scores = scores + mask.to(scores.dtype)
    return softmax(scores, dim=-1)  # (..., T, T_k)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention; returns (pattern @ v, pattern), the pattern of
    :func:`attention_pattern`.

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
        raise ValueError(
            f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}"
        )
    pattern = attention_pattern(q, k, mask)  # (..., T, T_k)
    return pattern @ v, pattern


def _check_head_args(X: Tensor, W_QK: Tensor, d_head: int) -> None:
    if X.dim() < 2:
        raise ValueError(f"X must have shape (..., T, d_model), got {tuple(X.shape)}")
    d_model = X.shape[-1]
    if W_QK.shape != (d_model, d_model):
        raise ValueError(
            f"W_QK must have shape (d_model, d_model) = ({d_model}, {d_model}), got "
            f"{tuple(W_QK.shape)}"
        )
    check_positive_int("d_head", d_head)


def head_pattern(X: Tensor, W_QK: Tensor, d_head: int, *, causal: bool = True) -> Tensor:
    """The pattern A = softmax*(X W_QK X^T / sqrt(d_head)) of one head, (..., T, T).

    Entry (i, j) comes from the bilinear form x_i W_QK x_j^T on rows i and j of X (d_model,).
    With two positions, W_QK = I and d_head = 1, row 1 weighs its two keys by e^(x_1.x_0),
    e^(x_1.x_1):

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
        raise ValueError(
            f"W_OV must have shape (d_model, d_model) = ({d_model}, {d_model}), got "
            f"{tuple(W_OV.shape)}"
        )
    if pattern is None:
        pattern = head_pattern(X, W_QK, d_head, causal=causal)  # (..., T, T)
    elif tuple(pattern.shape[-2:]) != (T, T):
        raise ValueError(
            f"pattern must have shape (..., T, T) = (..., {T}, {T}), got {tuple(pattern.shape)}"
        )
    return pattern @ X @ W_OV, pattern  # (..., T, d_model)


def d_head_of(d_model: int, n_heads: int, d_head: int | None = None) -> int:
    """The width of one head: ``d_head`` when given, else d_model / n_heads, which must be whole.

    >>> d_head_of(768, 12), d_head_of(1536, 16, d_head=96)
    (64, 96)
    >>> d_head_of(10, 3)
    Traceback (most recent call last):
    ...
    ValueError: n_heads=3 must divide d_model=10 (or give d_head)
    """
    d_model = check_positive_int("d_model", d_model)
    n_heads = check_positive_int("n_heads", n_heads)
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model} (or give d_head)")
        return d_model // n_heads
    return check_positive_int("d_head", d_head)


def repeat_kv(k: Tensor, group: int) -> Tensor:
    """(B, n_kv_heads, T, d_head) -> (B, n_kv_heads*group, T, d_head): query head h reads kv head h
    // group.

    >>> repeat_kv(torch.tensor([[[[1.0]], [[2.0]]]]), 2).flatten().tolist()
    [1.0, 1.0, 2.0, 2.0]
    """
    check_positive_int("group", group)
    if group == 1:
        return k
    B, n_kv, T, d_head = k.shape
    if T == 0:
        return k.repeat_interleave(group, dim=1)
    # kv head g copied to heads g group .. (g + 1) group - 1; the positions' count left to -1,
    # so that an exported graph reshapes to a constant shape rather than one it computes
    return k[:, :, None].expand(-1, -1, group, -1, -1).reshape(B, n_kv * group, -1, d_head)


# The kernel that replaces attend's own within gptlib.inference.use_tiled_attention (None: none):
# a context variable, so the choice holds in that block and thread only, and no module is patched.
KERNEL: ContextVar = ContextVar("attention_kernel", default=None)
kernels_open = 0  # the use_tiled_attention blocks open, in any thread (see attend)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    fused: bool,
    causal: bool = True,
    dropout: float = 0.0,
    hook_pattern: HookPoint | None = None,
    drop_pattern: nn.Module | None = None,
) -> Tensor:
    """The heads' outputs A v, (B, n_heads, T, d_head), for q (B, n_heads, T, d_head) and keys and
    values (B, n_kv_heads, T_k, d_head) shared by groups of n_heads / n_kv_heads query heads (one
    head per group: multi-head attention). The T queries are the last T of the T_k positions.

    ``fused=True`` runs PyTorch's ``scaled_dot_product_attention`` kernel, with attention dropout
    ``dropout``. ``fused=False`` is the readable path: the pattern of :func:`attention_pattern`,
    passed through ``hook_pattern`` (whose forward hooks may read or replace it) and
    ``drop_pattern`` (a dropout module), times the values. The kernel never forms the pattern, so
    a ``hook_pattern`` that is observed (:attr:`gptlib.hooks.HookPoint.observed`: a hook asks for
    the pattern) takes the readable path whatever ``fused`` says. Both compute the same function for
    finite inputs; for a non-finite query or first key the fused kernel may give the row 0 where
    the formula gives NaN, which a layer restores with :func:`non_finite_rows`.
    """
    # torch.compile traces a module global (and guards on its value) but stops its graph at a
    # ContextVar's get: KERNEL is read only while some block has set it
    kernel = KERNEL.get() if kernels_open else None
    if kernel is not None:  # use_tiled_attention's
        return kernel(
            q, k, v, fused=fused, causal=causal, dropout=dropout, hook_pattern=hook_pattern
        )
    T, T_k, group = q.shape[-2], k.shape[-2], q.shape[1] // k.shape[1]
    if fused and not (hook_pattern is not None and hook_pattern.observed):
        gqa = {"enable_gqa": True} if group > 1 else {}
        if not causal or T == 1:  # one query, the newest position, sees every key
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, **gqa)
        if T_k == T:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, **gqa)
        keep = causal_mask(T, T_k, device=q.device) == 0  # (T, T_k) boolean: True = may attend
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout, **gqa)
    k, v = repeat_kv(k, group), repeat_kv(v, group)  # (B, n_heads, T_k, d_head)
    pattern = attention_pattern(q, k, causal_mask(T, T_k, device=q.device) if causal else None)
    if hook_pattern is not None:
        pattern = hook_pattern(pattern)  # (B, n_heads, T, T_k)
    if drop_pattern is not None:
        pattern = drop_pattern(pattern)
    return pattern @ v  # (B, n_heads, T, d_head)


def non_finite_rows(q: Tensor, k: Tensor) -> Tensor:
    """0 for each query position, NaN where its query or the first key holds a NaN or an infinity:
    (B, T, 1).

    q: (B, n_heads, T, d_head), k: (B, n_kv_heads, T_k, d_head). The formula makes such a row of a
    layer's output NaN: every score of a non-finite query is NaN or infinite, and so is one score
    of every row when the first key (which every query sees) is. PyTorch's fused kernel on the CPU
    does not: its running row maximum skips NaN, and a row left without a finite maximum is taken
    for a fully masked one and given the output 0 (pytorch/pytorch#141128), so a NaN weight in
    W_Q or W_K would vanish from the logits. A layer adds this term to its output (after W_O,
    where it keeps no extra activation for the backward pass); a NaN among the later keys or in
    the values already reaches the output through the kernel's sums. No device synchronisation.
    The sums are taken in float32 at least, so that a float16 query of large finite numbers does
    not overflow to inf and report a row that is not NaN.

    >>> q = torch.zeros(1, 2, 3, 4)
    >>> q[0, 1, 2, 0] = float("nan")  # head 1's query at position 2
    >>> non_finite_rows(q, torch.zeros(1, 1, 3, 4)).flatten().tolist()
    [0.0, 0.0, nan]
    """
    wide = torch.promote_types(q.dtype, torch.float32)
    rows = q.sum(dim=(1, 3), keepdim=True, dtype=wide)  # (B, 1, T, 1)
    first_key = k[:, :, :1].sum(dim=(1, 2, 3), keepdim=True, dtype=wide)  # (B, 1, 1, 1)
    return ((rows + first_key) * 0)[:, 0].to(q.dtype)  # (B, T, 1): 0, or NaN


class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention with separate W_Q, W_K, W_V, W_O, as in the notes.

    Shapes: W_Q, W_K, W_V (d_model, n_heads*d_head); W_O (n_heads*d_head, d_model).
    ``fused`` (default ``True``) runs PyTorch's ``scaled_dot_product_attention`` kernel;
    ``fused=False`` runs the readable path, which computes the pattern with
    :func:`attention_pattern` and passes it through ``hook_pattern``; a hook on ``hook_pattern``
    (see :func:`gptlib.hooks.capture_patterns`) asks for that path while it is attached. Both
    compute the same function (:func:`attend`). ``layer`` is this layer's index in a
    :class:`~gptlib.kvcache.KVCache`.

    W_Q, W_K and W_V are three parameters and Q, K, V three products, x W_Q + b_Q and so on;
    one product with the concatenation [W_Q | W_K | W_V] (GPT-2's ``c_attn``) is the same function.
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
        # A GPT's sizes are checked once, in GPTConfig; these checks serve a layer built on its own.
        d_head = d_head_of(d_model, n_heads, d_head)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.dropout = check_float("dropout", dropout, 0.0, 1.0, hi_open=True)
        for name, value in (("bias", bias), ("causal", causal), ("fused", fused)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.causal, self.fused, self.layer = causal, fused, check_int("layer", layer, lo=0)
        d_attn = n_heads * d_head
        self.W_Q = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_K = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_V = nn.Parameter(torch.empty(d_model, d_attn))
        self.W_O = nn.Parameter(torch.empty(d_attn, d_model))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            init_normal_(W, 0.02)
        if bias:
            self.b_Q = nn.Parameter(torch.zeros(d_attn))
            self.b_K = nn.Parameter(torch.zeros(d_attn))
            self.b_V = nn.Parameter(torch.zeros(d_attn))
            self.b_O = nn.Parameter(torch.zeros(d_model))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        self.hook_pattern = HookPoint()  # (B, n_heads, T, T_k), on the readable path only
        self.hook_q = HookPoint()  # (B, n_heads, T, d_head): the queries
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    # --- the per-head matrices of the notes -------------------------------------------------
    def head_weights(self, h: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_Q^h, W_K^h, W_V^h (d_model, d_head) and W_O^h (d_head, d_model) of head ``h``."""
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < self.n_heads:
            raise ValueError(f"h must be in [0, {self.n_heads}), got {h!r}")
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

    # --- Q, K, V: three products ----------------------------------------------------------------
    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V = x W_Q + b_Q, x W_K + b_K, x W_V + b_V for rows x (N, d_model): each (N,
        d_attn)."""
        if self.b_Q is None:
            return x @ self.W_Q, x @ self.W_K, x @ self.W_V
        return (
            torch.addmm(self.b_Q, x, self.W_Q),
            torch.addmm(self.b_K, x, self.W_K),
            torch.addmm(self.b_V, x, self.W_V),
        )

    # --- forward ----------------------------------------------------------------------------
    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). With a cache, x holds the positions after the cached
        ones."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, n_heads, T, d_head)
            for t in self.qkv(x.reshape(B * T, self.d_model))
        )
        q = self.hook_q(q)
        if cache is not None:
            k, v = cache.append(self.layer, k, v)  # (B, n_heads, T_k, d_head), T_k = offset + T
        p_drop = self.dropout if self.training else 0.0
        z = attend(
            q,
            k,
            v,
            fused=self.fused,
            causal=self.causal,
            dropout=p_drop,
            hook_pattern=self.hook_pattern,
            drop_pattern=self.attn_drop,
        )  # (B, n_heads, T, d_head)
        z = z.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, n_heads*d_head)
        out = (
            z @ self.W_O
            if self.b_O is None
            else torch.addmm(self.b_O, z.view(B * T, -1), self.W_O).view(B, T, -1)
        )
        return self.resid_drop(out + non_finite_rows(q, k))  # (B, T, d_model)
