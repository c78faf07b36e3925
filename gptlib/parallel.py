"""Chapter 10: scaling out on ``torch.distributed`` — data, tensor, pipeline and sequence parallelism.

Every piece here runs on PyTorch's own distributed engine (gloo between CPU processes, nccl
between GPUs); nothing is a home-made message layer. Processes are started by
:func:`run_distributed`, which wraps ``torch.multiprocessing`` and always cleans up.

    data parallel      each rank: a slice of the batch; gradients all-reduced (DDP)
    tensor parallel    MLP:  phi(X W_in^r + b_in^r) W_out^r summed over ranks r  (one all-reduce)
                       attn: heads split across ranks, sum_r z^r W_O^r             (one all-reduce)
    pipeline parallel  stage r holds layers L_r; micro-batches flow by send/recv (GPipe)
    sequence parallel  rank r holds positions T_r; keys and values go round a ring,
                       softmax accumulated online (running max m, running sum l)
    arithmetic         training FLOPs ~ 6 N D (+ 6 n_layers n_ctx d_attn D for attention)

Worker functions (``*_worker``) are module-level so that spawned processes can import them; they
compute on the CPU (gloo). Under nccl each process would move its model and tensors to its GPU.
"""

from __future__ import annotations

import copy
import math
import multiprocessing.connection
import os
import signal
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention, attention, causal_mask
from .block import Block
from .mlp import ACTIVATIONS, MLP

__all__ = [
    "DistributedError",
    "free_port",
    "run_distributed",
    "shard_range",
    "copy_to_parallel",
    "reduce_from_parallel",
    "TensorParallelMLP",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "stage_layers",
    "gpipe_schedule",
    "timetable",
    "bubble_fraction",
    "gpipe_bubble",
    "online_softmax_update",
    "blockwise_attention",
    "ring_attention",
    "forward_flops_per_token",
    "training_flops",
    "model_flops_utilization",
    "matmul_flops_per_s",
    "ddp_worker",
    "fsdp_worker",
    "tensor_parallel_worker",
    "pipeline_worker",
    "ring_attention_worker",
]


# =============================================================================================
# Starting and stopping processes
# =============================================================================================


