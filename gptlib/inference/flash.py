"""Chapter 13.1: the online softmax and FlashAttention's tiling, exact and counted.

For one query row with scores s_1, ..., s_n and values v_1, ..., v_n, the streaming recurrence over
blocks of keys keeps three numbers per row, the running maximum m, the running normaliser
ell = sum_j exp(s_j - m) and the running output o = sum_j exp(s_j - m) v_j, and rescales ell and o
by exp(m - m') whenever the maximum grows to m'. After the last block o / ell is
softmax(s) V exactly (in real arithmetic), although no step held all n scores.

:func:`tiled_attention` is Dao et al.'s Algorithm 1 written for reading: key blocks in the outer
loop, query blocks in the inner one, the state (m, ell, o) of each query block kept in "slow
memory" between visits, blocks wholly above the causal diagonal skipped. A :class:`Traffic`
counts the numbers it moves between slow memory and the fast on-chip memory of size M, so the
count Theta(T^2 d^2 / M) is measured on the implementation, next to the standard algorithm's
Theta(T d + T^2) (:func:`standard_attention`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..attention import causal_mask, repeat_kv
from ..runtime import check_int, check_positive_int

_OPEN = threading.Lock()  # guards gptlib.attention.kernels_open

__all__ = [
    "online_softmax_update",
    "Traffic",
    "flash_block_sizes",
    "tiled_attention",
    "standard_attention",
    "tiled_attend",
    "TiledAttention",
    "use_tiled_attention",
]


def online_softmax_update(
    state: tuple[Tensor, Tensor, Tensor] | None, scores: Tensor, v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one block of keys into a running softmax-weighted sum.

    ``state = (m, ell, o)``: the running row maximum m (..., T, 1), the running normaliser
    ell = sum_j exp(s_j - m) (..., T, 1) and the running output o = sum_j exp(s_j - m) v_j
    (..., T, d_v), all over the key blocks seen so far (``None`` before the first). A block with
    scores S (..., T, T_b) (-inf where masked) and values V (..., T_b, d_v) gives
    m' = max(m, rowmax S) and

        ell' = ell exp(m - m') + sum_j exp(S_j - m'),
        o'   = o   exp(m - m') + exp(S - m') V.

    After the last block, o / ell is softmax(all scores) @ all values. Two blocks of one score each,
    the second larger: the first block's weight is rescaled by e^(0 - 1).

    >>> state = online_softmax_update(None, torch.tensor([[0.0]]), torch.tensor([[1.0]]))
    >>> m, ell, o = online_softmax_update(state, torch.tensor([[1.0]]), torch.tensor([[3.0]]))
    >>> m.item(), round(ell.item(), 4), round((o / ell).item(), 4)  # (1 e^0 + 3 e^1) / (e^0 + e^1)
    (1.0, 1.3679, 2.4621)
    """
    for name, t in (("scores", scores), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() < 2 or not t.is_floating_point():
            raise ValueError(
                f"{name} must be a floating-point tensor (..., rows, columns), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    if scores.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"scores (..., T, T_b) and v (..., T_b, d_v) must share T_b, got {tuple(scores.shape)}"
            f" and {tuple(v.shape)}"
        )
    block_max = scores.amax(dim=-1, keepdim=True)  # (..., T, 1)
    m_new = block_max if state is None else torch.maximum(state[0], block_max)
    # A row that has seen only masked keys keeps m = -inf; shift it by 0 to avoid (-inf) - (-inf).
    shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    p = torch.exp(scores - shift)  # (..., T, T_b)
    ell_new, o_new = p.sum(dim=-1, keepdim=True), p @ v
    if state is not None:
        m, ell, o = state
        scale = torch.exp(
            torch.where(torch.isfinite(m), m, shift) - shift
        )  # (..., T, 1); 0 rows stay 0
        ell_new, o_new = ell * scale + ell_new, o * scale + o_new
    return m_new, ell_new, o_new


def _numbers(tensors: tuple) -> int:
    """The numbers the tensors hold; anything else is refused (it moves no counted numbers)."""
    for t in tensors:
        if not isinstance(t, Tensor):
            raise ValueError(f"Traffic counts tensors, got {type(t).__name__}")
    return sum(t.numel() for t in tensors)


@dataclass
class Traffic:
    """Numbers moved between slow memory (a GPU's HBM) and fast memory (its on-chip SRAM).

    ``reads`` counts numbers loaded into fast memory, ``writes`` numbers stored back; a number is
    one element of Q, K, V, O, S, P or of the statistics m and ell, whatever its width.

    >>> t = Traffic()
    >>> t.read(torch.zeros(4, 8)); t.write(torch.zeros(4))
    >>> t.reads, t.writes, t.total
    (32, 4, 36)
    """

    reads: int = 0
    writes: int = 0

    def read(self, *tensors: Tensor) -> None:
        self.reads += _numbers(tensors)

    def write(self, *tensors: Tensor) -> None:
        self.writes += _numbers(tensors)

    @property
    def total(self) -> int:
        return self.reads + self.writes


def flash_block_sizes(M: int, d: int) -> tuple[int, int]:
    """Dao et al.'s block sizes for fast memory of M numbers and head width d: (B_r, B_c) with
    B_c = ceil(M / 4d) keys per block and B_r = min(B_c, d) queries per block, so that a query
    block, a key block, a value block and the output block fit in M.

    >>> flash_block_sizes(4096, 64), flash_block_sizes(100_000, 64)
    ((16, 16), (64, 391))
    """
    check_positive_int("M", M)
    check_positive_int("d", d)
    B_c = math.ceil(M / (4 * d))
    return min(B_c, d), B_c


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() < 2:
            raise ValueError(
                f"{name} must be a tensor of shape (..., T, d), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    if not (q.is_floating_point() and q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k, v must be floating-point tensors of one dtype, got {q.dtype}, {k.dtype}, "
            f"{v.dtype}"
        )
    if q.shape[-1] < 1:
        raise ValueError(
            f"q and k must have d >= 1 (the scores divide by sqrt(d)), got shape {tuple(q.shape)}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"q, k must share d and k, v their positions; got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-2] > k.shape[-2]:
        raise ValueError(f"q has more positions ({q.shape[-2]}) than k ({k.shape[-2]})")


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_q: int,
    block_k: int,
    *,
    causal: bool = True,
    traffic: Traffic | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, one (block_q x block_k) tile of scores at a time.

    q: (..., T, d); k, v: (..., T_k, d), T_k >= T (the queries are the last T positions, as with a
    KV cache). Outer loop: key blocks j, each loaded once. Inner loop: query blocks i; for each,
    the query block and its state (m_i, ell_i, o_i) are read from slow memory, updated with
    :func:`online_softmax_update` and written back. Under the causal mask a tile whose keys all
    follow its queries is skipped. ``traffic`` counts the numbers read and written.

    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 10, 4, generator=g, dtype=torch.float64)
    >>> full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> bool((tiled_attention(q, k, v, 3, 4) - full).abs().max() < 1e-12)
    True
    """
    _check_qkv(q, k, v)
    _check_causal(causal)
    block_q, block_k = check_int("block_q", block_q, lo=1), check_int("block_k", block_k, lo=1)
    if traffic is not None and not isinstance(traffic, Traffic):
        raise ValueError(f"traffic must be a Traffic or None, got {type(traffic).__name__}")
    T, T_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    shift = T_k - T  # query i sits at position i + shift
    traffic = Traffic() if traffic is None else traffic
    rows = [slice(i, min(i + block_q, T)) for i in range(0, T, block_q)]
    # slow memory: each query block's running state, (..., B_r, 1), (..., B_r, 1), (..., B_r, d_v)
    state: list[tuple[Tensor, Tensor, Tensor] | None] = [None] * len(rows)
    for j0 in range(0, T_k, block_k):
        cols = slice(j0, min(j0 + block_k, T_k))
        K_j, V_j = k[..., cols, :], v[..., cols, :]  # (..., B_c, d)
        traffic.read(K_j, V_j)
        for i, r in enumerate(rows):
            if causal and r.stop - 1 + shift < j0:
                continue  # every key of this tile follows every query: all scores masked
            Q_i = q[..., r, :]  # (..., B_r, d)
            traffic.read(Q_i, *(state[i] or ()))
            S = Q_i @ K_j.transpose(-2, -1) / math.sqrt(d)  # (..., B_r, B_c), on chip only
            if causal:  # query position i + shift sees keys j <= i + shift
                q_pos = torch.arange(r.start, r.stop, device=q.device)[:, None] + shift
                k_pos = torch.arange(cols.start, cols.stop, device=q.device)[None, :]
                S = S.masked_fill(k_pos > q_pos, float("-inf"))
            state[i] = online_softmax_update(state[i], S, V_j)
            traffic.write(*state[i])
    out = []
    for st in state:
        _, ell, o = st
        traffic.read(ell, o)
        out.append(o / ell)  # (..., B_r, d_v)
        traffic.write(out[-1])
    return torch.cat(out, dim=-2)  # (..., T, d_v)


def standard_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, traffic: Traffic | None = None
) -> Tensor:
    """Dao et al.'s Algorithm 0, counted: S = q k^T / sqrt(d) written to slow memory, read back for
    P = softmax(S), P written, read back with v for O = P v. Moves 4 T T_k + 2 T d + 2 T_k d
    numbers.

    >>> t = Traffic()
    >>> _ = standard_attention(*torch.zeros(3, 8, 2), traffic=t)
    >>> t.total == 4 * 8 * 8 + 4 * 8 * 2
    True
    """
    _check_qkv(q, k, v)
    _check_causal(causal)
    if traffic is not None and not isinstance(traffic, Traffic):
        raise ValueError(f"traffic must be a Traffic or None, got {type(traffic).__name__}")
    traffic = Traffic() if traffic is None else traffic
    traffic.read(q, k)
    S = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T_k)
    if causal:
        S = S + causal_mask(q.shape[-2], k.shape[-2], device=q.device).to(S.dtype)
    traffic.write(S)
    traffic.read(S)
    P = torch.softmax(S, dim=-1)
    traffic.write(P)
    traffic.read(P, v)
    O = P @ v  # (..., T, d_v)
    traffic.write(O)
    return O


def _check_causal(causal: object) -> bool:
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return causal


def tiled_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block_q: int = 16,
    block_k: int = 16,
    fused: bool = True,
    causal: bool = True,
    dropout: float = 0.0,
    hook_pattern: nn.Module | None = None,
    traffic: Traffic | None = None,
) -> Tensor:
    """:func:`gptlib.attention.attend`'s contract on :func:`tiled_attention`: q (B, n_heads, T,
    d_head), keys and values (B, n_kv_heads, T_k, d_head) shared by groups of query heads. A tiled
    kernel forms no pattern and drops nothing: ``dropout`` must be 0, and a ``hook_pattern`` with
    hooks attached (patterns being recorded) is refused; ``fused`` is accepted and has no effect.

    >>> q = k = v = torch.ones(1, 2, 3, 4)
    >>> tiled_attend(q, k[:, :1], v[:, :1], block_q=2, block_k=2).shape  # 2 heads, 1 kv head
    torch.Size([1, 2, 3, 4])
    """
    _check_causal(causal)
    if dropout:
        raise ValueError(f"dropout must be 0 in tiled attention, got {dropout}")
    if hook_pattern is not None and (
        hook_pattern._forward_hooks or hook_pattern._forward_pre_hooks
    ):
        raise ValueError(
            "attention patterns cannot be recorded under tiled attention (a tiled kernel never "
            "forms one): record them outside use_tiled_attention"
        )
    _check_qkv(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q must be (B, n_heads, T, d_head) and k, v (B, n_kv_heads, T_k, d_head) with "
            f"n_kv_heads >= 1 dividing n_heads; got shapes {tuple(q.shape)}, {tuple(k.shape)}"
        )
    group = q.shape[1] // k.shape[1]
    return tiled_attention(
        q,
        repeat_kv(k, group),
        repeat_kv(v, group),
        block_q,
        block_k,
        causal=causal,
        traffic=traffic,
    )


@dataclass
class TiledAttention:
    """The choice made by :func:`use_tiled_attention`: the block sizes, and the numbers moved
    between slow and fast memory by every layer evaluated within the block (``traffic``)."""

    block_q: int = 16
    block_k: int = 16
    traffic: Traffic = field(default_factory=Traffic)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
        return tiled_attend(
            q, k, v, block_q=self.block_q, block_k=self.block_k, traffic=self.traffic, **kwargs
        )


@contextmanager
def use_tiled_attention(block_q: int = 16, block_k: int = 16) -> Iterator[TiledAttention]:
    """Within the block, every attention layer that computes its heads with
    :func:`gptlib.attention.attend` (:class:`~gptlib.attention.MultiHeadAttention`,
    :class:`~gptlib.modern.GroupedQueryAttention`, the unabsorbed
    :class:`~gptlib.mla.MultiHeadLatentAttention`) computes them with :func:`tiled_attention`
    instead. The choice is a context variable (:data:`gptlib.attention.KERNEL`): it holds in this
    block and this thread only, and no module is changed. Yields the :class:`TiledAttention`, whose
    ``traffic`` counts what the layers moved.

    >>> from gptlib.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model, ids = GPT(GPTConfig.preset("tiny")).eval(), torch.tensor([[1, 2, 3, 4, 5]])
    >>> with torch.no_grad(), use_tiled_attention(2, 3) as tiled:
    ...     out = model(ids)
    >>> torch.allclose(out, model(ids), atol=1e-5), tiled.traffic.total > 0
    (True, True)
    """
    from .. import attention

    kernel = TiledAttention(
        check_int("block_q", block_q, lo=1), check_int("block_k", block_k, lo=1)
    )
    with _OPEN:
        attention.kernels_open += 1
    token = attention.KERNEL.set(kernel)
    try:
        yield kernel
    finally:
        attention.KERNEL.reset(token)
        with _OPEN:
            attention.kernels_open -= 1
