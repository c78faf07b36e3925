"""Chapter 10: scaling out on ``torch.distributed``, one module per technique.

Every piece runs on PyTorch's own distributed engine (gloo between CPU processes, nccl between
GPUs); nothing is a home-made message layer.

    launch.py    run_distributed: start the ranks, join a process group, always clean up
    data.py      data parallel: each rank a slice of the batch, gradients all-reduced (DDP, FSDP)
    tensor.py    tensor parallel (Megatron-LM): MLP:  phi(X W_in^r + b_in^r) W_out^r summed over r
                                               attn: heads split across ranks, sum_r z^r W_O^r
    pipeline.py  pipeline parallel (GPipe): stage r holds layers L_r; micro-batches by send/recv
    context.py   context parallel (ring attention): rank r holds positions T_r; keys and values go
                 round a ring, the softmax accumulated online (running max m, running sum l)
    sharding.py  Chapter 11: ZeRO-1 (ZeroRedundancyOptimizer) and FSDP2, losses equal to one process
    experts.py   Chapter 11: expert parallelism, tokens routed to their experts by all-to-all

The FLOP arithmetic of training is :mod:`gptlib.flops`. Worker functions (``*_worker``) are
module-level so that the ranks' processes can import them; they compute on the CPU (gloo). Under
nccl each process would move its model and tensors to its GPU.
"""

# Every public name of the five Chapter 10 modules (sharding and experts are imported as
# submodules), so that ``from gptlib.parallel import X`` finds it.
from . import context, data, launch, pipeline, tensor
from .context import *  # noqa: F403
from .data import *  # noqa: F403
from .launch import *  # noqa: F403
from .pipeline import *  # noqa: F403
from .tensor import *  # noqa: F403

__all__ = [*launch.__all__, *data.__all__, *tensor.__all__, *pipeline.__all__, *context.__all__]