class DistributedError(RuntimeError):
    """A worker of :func:`run_distributed` failed (its traceback is in the message) or timed out."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is listening on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n.startswith("lo")), None)


def _entry(rank: int, fn: Callable, args: tuple, world_size: int, backend: str, port: int, out_dir: str) -> None:
    """What each spawned process runs: join the group, call ``fn``, save its result, leave."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        lo = _loopback_interface()  # keep gloo's own connections on 127.0.0.1 too
        if lo is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = lo
    torch.set_num_threads(1)  # world_size processes share the cores
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        tmp = os.path.join(out_dir, f"rank{rank}.pt.tmp")
        torch.save(result, tmp)
        os.replace(tmp, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w", encoding="utf-8") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _stop(processes: list) -> None:
    """Terminate (then kill) every process still alive and reap them all: no orphans, no zombies."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join()


def run_distributed(
    fn: Callable,
    *args: Any,
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float = 300.0,
    port: int | None = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes; return their results.

    Each process joins a ``torch.distributed`` process group (``backend`` gloo on CPUs, nccl on
    GPUs) through MASTER_ADDR=127.0.0.1 and MASTER_PORT=``port`` (a free port by default), with
    one torch thread. Results come back in rank order; they must be what
    ``torch.load(weights_only=True)`` accepts (tensors, numbers, strings, lists, tuples, dicts).

    If a worker raises, the others are terminated and :class:`DistributedError` is raised with
    the worker's traceback; after ``timeout`` seconds likewise. In every case all processes are
    reaped and the process groups destroyed before this function returns.
    ``fn`` must be importable by the spawned processes: a module-level function, not a lambda
    or a function defined in a notebook.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    qualname = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", None) == "__main__" or "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(f"fn must be a module-level function in an importable module, got {qualname or fn!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, and torch.cuda.is_available() is False")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    port = free_port() if port is None else port
    with tempfile.TemporaryDirectory(prefix="gptlib-dist-") as out_dir:
        ctx = mp.start_processes(
            _entry, args=(fn, args, world_size, backend, port, out_dir), nprocs=world_size, join=False, start_method="spawn"
        )
        processes = list(ctx.processes)
        failed = None
        try:
            deadline = time.monotonic() + timeout
            running = {p.sentinel: rank for rank, p in enumerate(processes)}
            while running:
                left = deadline - time.monotonic()
                if left <= 0:
                    still = sorted(running.values())
                    raise DistributedError(f"{fn.__name__} timed out after {timeout} s (ranks {still} still running)")
                for sentinel in multiprocessing.connection.wait(list(running), timeout=min(left, 1.0)):
                    rank = running.pop(sentinel)
                    processes[rank].join()
                    if processes[rank].exitcode != 0:
                        failed = (rank, processes[rank].exitcode)
                        time.sleep(0.2)  # let a rank that failed at the same moment finish its report
                        break
                if failed:
                    break
        finally:
            _stop(processes)
            for f in ctx.error_files:
                if f and os.path.exists(f):
                    os.unlink(f)
        if failed:
            raise DistributedError(_failure_message(fn, *failed, out_dir))
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True) for r in range(world_size)]


def _failure_message(fn: Callable, rank: int, exitcode: int, out_dir: str) -> str:
    """The traceback of the rank that failed first (the others often fail because it did)."""
    errs = [os.path.join(out_dir, f) for f in os.listdir(out_dir) if f.endswith(".err")]
    if errs:
        errs.sort(key=lambda f: os.stat(f).st_mtime_ns)
        first = int(os.path.basename(errs[0])[4:-4])
        with open(errs[0], encoding="utf-8") as fh:
            msg = f"rank {first} of {fn.__name__} failed:\n{fh.read()}"
        others = sorted(int(os.path.basename(f)[4:-4]) for f in errs[1:])
        if others:
            msg += f"(then rank(s) {others} failed too, after it)\n"
        return msg
    if exitcode < 0:
        try:
            how = f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    return f"rank {rank} of {fn.__name__} died with {how}"


# =============================================================================================
# Tensor parallelism (Megatron-LM): split weight matrices, one all-reduce per layer
# =============================================================================================


def shard_range(n: int, rank: int, world_size: int) -> slice:
    """The contiguous block of ``n`` items (columns, rows, heads, layers) that ``rank`` owns.

    >>> shard_range(8, 1, 2)
    slice(4, 8, None)
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if n % world_size:
        raise ValueError(f"world_size={world_size} must divide n={n}")
    size = n // world_size
    return slice(rank * size, (rank + 1) * size)


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
        self.phi = ACTIVATIONS[mlp.activation]
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
        y = reduce_from_parallel(self.partial(copy_to_parallel(x, self.group)), self.group)  # (..., d_model)
        return y if self.b_out is None else y + self.b_out


class TensorParallelAttention(nn.Module):
    """Rank ``rank``'s share of a causal :class:`~gptlib.attention.MultiHeadAttention`: a block of heads.

    Rank r owns heads H_r: the columns of W_Q, W_K, W_V (and b_Q, b_K, b_V) that belong to them
    and the matching rows of W_O. A layer is the sum of its heads, so

        Attn(X) = sum_r  concat_{h in H_r}(A^h X W_V^h) W_O[H_r rows, :]  +  b_O,

    one all-reduce per layer, b_O added once.
    """

    def __init__(self, attn: MultiHeadAttention, rank: int, world_size: int, group=None):
        super().__init__()
        if not attn.causal:
            raise ValueError("attn must be causal (the book's attention layers are)")
        heads = shard_range(attn.n_heads, rank, world_size)
        cols = slice(heads.start * attn.d_head, heads.stop * attn.d_head)
        self.d_model, self.d_head, self.group = attn.d_model, attn.d_head, group
        self.n_heads_local = heads.stop - heads.start
        self.W_Q, self.W_K, self.W_V = (_param(W[:, cols]) for W in (attn.W_Q, attn.W_K, attn.W_V))  # (d_model, n_local*d_head)
        self.b_Q, self.b_K, self.b_V = (_param(None if b is None else b[cols]) for b in (attn.b_Q, attn.b_K, attn.b_V))
        self.W_O = _param(attn.W_O[cols, :])  # (n_local*d_head, d_model)
        self.b_O = _param(attn.b_O)  # (d_model,): replicated

    def _heads(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        y = x @ W if b is None else x @ W + b  # (B, T, n_local*d_head)
        return y.view(B, T, self.n_heads_local, self.d_head).transpose(1, 2)  # (B, n_local, T, d_head)

    def partial(self, x: Tensor) -> Tensor:
        """This rank's heads, summed through their rows of W_O: (B, T, d_model)."""
        B, T, _ = x.shape
        q, k, v = (self._heads(x, W, b) for W, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        z, _ = attention(q, k, v, causal_mask(T, device=x.device))  # (B, n_local, T, d_head)
        z = z.transpose(1, 2).reshape(B, T, self.n_heads_local * self.d_head)  # (B, T, n_local*d_head)
        return z @ self.W_O  # (B, T, d_model)

    def forward(self, x: Tensor) -> Tensor:
        y = reduce_from_parallel(self.partial(copy_to_parallel(x, self.group)), self.group)  # (B, T, d_model)
        return y if self.b_O is None else y + self.b_O


class TensorParallelBlock(nn.Module):
    """A :class:`~gptlib.block.Block` with its attention and MLP split across ranks.

    LayerNorms are replicated (every rank holds the whole residual stream); each block costs
    two all-reduces forward (after attention, after the MLP) and two backward.
    """

    def __init__(self, block: Block, rank: int, world_size: int, group=None):
        super().__init__()
        self.kind = block.kind
        self.ln_1 = copy.deepcopy(block.ln_1)  # replicated: every rank holds the whole residual stream
        self.ln_2 = None if block.ln_2 is None else copy.deepcopy(block.ln_2)
        self.attn = TensorParallelAttention(block.attn, rank, world_size, group)
        self.mlp = TensorParallelMLP(block.mlp, rank, world_size, group)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "pre_ln":
            y = x + self.attn(self.ln_1(x))  # (B, T, d_model)
            return y + self.mlp(self.ln_2(y))
        if self.kind == "post_ln":
            y = self.ln_1(x + self.attn(x))
            return self.ln_2(y + self.mlp(y))
        h = self.ln_1(x)  # parallel block
        return x + self.attn(h) + self.mlp(h)


# =============================================================================================
# Pipeline parallelism (GPipe): stages, micro-batches, the schedule and its bubble
# =============================================================================================


def stage_layers(n_layers: int, stage: int, n_stages: int) -> range:
    """The layers (block indices) held by pipeline ``stage`` of ``n_stages``: a contiguous run.

    >>> list(stage_layers(4, 1, 2))
    [2, 3]
    """
    s = shard_range(n_layers, stage, n_stages)
    return range(s.start, s.stop)


def gpipe_schedule(n_stages: int, n_micro: int) -> list[list[str]]:
    """The GPipe timetable: ``grid[stage][slot]`` is ``"F3"``, ``"B0"``, … or ``""`` (idle).

    Every stage runs the forwards F0..F(m-1), then the backwards B(m-1)..B0, one per time slot.
    A forward needs the previous stage's forward of the same micro-batch; a backward the next
    stage's backward. Each operation takes the first slot that satisfies both (a logical clock).

    >>> [" ".join(op or "." for op in row) for row in gpipe_schedule(2, 2)]
    ['F0 F1 . . B1 B0', '. F0 F1 B1 B0 .']
    """
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    p, m = n_stages, n_micro
    slot: dict[tuple[str, int, int], int] = {}  # (kind, micro-batch, stage) -> slot
    for s in range(p):
        clock = 0
        for j in range(m):
            clock = max(clock, slot[("F", j, s - 1)] + 1 if s else 0)
            slot[("F", j, s)] = clock
            clock += 1
    for s in reversed(range(p)):
        clock = slot[("F", m - 1, s)] + 1
        for j in reversed(range(m)):
            clock = max(clock, slot[("B", j, s + 1)] + 1 if s < p - 1 else 0)
            slot[("B", j, s)] = clock
            clock += 1
    n_slots = max(slot.values()) + 1
    grid = [[""] * n_slots for _ in range(p)]
    for (kind, j, s), t in slot.items():
        grid[s][t] = f"{kind}{j}"
    return grid


def timetable(logs: list[list[tuple[str, int]]]) -> list[list[str]]:
    """The (stage, slot) grid recorded by the stages' logs of (operation, slot) pairs.

    >>> timetable([[("F0", 0), ("B0", 3)], [("F0", 1), ("B0", 2)]])
    [['F0', '', '', 'B0'], ['', 'F0', 'B0', '']]
    """
    if not logs or not any(logs):
        raise ValueError("logs must hold at least one operation")
    grid = [[""] * (max(t for log in logs for _, t in log) + 1) for _ in logs]
    for s, log in enumerate(logs):
        for op, t in log:
            if grid[s][t]:
                raise ValueError(f"logs: stage {s} has two operations in slot {t}")
            grid[s][t] = op
    return grid


def bubble_fraction(grid: list[list[str]]) -> float:
    """The fraction of (stage, slot) cells in a timetable where the stage is idle.

    >>> bubble_fraction([["F0", ""], ["", "F0"]])
    0.5
    """
    cells = sum(len(row) for row in grid)
    if cells == 0:
        raise ValueError("grid must not be empty")
    return sum(op == "" for row in grid for op in row) / cells


def gpipe_bubble(n_stages: int, n_micro: int) -> float:
    """GPipe's bubble fraction (p - 1) / (m + p - 1) for p stages and m micro-batches.

    >>> gpipe_bubble(2, 4)
    0.2
    """
    if n_stages < 1 or n_micro < 1:
        raise ValueError(f"n_stages and n_micro must be >= 1, got {n_stages}, {n_micro}")
    return (n_stages - 1) / (n_micro + n_stages - 1)


# =============================================================================================
# Sequence parallelism: blockwise (online) softmax and ring attention
# =============================================================================================


def online_softmax_update(
    state: tuple[Tensor, Tensor, Tensor] | None, scores: Tensor, v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one block of keys into a running softmax-weighted sum.

    ``state = (m, l, acc)``: the running row maximum m (..., T, 1), the running sum
    l = sum_j exp(s_j - m) (..., T, 1) and acc = sum_j exp(s_j - m) v_j (..., T, d_head), all over
    the key blocks seen so far. A new block with scores S (..., T, T_b) (-inf where masked) and
    values V (..., T_b, d_head) gives m' = max(m, rowmax S) and

        l'   = l   exp(m - m') + sum_j exp(S_j - m'),
        acc' = acc exp(m - m') + exp(S - m') V.

    After the last block, acc / l is exactly softmax(all scores) @ all values.
    """
    block_max = scores.amax(dim=-1, keepdim=True)  # (..., T, 1)
    m_new = block_max if state is None else torch.maximum(state[0], block_max)
    # A row that has seen only masked keys keeps m = -inf; shift it by 0 to avoid (-inf) - (-inf).
    shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    p = torch.exp(scores - shift)  # (..., T, T_b)
    l_new, acc_new = p.sum(dim=-1, keepdim=True), p @ v
    if state is not None:
        m, l, acc = state
        scale = torch.exp(torch.where(torch.isfinite(m), m, shift) - shift)  # (..., T, 1); 0 rows stay 0
        l_new, acc_new = l * scale + l_new, acc * scale + acc_new
    return m_new, l_new, acc_new


def blockwise_attention(q: Tensor, k: Tensor, v: Tensor, n_blocks: int, causal: bool = True) -> Tensor:
    """Causal attention computed one key block at a time with :func:`online_softmax_update`.

    Never holds more than a (T, T / n_blocks) slice of the scores; equals
    :func:`gptlib.attention.attention` (which holds all T x T of them).
    """
    T = k.shape[-2]
    s = shard_range(T, 0, n_blocks)
    size = s.stop
    mask = causal_mask(q.shape[-2], T, device=q.device) if causal else None
    state = None
    for b in range(n_blocks):
        cols = slice(b * size, (b + 1) * size)
        scores = q @ k[..., cols, :].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T_q, T/n_blocks)
        if mask is not None:
            scores = scores + mask[:, cols]
        state = online_softmax_update(state, scores, v[..., cols, :])
    _, l, acc = state
    return acc / l


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None) -> Tensor:
    """Causal attention over a sequence sharded across ranks: K and V travel round a ring.

    Rank r holds the queries, keys and values of positions [r T_r, (r+1) T_r), each
    (..., T_r, d_head). In step t = 0, 1, …, world_size-1 it holds the key/value block of rank
    (r - t) mod world_size, folds it into an online softmax, and passes it on to rank r+1 while
    receiving the next from rank r-1 (the sends overlap the computation). Blocks from later
    positions are entirely masked by causality and are skipped. Returns this rank's rows of the
    attention output, (..., T_r, d_head).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    T_r = q.shape[-2]
    if k.shape[-2] != T_r or v.shape[-2] != T_r:
        raise ValueError(f"q, k and v must hold the same positions, got {q.shape[-2]}, {k.shape[-2]}, {v.shape[-2]}")
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
            ops = [dist.P2POp(dist.isend, kv, nxt, group), dist.P2POp(dist.irecv, incoming, prv, group)]
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


# =============================================================================================
# The arithmetic of training
# =============================================================================================


def forward_flops_per_token(config, n_ctx: int | None = None, causal: bool = False) -> int:
    """Floating-point operations of one forward pass, per token, counting matrix products only.

    2 per weight of every matrix product (one multiply, one add), with N_mm = n_layers
    (4 d_model d_attn + 2 d_model d_mlp) + d_model d_vocab weights, plus the attention scores and
    the weighted sum of values, 2 * 2 n_ctx d_attn per layer. ``causal=True`` counts only the
    key positions a query may see, on average (n_ctx + 1) / 2 of n_ctx. The embedding lookup,
    biases, LayerNorms and softmax are O(d_model) per token and left out.

    >>> from gptlib.model import GPTConfig
    >>> forward_flops_per_token(GPTConfig.preset("tiny"))
    294912
    """
    T = config.n_ctx if n_ctx is None else n_ctx
    if T < 1:
        raise ValueError(f"n_ctx must be >= 1, got {T}")
    d, d_attn, L = config.d_model, config.n_heads * config.d_head, config.n_layers
    n_mm = L * (4 * d * d_attn + 2 * d * config.d_mlp) + d * config.d_vocab
    keys = (T + 1) / 2 if causal else T
    return int(2 * n_mm + L * 4 * keys * d_attn)


def training_flops(config, tokens: int, n_ctx: int | None = None, causal: bool = False) -> int:
    """FLOPs to train on ``tokens`` tokens: 3 forward passes' worth each (the backward costs two).

    >>> from gptlib.model import GPTConfig
    >>> training_flops(GPTConfig.preset("tiny"), 1000)
    884736000
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return 3 * forward_flops_per_token(config, n_ctx, causal) * tokens


def model_flops_utilization(model_flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """MFU: the model's FLOPs per second achieved, as a fraction of the hardware's peak.

    >>> model_flops_utilization(6e12, 10.0, 1e12)
    0.6
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak_flops_per_s must be > 0, got {peak_flops_per_s}")
    return model_flops / seconds / peak_flops_per_s


def matmul_flops_per_s(n: int = 512, repeats: int = 5, device: str | torch.device = "cpu", dtype=torch.float32) -> float:
    """The best FLOP/s of ``repeats`` (n x n) @ (n x n) products: a measured stand-in for peak.

    A GPU's peak comes from its data sheet (an A100: 312e12 bf16 FLOP/s); a CPU's is rarely
    published, so the book measures what a large matrix product reaches on it.
    """
    if n < 1 or repeats < 1:
        raise ValueError(f"n and repeats must be >= 1, got {n}, {repeats}")
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / max(best, 1e-9)


# =============================================================================================
# Workers: each runs on every rank under run_distributed and returns plain tensors and numbers
# =============================================================================================


def _build(config, state: dict) -> nn.Module:
    from .model import GPT

    model = GPT(config)
    model.load_state_dict(state)
    return model


def _lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over B*T tokens


def ddp_worker(rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, lr: float) -> dict:
    """Data parallel: this rank's slice of the batch through ``DistributedDataParallel``, one SGD step.

    Returns the loss on the slice, the (all-reduced) gradients and the weights after the step.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _build(config, state)
    ddp = DDP(model)  # broadcasts rank 0's weights; hooks average the gradients in backward
    rows = shard_range(ids.shape[0], rank, world_size)
    loss = _lm_loss(ddp(ids[rows]), targets[rows])
    loss.backward()  # the all-reduce happens here, bucket by bucket
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return {"loss": loss.item(), "grads": grads, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def fsdp_worker(rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor) -> dict:
    """Fully sharded data parallel (FSDP2 ``fully_shard``): each rank stores 1/world_size of every weight.

    Returns how many numbers of the model this rank holds, the loss on its slice of the batch,
    and the full gradients (gathered from the shards, for comparison).
    """
    from torch.distributed.fsdp import fully_shard

    model = _build(config, state)
    for blk in model.blocks:
        fully_shard(blk)  # each block's weights are gathered just before it runs, then freed
    fully_shard(model)
    held = sum(p.to_local().numel() for p in model.parameters())  # this rank's shard (rows dim 0)
    rows = shard_range(ids.shape[0], rank, world_size)
    loss = _lm_loss(model(ids[rows]), targets[rows])
    loss.backward()  # gradients are reduce-scattered: each rank keeps its shard's rows
    grads = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {"held": held, "loss": loss.item(), "grads": grads}


def tensor_parallel_worker(rank: int, world_size: int, config, state: dict, x: Tensor, layer: int = 0) -> dict:
    """Tensor parallel: block ``layer``'s MLP, attention and the whole block split across ranks.

    Returns each output, the gradient of sum(output * probe) with respect to the input, and this
    rank's shard gradients, for comparison with the unsplit modules.
    """
    block = _build(config, state).blocks[layer]
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


def pipeline_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, n_micro: int
) -> dict:
    """Pipeline parallel (GPipe) over ``world_size`` stages: all forwards, then all backwards.

    Stage 0 embeds, the last stage also applies ln_f, the unembedding and the loss; activations
    go forward and their gradients back with ``dist.send`` / ``dist.recv``. Each message carries
    a logical clock, so every operation gets the time slot it actually ran in. With tied
    embeddings, W_E's gradient lives half on the first stage, half on the last: they add them.

    Returns this stage's gradients, its (op, slot) log and, on the last stage, loss and logits.
    """
    model = _build(config, state)
    p, last = world_size, world_size - 1
    layers = stage_layers(config.n_layers, rank, p)
    B, T = ids.shape
    rows = [shard_range(B, j, n_micro) for j in range(n_micro)]
    b = B // n_micro
    clock, log = 0, []

    def recv(shape, src) -> tuple[Tensor, int]:
        t, c = torch.empty(shape), torch.zeros(1, dtype=torch.int64)
        dist.recv(t, src)
        dist.recv(c, src)
        return t, int(c)

    def send(t: Tensor, dst: int) -> None:
        dist.send(t.contiguous(), dst)
        dist.send(torch.tensor([clock], dtype=torch.int64), dst)

    def tick(op: str, ready: int = 0) -> None:
        nonlocal clock
        clock = max(clock, ready)
        log.append((op, clock))
        clock += 1

    inputs, outputs, losses, logits_all = [], [], [], []
    for j in range(n_micro):  # ---- forwards
        if rank == 0:
            x_in, ready = None, 0
            x = model.embed(ids[rows[j]]) + model.pos(T)  # (b, T, d_model)
        else:
            x_in, ready = recv((b, T, config.d_model), rank - 1)
            x_in.requires_grad_(True)
            x = x_in
        for i in layers:
            x = model.blocks[i](x)  # (b, T, d_model)
        tick(f"F{j}", ready)
        if rank == last:
            logits = model.unembed(model.ln_f(x))  # (b, T, d_vocab)
            losses.append(_lm_loss(logits, targets[rows[j]]) / n_micro)
            logits_all.append(logits.detach())
        else:
            send(x.detach(), rank + 1)
        inputs.append(x_in)
        outputs.append(x)
    for j in reversed(range(n_micro)):  # ---- backwards
        if rank == last:
            ready = 0
            losses[j].backward()
        else:
            grad, ready = recv((b, T, config.d_model), rank + 1)
            outputs[j].backward(grad)
        tick(f"B{j}", ready)
        if rank > 0:
            send(inputs[j].grad, rank - 1)
    W_E = model.embed.W_E
    if config.tie_weights and p > 1:
        ends = dist.new_group([0, last])  # every rank must take part in creating a group
        if rank in (0, last):
            if W_E.grad is None:
                W_E.grad = torch.zeros_like(W_E)
            dist.all_reduce(W_E.grad, group=ends)
    grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}
    out = {"grads": grads, "log": log}
    if rank == last:
        out["loss"] = float(sum(l.item() for l in losses))
        out["logits"] = torch.cat(logits_all)
    return out


def ring_attention_worker(rank: int, world_size: int, q: Tensor, k: Tensor, v: Tensor) -> dict:
    """Sequence parallel: this rank takes its block of positions of q, k, v and runs :func:`ring_attention`.

    q, k, v are the whole sequence's (..., T, d_head); each rank keeps only its own T / world_size
    positions of them, as it would if it had computed them from its share of the tokens.
    """
    pos = shard_range(q.shape[-2], rank, world_size)
    q_r = q[..., pos, :].clone()
    z = ring_attention(q_r, k[..., pos, :].contiguous(), v[..., pos, :].contiguous())
    return {"z": z, "positions": [pos.start, pos.stop]}
