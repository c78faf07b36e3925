"""Sharded data parallelism (ZeRO): the model state split across the data-parallel ranks.

    ZeRO-1   ``ZeroRedundancyOptimizer``: rank r keeps AdamW's moments only for its share of the
             parameters; gradients are all-reduced as in DDP, each rank updates its share, and
             the updated weights are broadcast from their owners
    ZeRO-3   FSDP2 ``fully_shard``: weights, gradients and moments all sharded; each block's
             weights are all-gathered just before it runs and freed after

Both compute exactly the update of one process on the whole batch; :func:`sharded_training_worker`
runs a few AdamW steps each way and reports the losses and how many numbers each rank holds
(Chapter 11 compares them with a single-process run). The byte counts per stage at scale are
:func:`gptlib.efficiency.zero_bytes_per_device`.

What the collectives cost: in a ring of R ranks, each holding M bytes, a reduce-scatter takes R - 1
steps in which every rank sends an M / R chunk to its neighbour and adds the chunk it receives;
an all-gather passes the reduced chunks on around the ring in R - 1 more steps. Each rank sends

    reduce-scatter (R - 1) M / R,   all-gather (R - 1) M / R,   all-reduce = both = 2 (R - 1) M / R

(:func:`ring_bytes_per_rank`; :func:`ring_all_reduce` runs it with point-to-point messages and
counts the bytes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ..runtime import check_int, check_positive_int
from .launch import lm_loss, shard_range, worker_model

__all__ = [
    "local_numel",
    "sharded_training_worker",
    "ring_bytes_per_rank",
    "ring_all_reduce",
    "ring_worker",
]


def local_numel(tensors) -> int:
    """How many numbers of ``tensors`` this rank stores: a DTensor counts its local shard only.

    >>> local_numel([torch.zeros(3, 4), torch.zeros(5)])
    17
    """
    total = 0
    for t in tensors:
        if t is None:
            continue
        total += (t.to_local() if hasattr(t, "to_local") else t).numel()
    return total


def _optimizer_numel(opt: torch.optim.Optimizer) -> int:
    """Numbers held in the optimiser's per-parameter state (AdamW: the two moments; not the
    step)."""
    return local_numel(
        v for s in opt.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v)
    )


def _train(
    model, forward, opt, ids: Tensor, targets: Tensor, rank: int, world_size: int
) -> list[float]:
    """Steps of AdamW on this rank's slice of each batch; returns the whole batch's mean loss per
    step."""
    losses = []
    for x, y in zip(ids, targets):  # ids: (steps, B, T)
        rows = shard_range(x.shape[0], rank, world_size)
        loss = lm_loss(forward(x[rows]), y[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # equal slices: the mean of the slice means is the batch mean
        losses.append(mean.item() / world_size)
    return losses


def sharded_training_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, lr: float
) -> dict:
    """``ids.shape[0]`` AdamW steps from ``state``, first under ZeRO-1, then under FSDP2 (ZeRO-3).

    ``ids``, ``targets``: (steps, B, T), one batch per step; each rank takes its B / world_size
    rows.
    Returns, per method, the batch losses, the final weights (gathered in full) and how many
    numbers of weights, gradients and optimiser state this rank holds.
    """
    out = {}
    # ---- ZeRO-1: DDP for the gradients, ZeroRedundancyOptimizer for the moments
    model = worker_model(config, state)
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)
    losses = _train(model, ddp, opt, ids, targets, rank, world_size)
    out["zero1"] = {
        "losses": losses,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "held": {
            "weights": local_numel(model.parameters()),
            "gradients": local_numel(p.grad for p in model.parameters()),
            "optimizer": _optimizer_numel(opt.optim),
        },
    }
    # ---- ZeRO-3: FSDP2, every block a unit that is gathered for its forward and backward
    model = worker_model(config, state)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = _train(model, model, opt, ids, targets, rank, world_size)
    out["fsdp"] = {
        "losses": losses,
        "state": {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()
        },
        "held": {
            "weights": local_numel(model.parameters()),
            "gradients": local_numel(p.grad for p in model.parameters()),
            "optimizer": _optimizer_numel(opt),
        },
    }
    return out


# =============================================================================================
# The all-reduce as a reduce-scatter and an all-gather around a ring
# =============================================================================================


def ring_bytes_per_rank(n_bytes: int, world_size: int) -> dict[str, float]:
    """Bytes each rank sends in ring collectives on ``n_bytes`` per rank among ``world_size`` ranks.

    >>> ring_bytes_per_rank(1200, 4)
    {'reduce-scatter': 900.0, 'all-gather': 900.0, 'all-reduce': 1800.0}
    """
    check_int("n_bytes", n_bytes, 0)
    check_positive_int("world_size", world_size)
    R = world_size
    half = (R - 1) * n_bytes / R
    return {"reduce-scatter": half, "all-gather": half, "all-reduce": 2 * half}


def _exchange(chunk: Tensor, like: Tensor, rank: int, world: int, group) -> Tensor:
    """Send ``chunk`` to the next rank of the ring while receiving a tensor shaped ``like`` from the
    previous."""
    buf = torch.empty_like(like)
    req = dist.isend(chunk.contiguous(), (rank + 1) % world, group=group)
    dist.recv(buf, (rank - 1) % world, group=group)
    req.wait()
    return buf


def ring_all_reduce(x: Tensor, group=None) -> tuple[Tensor, dict[str, int]]:
    """The sum of ``x`` over the ranks, computed as a ring reduce-scatter then a ring all-gather.

    The flattened x is cut into R chunks. In step k of the reduce-scatter, rank r sends chunk
    (r - k) mod R to rank r + 1 and adds the chunk (r - k - 1) mod R that rank r - 1 sends it: after
    R - 1 steps rank r holds the full sum of chunk (r + 1) mod R. In step k of the all-gather it
    sends the summed chunk (r + 1 - k) mod R on and stores chunk (r - k) mod R. Returns the sum
    (shaped like x) and the bytes this rank sent in each phase.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = list(x.detach().flatten().clone().tensor_split(world))
    sent = {"reduce-scatter": 0, "all-gather": 0}
    for k in range(world - 1):  # reduce-scatter
        out, into = (rank - k) % world, (rank - k - 1) % world
        chunks[into] = chunks[into] + _exchange(chunks[out], chunks[into], rank, world, group)
        sent["reduce-scatter"] += chunks[out].numel() * chunks[out].element_size()
    for k in range(world - 1):  # all-gather
        out, into = (rank + 1 - k) % world, (rank - k) % world
        chunks[into] = _exchange(chunks[out], chunks[into], rank, world, group)
        sent["all-gather"] += chunks[out].numel() * chunks[out].element_size()
    return torch.cat(chunks).view_as(x), sent


def ring_worker(rank: int, world_size: int, xs: Tensor) -> dict:
    """Rank r all-reduces ``xs[r]`` twice, with :func:`ring_all_reduce` and with
    ``dist.all_reduce``."""
    total, sent = ring_all_reduce(xs[rank])
    reference = xs[rank].clone()
    dist.all_reduce(reference)
    return {"ring": total, "all_reduce": reference, "sent": sent}
