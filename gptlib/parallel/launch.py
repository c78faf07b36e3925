"""Starting and stopping the processes of a distributed job (Chapter 10's infrastructure).

:func:`run_distributed` starts ``world_size`` processes with ``torch.multiprocessing``, makes each
join a ``torch.distributed`` process group on 127.0.0.1 (gloo between CPU processes, nccl between
GPUs), calls a worker function in each and returns their results in rank order. Whatever happens,
every process is reaped and every process group destroyed before it returns: a failing rank's
traceback comes back as :class:`DistributedError`, the others are terminated.

A fresh Python process spends seconds importing PyTorch, far longer than the small workers of the
book run. So the ranks are forked from a server process (multiprocessing's ``forkserver``) that
imports :mod:`gptlib.parallel`, and with it PyTorch, once, on the first call, and serves every later
call of the same program; where there is no ``fork`` (Windows) each rank is spawned and imports them
itself. The server computes nothing (no thread pool, no CUDA) before it forks. :func:`run_together`
runs several workers one after another in a single process group. The workers of
:mod:`gptlib.parallel` build their model with :func:`worker_model` and score it with
:func:`lm_loss`.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..files import load_tree, save_tree
from ..model import GPT
from ..runtime import check_float, check_int
from ..training import lm_loss  # re-exported: the workers' loss

__all__ = [
    "DistributedError",
    "free_port",
    "run_distributed",
    "run_together",
    "shard_range",
    "worker_model",
    "lm_loss",
]


# How the ranks start: forked from a server that has imported gptlib.parallel (see above).
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
_PRELOAD = ["gptlib.parallel"]  # what the server imports before it forks the first rank


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


def _entry(
    rank: int, fn: Callable, args: tuple, world_size: int, backend: str, port: int, out_dir: str
) -> None:
    """What each rank's process runs: join the group, call ``fn``, save its result, leave."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
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
        save_tree(os.path.join(out_dir, f"rank{rank}.safetensors"), result)  # one atomic write
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w", encoding="utf-8") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    # The result is on disk and the group is gone: leave now. The interpreter's normal shutdown
    # in a process that has loaded torch and gloo spends seconds in native teardown (longer
    # than the book's workers run), and nothing is left for it to do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def _check_importable(fn: Callable, name: str) -> None:
    """Raise ValueError unless a new process can import ``fn`` (a module-level function)."""
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {type(fn).__name__}")
    qualname = getattr(fn, "__qualname__", "")
    if (
        getattr(fn, "__module__", None) == "__main__"
        or "<lambda>" in qualname
        or "<locals>" in qualname
    ):
        raise ValueError(
            f"{name} must be a module-level function in an importable module, got "
            f"{qualname or fn!r}"
        )


