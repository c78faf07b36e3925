"""Timing for the benchmarks and the sweeps: contenders measured in alternating rounds.

On a shared machine the speed of the CPU swings by a factor of two from one minute to the next, so a
time means something only next to the time of a peer measured at the same moment. Every benchmark of
the book (``bench/``) and the throughput axis of ``scripts/sweep.py`` therefore time their
contenders
in rounds: each round runs every contender once, the order reversed every other round so that none
always goes first, and the figures reported are medians and ratios within the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from .runtime import check_int

__all__ = ["alternating_rounds"]


def alternating_rounds(
    calls: Mapping[str, Callable[[], object]],
    rounds: int,
    *,
    warmup: int = 1,
    per_call: int = 1,
    sync: Callable[[], object] | None = None,
    after_round: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Seconds per unit of work of each call, one measurement per round.

    Each call first runs ``warmup`` times untimed. Then each of ``rounds`` rounds runs every call
    once,
    in the order of ``calls`` in even rounds and in reverse in odd ones. A measurement is the call's
    wall time divided by ``per_call`` (for a call that does several steps); ``sync`` runs before the
    clock starts and before it is read (e.g. ``torch.cuda.synchronize``, for work queued on a GPU).
    ``after_round`` runs, untimed, at the end of every round: a measurement that should see the same
    machine state as the calls, such as the matmul rate (:func:`gptlib.flops.matmul_flops_per_s`).

    >>> order = []
    >>> calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    >>> times = alternating_rounds(calls, 3, warmup=0)
    >>> order  # a first, then b first, then a first
    ['a', 'b', 'b', 'a', 'a', 'b']
    >>> {name: len(t) for name, t in times.items()}
    {'a': 3, 'b': 3}
    """
    check_int("rounds", rounds, lo=1)
    check_int("warmup", warmup, lo=0)
    check_int("per_call", per_call, lo=1)
    if not isinstance(calls, Mapping):
        raise ValueError(f"calls must be a mapping {{name: function}}, got {type(calls).__name__}")
    if not calls:
        raise ValueError("calls is empty: nothing to time")
    for name, call in calls.items():  # all checked before anything runs
        if not callable(call):
            raise ValueError(f"calls[{name!r}] must be callable, got {type(call).__name__}")
    for name, f in (("sync", sync), ("after_round", after_round)):
        if f is not None and not callable(f):
            raise ValueError(f"{name} must be callable or None, got {type(f).__name__}")
    sync = sync or (lambda: None)
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            t0 = time.perf_counter()
            calls[name]()
            sync()
            times[name].append((time.perf_counter() - t0) / per_call)
        if after_round is not None:
            after_round()
    return times
