"""Tensor parallelism (Megatron-LM): each weight matrix split across ranks, one all-reduce per
layer.

    MLP:   phi(X W_in^r + b_in^r) W_out^r summed over ranks r, then + b_out
    attn:  sum_r concat_{h in H_r}(A^h X W_V^h) W_O[H_r rows, :], then + b_O

Megatron's f (identity forward, all-reduce backward) enters each split region and g (all-reduce
forward, identity backward) leaves it. A tensor-parallel block is the :class:`~gptlib.block.Block`
itself, running ``Block.forward``, with its ``attn`` and ``mlp`` replaced by their shares.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..attention import MultiHeadAttention, attention, causal_mask
from ..block import Block
from ..kvcache import KVCache
from ..mlp import MLP
from .launch import shard_range, worker_model

__all__ = [
    "copy_to_parallel",
    "reduce_from_parallel",
    "TensorParallelMLP",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "tensor_parallel_worker",
]


def _world(group=None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: the identity forward; all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) forward; the identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: Tensor, group=None) -> Tensor:
    """Enter a tensor-parallel region: identity forward, gradients summed over ranks backward.

    Every rank sends the same ``x`` into its shard, so ``x`` influences the loss through all
    shards and its gradient is the sum of the shards' gradients. Without a process group (one
    process) it is the identity.
    """
    return x if _world(group) == 1 else _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: Tensor, group=None) -> Tensor:
    """Leave a tensor-parallel region: the shards' partial sums added up (all-reduce) forward."""
    return x if _world(group) == 1 else _ReduceFromParallel.apply(x, group)


def _param(t: Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.detach().clone())


class TensorParallelMLP(nn.Module):
    """Rank ``rank``'s share of an :class:`~gptlib.mlp.MLP`: W_in split by columns, W_out by rows.

    With the d_mlp hidden units cut into blocks S_r (:func:`shard_range`),

        MLP(X) = sum_r phi(X W_in[:, S_r] + b_in[S_r]) W_out[S_r, :]  +  b_out,

    because phi acts on each hidden unit on its own. Rank r computes term r; one all-reduce sums
    them; b_out is added once, after the sum.
    """

    def __init__(self, mlp: MLP, rank: int, world_size: int, group=None):
        super().__init__()
        s = shard_range(mlp.d_mlp, rank, world_size)
        self.d_model, self.d_mlp_local, self.group = mlp.d_model, s.stop - s.start, group
        self.phi = (
            mlp.phi
        )  # the same activation function as the unsplit MLP (formula or fused kernel)
        self.W_in = _param(mlp.W_in[:, s])  # (d_model, d_mlp / world_size)
        self.b_in = _param(None if mlp.b_in is None else mlp.b_in[s])
        self.W_out = _param(mlp.W_out[s, :])  # (d_mlp / world_size, d_model)
        self.b_out = _param(mlp.b_out)  # (d_model,): replicated, added after the all-reduce

    def partial(self, x: Tensor) -> Tensor:
        """This rank's term of the sum: phi(x W_in^r + b_in^r) W_out^r, (..., d_model)."""
        h = x @ self.W_in  # (..., d_mlp / world_size)
        if self.b_in is not None:
            h = h + self.b_in
        return self.phi(h) @ self.W_out  # (..., d_model)

    def forward(self, x: Tensor) -> Tensor:
        y = reduce_from_parallel(
            self.partial(copy_to_parallel(x, self.group)), self.group
        )  # (..., d_model)
        return y if self.b_out is None else y + self.b_out