def run_distributed(
    fn: Callable,
    *args: Any,
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float = 300.0,
    port: int | None = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return their
    results.

    Each process joins a ``torch.distributed`` process group (``backend`` gloo on CPUs, nccl on
    GPUs) through MASTER_ADDR=127.0.0.1 and MASTER_PORT=``port`` (a free port by default), with
    one torch thread. Results come back in rank order, passed as gptlib files
    (:func:`gptlib.files.save_tree`): they must be tensors, numbers, strings, None, or lists,
    tuples and dicts of these, and their tensors come back on the CPU.

    If a worker raises, the others are terminated and :class:`DistributedError` is raised with
    the worker's traceback; after ``timeout`` seconds likewise. In every case all processes are
    reaped and the process groups destroyed before this function returns.
    ``fn`` must be importable by the new processes: a module-level function, not a lambda
    or a function defined in a notebook. The processes start with :data:`START_METHOD`; under
    ``forkserver`` they inherit the environment variables of the first call (the server's).
    """
    _check_importable(fn, "fn")
    check_int("world_size", world_size, lo=1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, and torch.cuda.is_available() is False")
    check_float("timeout", timeout, 0.0, lo_open=True)
    port = free_port() if port is None else check_int("port", port, 1, 65535)
    if START_METHOD == "forkserver":  # no effect once the server runs
        mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    with tempfile.TemporaryDirectory(prefix="gptlib-dist-") as out_dir:
        ctx = mp.start_processes(
            _entry,
            args=(fn, args, world_size, backend, port, out_dir),
            nprocs=world_size,
            join=False,
            start_method=START_METHOD,
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
                    raise DistributedError(
                        f"{fn.__name__} timed out after {timeout} s (ranks {still} still running)"
                    )
                for sentinel in multiprocessing.connection.wait(
                    list(running), timeout=min(left, 1.0)
                ):
                    rank = running.pop(sentinel)
                    processes[rank].join()
                    if processes[rank].exitcode != 0:
                        failed = (rank, processes[rank].exitcode)
                        time.sleep(
                            0.2
                        )  # let a rank that failed at the same moment finish its report
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
        return [load_tree(os.path.join(out_dir, f"rank{r}.safetensors")) for r in range(world_size)]


def _run_jobs(rank: int, world_size: int, jobs: dict) -> dict:
    """The worker of :func:`run_together`: each job in turn, a barrier after each; results by
    name."""
    out = {}
    for name, (fn, args) in jobs.items():
        try:
            out[name] = fn(rank, world_size, *args)
        except Exception as e:
            raise RuntimeError(f"job {name!r} ({fn.__name__}) failed on rank {rank}") from e
        dist.barrier()  # no job starts while another rank still works on the previous one
    return out


def run_together(
    jobs: dict, *, world_size: int = 2, backend: str = "gloo", timeout: float = 300.0
) -> dict:
    """Run several workers in one set of processes: ``{name: (fn, args)}`` -> ``{name: results}``.

    Equivalent to ``{name: run_distributed(fn, *args) for name, (fn, args) in jobs.items()}``,
    with each ``results`` a list in rank order, but the processes are started, and PyTorch
    imported in them, once: the jobs run one after another, in the given order, in the same
    process group, with a barrier between them. A failing job's name is in the error.

    >>> run_together({"ddp": ("not a function", ())})
    Traceback (most recent call last):
    ...
    ValueError: jobs['ddp'] must be callable, got str
    """
    check_int("world_size", world_size, lo=1)
    check_float("timeout", timeout, 0.0, lo_open=True)
    if not isinstance(jobs, dict) or not jobs:
        raise ValueError(f"jobs must be a non-empty dict {{name: (fn, args)}}, got {jobs!r}")
    for name, job in jobs.items():
        if not (isinstance(job, tuple) and len(job) == 2 and isinstance(job[1], tuple)):
            raise ValueError(
                f"jobs[{name!r}] must be a pair (fn, args) with args a tuple, got {job!r}"
            )
        _check_importable(job[0], f"jobs[{name!r}]")
    results = run_distributed(
        _run_jobs, jobs, world_size=world_size, backend=backend, timeout=timeout
    )
    return {name: [r[name] for r in results] for name in jobs}


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


def worker_model(config, state: dict) -> GPT:
    """The model a worker computes with: a :class:`~gptlib.model.GPT` of ``config`` holding
    ``state``."""
    model = GPT(config)
    model.load_state_dict(state)
    return model


def shard_range(n: int, rank: int, world_size: int) -> slice:
    """The contiguous block of ``n`` items (columns, rows, heads, layers) that ``rank`` owns.

    >>> shard_range(8, 1, 2)
    slice(4, 8, None)
    """
    n = check_int("n", n, lo=0)
    world_size = check_int("world_size", world_size, lo=1)
    rank = check_int("rank", rank, 0, world_size - 1)
    if n % world_size:
        raise ValueError(f"world_size={world_size} must divide n={n}")
    size = n // world_size
    return slice(rank * size, (rank + 1) * size)
