"""Context parallelism: the positions of a long sequence split across ranks (ring attention).

Rank r holds its own T / world_size positions: their queries, keys and values. The MLP and the
LayerNorms act on each position alone; attention needs every earlier key, so the key/value blocks
go round a ring of ranks (Liu et al. 2023, "Ring Attention"), and each rank folds the block it
holds into a softmax accumulated online (running max m, running sum l), as FlashAttention does
within one device. No rank ever holds the T x T scores or all T keys.

This is what Megatron-LM and PyTorch call *context* parallelism. Megatron's *sequence*
parallelism (Korthikanti et al. 2022) is another technique: it splits the LayerNorm and dropout
activations along the sequence between the all-reduces of tensor parallelism, which it turns
into a reduce-scatter and an all-gather.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from ..attention import causal_mask
from ..inference.flash import online_softmax_update  # derived in Chapter 13.1
from ..runtime import check_int
from .launch import shard_range

__all__ = [
    "online_softmax_update",
    "blockwise_attention",
    "ring_attention",
    "ring_attention_worker",
]


def blockwise_attention(
    q: Tensor, k: Tensor, v: Tensor, n_blocks: int, causal: bool = True
) -> Tensor:
    """Causal attention computed one key block at a time with :func:`online_softmax_update`.

    Never holds more than a (T, T / n_blocks) slice of the scores; equals
    :func:`gptlib.attention.attention` (which holds all T x T of them).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() < 2:
            raise ValueError(
                f"{name} must be a tensor (..., T, d_head), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_head, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}"
        )
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(
            f"q has {q.shape[-2]} positions, more than the {k.shape[-2]} keys it may see"
        )
    T = k.shape[-2]
    n_blocks = check_int("n_blocks", n_blocks, 1, T)
    if T % n_blocks:
        raise ValueError(f"n_blocks={n_blocks} must divide the number of keys T={T}")
    size = T // n_blocks
    mask = causal_mask(q.shape[-2], T, device=q.device) if causal else None
    state = None
    for b in range(n_blocks):
        cols = slice(b * size, (b + 1) * size)
        scores = (
            q @ k[..., cols, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        )  # (..., T_q, T/n_blocks)
        if mask is not None:
            scores = scores + mask[:, cols]
        state = online_softmax_update(state, scores, v[..., cols, :])
    _, l, acc = state
    return acc / l


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None) -> Tensor:
    """Causal attention over a sequence sharded across ranks: K and V travel round a ring.

    Rank r holds the queries, keys and values of positions [r T_r, (r+1) T_r), each
    (..., T_r, d_head), T_r = T / world_size. Besides its own keys and values it holds one
    travelling key/value block at a time (two while the next one arrives). In step t = 0, 1, …,
    world_size-1 it holds the key/value block of rank
    (r - t) mod world_size, folds it into an online softmax, and passes it on to rank r+1 while
    receiving the next from rank r-1 (the sends overlap the computation). Blocks from later
    positions are entirely masked by causality and are skipped. Returns this rank's rows of the
    attention output, (..., T_r, d_head).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    T_r = q.shape[-2]
    if k.shape[-2] != T_r or v.shape[-2] != T_r:
        raise ValueError(
            f"q, k and v must hold the same positions, got {q.shape[-2]}, {k.shape[-2]}, "
            f"{v.shape[-2]}"
        )
    kv = torch.stack([k, v]).contiguous()  # (2, ..., T_r, d_head): one message per step
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    state = None
    for step in range(world):
        src = (rank - step) % world  # whose keys and values we hold now
        pending = []
        if step < world - 1:
            incoming = torch.empty_like(kv)
            ops = [
                dist.P2POp(dist.isend, kv, nxt, group),
                dist.P2POp(dist.irecv, incoming, prv, group),
            ]
            pending = dist.batch_isend_irecv(ops)
        if src <= rank:  # keys at later positions are all masked: skip them
            scores = q @ kv[0].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_r, T_r)
            if src == rank:
                scores = scores + causal_mask(T_r, device=q.device)  # the diagonal block
            state = online_softmax_update(state, scores, kv[1])
        for req in pending:
            req.wait()
        if step < world - 1:
            kv = incoming
    _, l, acc = state
    return acc / l


def ring_attention_worker(rank: int, world_size: int, q: Tensor, k: Tensor, v: Tensor) -> dict:
    """Context parallel: this rank takes its block of positions of q, k, v and runs
    :func:`ring_attention`.

    q, k, v are the whole sequence's (..., T, d_head); each rank keeps only its own T / world_size
    positions of them, as it would if it had computed them from its share of the tokens.
    """
    pos = shard_range(q.shape[-2], rank, world_size)
    q_r = q[..., pos, :].clone()
    z = ring_attention(q_r, k[..., pos, :].contiguous(), v[..., pos, :].contiguous())
    return {"z": z, "positions": [pos.start, pos.stop]}