class TensorParallelAttention(nn.Module):
    """Rank ``rank``'s share of a causal :class:`~gptlib.attention.MultiHeadAttention`: a block of
    heads.

    Rank r owns heads H_r: the columns of W_Q, W_K, W_V (and b_Q, b_K, b_V) that belong to them
    and the matching rows of W_O. A layer is the sum of its heads, so

        Attn(X) = sum_r  concat_{h in H_r}(A^h X W_V^h) W_O[H_r rows, :]  +  b_O,

    one all-reduce per layer, b_O added once.
    """

    def __init__(self, attn: MultiHeadAttention, rank: int, world_size: int, group=None):
        super().__init__()
        if not attn.causal:
            raise ValueError("attn must be causal (the book's attention layers are)")
        if attn.dropout > 0:
            raise ValueError(
                f"attn.dropout must be 0 (the split heads implement no dropout), got {attn.dropout}"
            )
        heads = shard_range(attn.n_heads, rank, world_size)
        cols = slice(heads.start * attn.d_head, heads.stop * attn.d_head)
        self.d_model, self.d_head, self.group = attn.d_model, attn.d_head, group
        self.n_heads_local = heads.stop - heads.start
        self.W_Q, self.W_K, self.W_V = (
            _param(W[:, cols]) for W in (attn.W_Q, attn.W_K, attn.W_V)
        )  # (d_model, n_local*d_head)
        self.b_Q, self.b_K, self.b_V = (
            _param(None if b is None else b[cols]) for b in (attn.b_Q, attn.b_K, attn.b_V)
        )
        self.W_O = _param(attn.W_O[cols, :])  # (n_local*d_head, d_model)
        self.b_O = _param(attn.b_O)  # (d_model,): replicated

    def _heads(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        y = x @ W if b is None else x @ W + b  # (B, T, n_local*d_head)
        return y.view(B, T, self.n_heads_local, self.d_head).transpose(
            1, 2
        )  # (B, n_local, T, d_head)

    def partial(self, x: Tensor) -> Tensor:
        """This rank's heads, summed through their rows of W_O: (B, T, d_model)."""
        B, T, _ = x.shape
        q, k, v = (
            self._heads(x, W, b)
            for W, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V))
        )
        z, _ = attention(q, k, v, causal_mask(T, device=x.device))  # (B, n_local, T, d_head)
        z = z.transpose(1, 2).reshape(
            B, T, self.n_heads_local * self.d_head
        )  # (B, T, n_local*d_head)
        return z @ self.W_O  # (B, T, d_model)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model), the same on every rank; ``cache`` must be None."""
        if cache is not None:
            raise ValueError("cache must be None: tensor-parallel attention keeps no KV cache")
        y = reduce_from_parallel(
            self.partial(copy_to_parallel(x, self.group)), self.group
        )  # (B, T, d_model)
        return y if self.b_O is None else y + self.b_O


class TensorParallelBlock(Block):
    """A :class:`~gptlib.block.Block` whose attention and MLP are rank ``rank``'s shares.

    Everything else is a copy of ``block`` (LayerNorms, dropout, the block kind), and the forward
    pass is ``Block.forward`` itself: the block's equations exist once. The LayerNorms stay
    replicated, since every rank holds the whole residual stream; a block costs two all-reduces
    forward (after attention, after the MLP) and two backward.
    """

    def __init__(self, block: Block, rank: int, world_size: int, group=None):
        nn.Module.__init__(self)
        attn = TensorParallelAttention(block.attn, rank, world_size, group)
        mlp = TensorParallelMLP(block.mlp, rank, world_size, group)
        self.__dict__.update(
            copy.deepcopy(block).__dict__
        )  # the replicated parts, and every setting
        self.attn, self.mlp = attn, mlp


def tensor_parallel_worker(
    rank: int, world_size: int, config, state: dict, x: Tensor, layer: int = 0
) -> dict:
    """Tensor parallel: block ``layer``'s MLP, attention and the whole block split across ranks.

    Returns each output, the gradient of sum(output * probe) with respect to the input, and this
    rank's shard gradients, for comparison with the unsplit modules.
    """
    block = worker_model(config, state).blocks[layer]
    probe = torch.linspace(-1, 1, x.numel()).view_as(x)  # a fixed direction to differentiate along
    out: dict[str, Any] = {}
    for name, module in (
        ("mlp", TensorParallelMLP(block.mlp, rank, world_size)),
        ("attn", TensorParallelAttention(block.attn, rank, world_size)),
        ("block", TensorParallelBlock(block, rank, world_size)),
    ):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        (y * probe).sum().backward()
        out[name] = {
            "y": y.detach(),
            "dx": xi.grad,
            "grads": {n: p.grad.detach().clone() for n, p in module.named_parameters()},
        }
    return out
