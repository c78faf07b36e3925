"""Data parallelism: every rank holds the model and a slice of the batch.

The loss is a mean over the batch, so its gradient is the mean of the slices' gradients: one
all-reduce per step (``DistributedDataParallel``). Fully sharded data parallelism (FSDP2's
``fully_shard``) keeps the computation and stores 1/world_size of every weight on each rank.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from .launch import lm_loss, shard_range, worker_model

__all__ = ["ddp_worker", "fsdp_worker"]


def ddp_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, lr: float
) -> dict:
    """Data parallel: this rank's slice of the batch through ``DistributedDataParallel``, one SGD
    step.

    Returns the loss on the slice, the (all-reduced) gradients and the weights after the step.
    """
    model = worker_model(config, state)
    ddp = DDP(model)  # broadcasts rank 0's weights; hooks average the gradients in backward
    rows = shard_range(ids.shape[0], rank, world_size)
    loss = lm_loss(ddp(ids[rows]), targets[rows])
    loss.backward()  # the all-reduce happens here, bucket by bucket
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return {
        "loss": loss.item(),
        "grads": grads,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def fsdp_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor
) -> dict:
    """Fully sharded data parallel (FSDP2 ``fully_shard``): each rank stores 1/world_size of every
    weight.

    Returns how many numbers of the model this rank holds, the loss on its slice of the batch,
    and the full gradients (gathered from the shards, for comparison).
    """
    model = worker_model(config, state)
    for blk in model.blocks:
        fully_shard(blk)  # each block's weights are gathered just before it runs, then freed
    fully_shard(model)
    held = sum(p.to_local().numel() for p in model.parameters())  # this rank's shard (rows dim 0)
    rows = shard_range(ids.shape[0], rank, world_size)
    loss = lm_loss(model(ids[rows]), targets[rows])
    loss.backward()  # gradients are reduce-scattered: each rank keeps its shard's rows
    grads = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {"held": held, "loss": loss.item(), "grads": grads}
