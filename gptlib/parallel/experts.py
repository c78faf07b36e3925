"""Expert parallelism: the experts of a mixture-of-experts layer spread over ranks, tokens moved by
all-to-all.

Rank r holds experts r E/N_d ... (r+1) E/N_d - 1 (E experts, N_d ranks) and its own share of the
tokens. Every rank routes its tokens with the (replicated) router, then

    1. all-to-all: each routed (token, slot) goes to the rank that owns its expert;
    2. each rank runs its experts on the tokens it received;
    3. all-to-all back: the outputs return to the tokens' ranks, which add them with their gates.

Both exchanges are differentiable all-to-alls (``all_to_all_single_autograd`` of PyTorch's
functional collectives): the backward pass of each is the reverse all-to-all, so gradients
reach the experts and the router.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed._functional_collectives import all_to_all_single_autograd

from ..moe import MoE, load_balancing_loss, route, sort_by_expert
from .launch import shard_range

__all__ = ["expert_parallel_forward", "expert_parallel_worker"]


def expert_parallel_forward(moe: MoE, x: Tensor, group=None) -> tuple[Tensor, dict]:
    """The MoE layer on this rank's tokens x (n, d_model), with only this rank's experts computed
    here.

    ``moe`` is a full :class:`gptlib.moe.MoE` (its router is used; of its experts only this rank's
    share, :func:`gptlib.parallel.launch.shard_range` of them, are run). Returns the output
    (n, d_model) and the sizes exchanged: slots sent to and received from each rank.
    """
    if moe.capacity_factor is not None:
        raise ValueError(
            "moe must have capacity_factor=None: expert_parallel_forward drops no tokens"
        )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    E, k = moe.n_experts, moe.top_k
    mine = shard_range(E, rank, world)  # this rank's experts
    per_rank = E // world
    probs, gates, idx = route(x, moe.W_r, k)  # (n, E), (n, k), (n, k)
    order, counts = sort_by_expert(idx, E)  # slots grouped by expert, and how many per expert
    tokens = order // k  # the token of each slot, in expert order
    # 1. tell every rank how many slots of each of its experts are coming
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(
        recv_counts, counts, group=group
    )  # (world * per_rank,): [source][my expert]
    recv_counts = recv_counts.view(world, per_rank)
    send_sizes = counts.view(world, per_rank).sum(1).tolist()
    recv_sizes = recv_counts.sum(1).tolist()
    # 2. send each slot's token vector to its expert's rank
    group = dist.group.WORLD if group is None else group
    received = all_to_all_single_autograd(
        x[tokens], recv_sizes, send_sizes, group
    )  # (sum recv, d_model)
    # 3. run each local expert on its rows: the buffer is [source rank][expert] blocks
    blocks = received.split(recv_counts.flatten().tolist())
    outputs = [
        moe.experts[mine.start + i % per_rank](blk) if blk.shape[0] else blk
        for i, blk in enumerate(blocks)
    ]
    done = torch.cat(outputs) if outputs else received
    # 4. send the outputs back; they arrive in the order the slots left
    back = all_to_all_single_autograd(
        done, send_sizes, recv_sizes, group
    )  # (n k, d_model), in slot order
    y = torch.zeros_like(x)
    y = y.index_add(0, tokens, back * gates.flatten()[order, None].to(back.dtype))  # (n, d_model)
    aux = load_balancing_loss(probs, idx, E)
    return y, {"sent": send_sizes, "received": recv_sizes, "aux": aux}


def expert_parallel_worker(
    rank: int, world_size: int, moe_args: tuple, state: dict, x: Tensor, probe: Tensor
) -> dict:
    """Expert parallelism on ``world_size`` ranks for an :class:`MoE` built as ``MoE(*moe_args)``
    with ``state``.

    The ranks split the tokens x (n, d_model) into contiguous blocks. Returns this rank's
    outputs, the sizes it exchanged, and the gradients of sum(y * probe) (summed over ranks by
    all-reduce) for the router and for this rank's experts.
    """
    moe = MoE(*moe_args)
    moe.load_state_dict(state)
    rows = shard_range(x.shape[0], rank, world_size)
    y, sizes = expert_parallel_forward(moe, x[rows])
    (y * probe[rows]).sum().backward()
    dist.all_reduce(
        moe.W_r.grad
    )  # every rank routed its own tokens: the router's gradient is the sum
    mine = shard_range(moe.n_experts, rank, world_size)
    grads = {
        n: p.grad.detach().clone()
        for n, p in moe.named_parameters()
        if p.grad is not None
        and (n == "W_r" or int(n.split(".")[1]) in range(mine.start, mine.stop))
    }
    return {
        "y": y.detach(),
        "rows": [rows.start, rows.stop],
        "sent": sizes["sent"],
        "received": sizes["received"],
        "grads": grads,
    }
