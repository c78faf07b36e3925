"""Chapter 10: scaling out on ``torch.distributed``, one module per technique.

Every piece runs on PyTorch's own distributed engine (gloo between CPU processes, nccl between
GPUs); nothing is a home-made message layer.

    launch.py    run_distributed: spawn the ranks, join a process group, always clean up
    data.py      data parallel: each rank a slice of the batch, gradients all-reduced (DDP, FSDP)
    tensor.py    tensor parallel (Megatron-LM): MLP:  phi(X W_in^r + b_in^r) W_out^r summed over r
                                               attn: heads split across ranks, sum_r z^r W_O^r
    pipeline.py  pipeline parallel (GPipe): stage r holds layers L_r; micro-batches by send/recv
    context.py   context parallel (ring attention): rank r holds positions T_r; keys and values go
                 round a ring, the softmax accumulated online (running max m, running sum l)

The FLOP arithmetic of training is :mod:`gptlib.flops`. Worker functions (``*_worker``) are
module-level so that spawned processes can import them; they compute on the CPU (gloo). Under
nccl each process would move its model and tensors to its GPU.
"""

from .context import blockwise_attention, online_softmax_update, ring_attention, ring_attention_worker
from .data import ddp_worker, fsdp_worker
from .launch import DistributedError, free_port, run_distributed, shard_range
from .pipeline import (
    apply_blocks,
    bubble_fraction,
    embed_input,
    gpipe_bubble,
    gpipe_schedule,
    pipeline_worker,
    stage_layers,
    timetable,
    unembed_output,
)
from .tensor import (
    TensorParallelAttention,
    TensorParallelBlock,
    TensorParallelMLP,
    copy_to_parallel,
    reduce_from_parallel,
    tensor_parallel_worker,
)

__all__ = [
    "DistributedError",
    "free_port",
    "run_distributed",
    "shard_range",
    "ddp_worker",
    "fsdp_worker",
    "copy_to_parallel",
    "reduce_from_parallel",
    "TensorParallelMLP",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "tensor_parallel_worker",
    "embed_input",
    "apply_blocks",
    "unembed_output",
    "stage_layers",
    "gpipe_schedule",
    "timetable",
    "bubble_fraction",
    "gpipe_bubble",
    "pipeline_worker",
    "online_softmax_update",
    "blockwise_attention",
    "ring_attention",
    "ring_attention_worker",
]
