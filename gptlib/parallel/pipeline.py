"""Pipeline parallelism (GPipe, 1F1B): the decoder stack cut into stages, micro-batches passed
along.

Stage s of p holds a contiguous run of blocks (:func:`stage_layers`); the first also the
embedding, the last also ln_f, the unembedding and the loss. GPipe runs every micro-batch's
forward, then every backward in reverse; with m micro-batches each stage idles a fraction
(p - 1) / (m + p - 1) of the time, the bubble (:func:`gpipe_bubble`). 1F1B (Chapter 11)
interleaves forwards and backwards: the same bubble, but at most min(p - s, m) micro-batches'
activations held on stage s instead of m (:func:`stage_order`, :func:`pipeline_timetable`,
:func:`peak_in_flight`, :func:`scheduled_pipeline_worker`).

The stages compute exactly :meth:`gptlib.model.GPT.forward`, cut in three: the model's own
:meth:`~gptlib.model.GPT.input_stream` on the first stage, :func:`apply_blocks` on every stage and
:meth:`~gptlib.model.GPT.read_out` on the last; composed, they are ``model(ids)`` (the tests check
it, dropout included).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from ..efficiency import saved_tensor_bytes
from ..model import GPT
from ..runtime import check_int, check_positive_int
from .launch import lm_loss, shard_range, worker_model

__all__ = [
    "apply_blocks",
    "stage_layers",
    "gpipe_schedule",
    "timetable",
    "bubble_fraction",
    "gpipe_bubble",
    "pipeline_worker",
    "SCHEDULES",
    "stage_order",
    "pipeline_timetable",
    "peak_in_flight",
    "sum_tied_embedding_grad",
    "scheduled_pipeline_worker",
    "compare_schedules_worker",
]


def apply_blocks(model: GPT, layers: Iterable[int], x: Tensor) -> Tensor:
    """The residual stream after the blocks ``layers`` of ``model``, in order: (B, T, d_model)."""
    for i in layers:
        x = model.blocks[i](x)  # (B, T, d_model)
    return x


def stage_layers(n_layers: int, stage: int, n_stages: int) -> range:
    """The layers (block indices) held by pipeline ``stage`` of ``n_stages``: a contiguous run.

    >>> list(stage_layers(4, 1, 2))
    [2, 3]
    """
    n_layers = check_int("n_layers", n_layers, lo=1)
    n_stages = check_int("n_stages", n_stages, 1, n_layers)
    stage = check_int("stage", stage, 0, n_stages - 1)
    if n_layers % n_stages:
        raise ValueError(f"n_stages={n_stages} must divide n_layers={n_layers}")
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
    check_positive_int("n_stages", n_stages)
    check_positive_int("n_micro", n_micro)
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
    check_positive_int("n_stages", n_stages)
    check_positive_int("n_micro", n_micro)
    return (n_stages - 1) / (n_micro + n_stages - 1)


def pipeline_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, n_micro: int
) -> dict:
    """Pipeline parallel (GPipe) over ``world_size`` stages: all forwards, then all backwards.

    Stage 0 embeds (``model.input_stream``), every stage runs its blocks (:func:`apply_blocks`), the
    last also applies ln_f, the unembedding (``model.read_out``) and the loss; activations
    go forward and their gradients back by point-to-point messages. Each message carries a
    logical clock, so every operation gets the time slot it actually ran in. With tied
    embeddings, W_E's gradient lives half on the first stage, half on the last: they add them.

    Returns this stage's gradients, its (op, slot) log and, on the last stage, loss and logits
    (:func:`scheduled_pipeline_worker` with ``schedule="gpipe"``, which also reports memory).
    """
    return scheduled_pipeline_worker(
        rank, world_size, config, state, ids, targets, n_micro, "gpipe"
    )


# =============================================================================================
# Schedules: GPipe and 1F1B as per-stage orders of operations, timed by a logical clock
# =============================================================================================

SCHEDULES = ("gpipe", "1f1b")


def stage_order(schedule: str, stage: int, n_stages: int, n_micro: int) -> list[str]:
    """The operations stage ``stage`` runs, in order: ``"F3"`` forward of micro-batch 3, ``"B3"``
    its backward.

    GPipe: all m forwards, then the backwards in reverse. 1F1B (PipeDream-Flush, Narayanan et al.
    2021): w = min(p - s - 1, m) warm-up forwards, then alternately one forward and one backward,
    then the last w backwards; backwards run first-in, first-out.

    >>> stage_order("1f1b", 0, 2, 3), stage_order("1f1b", 1, 2, 3)
    (['F0', 'F1', 'B0', 'F2', 'B1', 'B2'], ['F0', 'B0', 'F1', 'B1', 'F2', 'B2'])
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_positive_int("n_stages", n_stages)
    check_positive_int("n_micro", n_micro)
    check_int("stage", stage, 0, n_stages - 1)
    m = n_micro
    if schedule == "gpipe":
        return [f"F{j}" for j in range(m)] + [f"B{j}" for j in reversed(range(m))]
    w = min(n_stages - stage - 1, m)
    ops = [f"F{j}" for j in range(w)]
    for i in range(m - w):
        ops += [f"F{w + i}", f"B{i}"]
    return ops + [f"B{j}" for j in range(m - w, m)]


def pipeline_timetable(schedule: str, n_stages: int, n_micro: int) -> list[list[str]]:
    """The (stage, slot) grid of a schedule: every operation takes one slot, the first after the
    stage's previous operation and after the one it depends on (F_j on stage s - 1 for F_j,
    B_j on stage s + 1 for B_j), as the logical clocks of the pipeline workers do.

    >>> pipeline_timetable("gpipe", 2, 2) == gpipe_schedule(2, 2)
    True
    >>> [" ".join(op or "." for op in row) for row in pipeline_timetable("1f1b", 2, 3)]
    ['F0 F1 . B0 F2 B1 . B2', '. F0 B0 F1 B1 F2 B2 .']
    """
    p = n_stages
    orders = [stage_order(schedule, s, p, n_micro) for s in range(p)]
    slot: dict[tuple[str, int], int] = {}  # (op, stage) -> slot
    pos, clock = [0] * p, [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                op = orders[s][pos[s]]
                dep = (
                    (op, s - 1)
                    if op[0] == "F" and s > 0
                    else (op, s + 1)
                    if op[0] == "B" and s < p - 1
                    else None
                )
                if dep is not None and dep not in slot:
                    break  # wait for the other stage
                t = max(clock[s], slot[dep] + 1 if dep else 0)
                slot[(op, s)], clock[s], pos[s], moved = t, t + 1, pos[s] + 1, True
        if not moved:  # pragma: no cover - both schedules are deadlock-free
            raise RuntimeError("the schedule deadlocks")
    grid = [[""] * (max(slot.values()) + 1) for _ in range(p)]
    for (op, s), t in slot.items():
        grid[s][t] = op
    return grid


def peak_in_flight(grid: list[list[str]]) -> list[int]:
    """Per stage, the most micro-batches whose forward has run and whose backward has not:
    the activations the stage must hold at once.

    >>> peak_in_flight(pipeline_timetable("gpipe", 2, 4))
    [4, 4]
    >>> peak_in_flight(pipeline_timetable("1f1b", 2, 4))
    [2, 1]
    """
    peaks = []
    for row in grid:
        live = peak = 0
        for op in row:
            live += (op[:1] == "F") - (op[:1] == "B")
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def sum_tied_embedding_grad(model: GPT, rank: int, world_size: int) -> None:
    """With W_U = W_E^T, the first stage (the embedding) and the last (the read-out) each hold a
    part of W_E's gradient: sum the two, on both, with one all-reduce between them. Every rank must
    call it (each takes part in creating the group); a single stage has nothing to sum."""
    last = world_size - 1
    if world_size == 1:
        return
    W_E = model.embed.W_E
    ends = dist.new_group([0, last])  # every rank must take part in creating a group
    if rank in (0, last):
        if W_E.grad is None:
            W_E.grad = torch.zeros_like(W_E)
        dist.all_reduce(W_E.grad, group=ends)


def scheduled_pipeline_worker(
    rank: int,
    world_size: int,
    config,
    state: dict,
    ids: Tensor,
    targets: Tensor,
    n_micro: int,
    schedule: str = "1f1b",
) -> dict:
    """Pipeline parallel over ``world_size`` stages, running this stage's :func:`stage_order` of
    ``schedule``.

    As :func:`pipeline_worker`, with any order of forwards and backwards: a stage receives before
    each forward (from stage - 1) and each backward (from stage + 1) and sends with ``dist.isend``,
    so that two stages sending to each other at the same moment (which 1F1B does) cannot block.
    Besides the gradients, the (op, slot) log and, on the last stage, loss and logits, it returns
    the peak number of micro-batches in flight on this stage and the peak bytes autograd held for
    them (counted with ``saved_tensors_hooks``, parameters left out).
    """
    model = worker_model(config, state)
    p, last = world_size, world_size - 1
    layers = stage_layers(config.n_layers, rank, p)
    B, T = ids.shape
    rows = [shard_range(B, j, n_micro) for j in range(n_micro)]
    b = B // n_micro
    clock, log, pending = 0, [], []
    inputs, outputs, losses, logits, saved = {}, {}, {}, {}, {}
    live = peak = live_bytes = peak_bytes = 0

    def recv(src: int) -> tuple[Tensor, int]:
        t, c = torch.empty(b, T, config.d_model), torch.zeros(1, dtype=torch.int64)
        dist.recv(t, src)
        dist.recv(c, src)
        return t, int(c)

    def send(t: Tensor, dst: int) -> None:
        msg = (t.contiguous(), torch.tensor([clock], dtype=torch.int64))
        pending.extend((dist.isend(msg[0], dst), dist.isend(msg[1], dst), msg))

    def tick(op: str, ready: int) -> None:
        nonlocal clock
        clock = max(clock, ready)
        log.append((op, clock))
        clock += 1

    def forward(j: int, x: Tensor) -> Tensor:
        x = apply_blocks(model, layers, x)  # (b, T, d_model)
        if rank == last:
            logits[j] = model.read_out(x)  # (b, T, d_vocab)
            losses[j] = lm_loss(logits[j], targets[rows[j]]) / n_micro
        return x

    for op in stage_order(schedule, rank, p, n_micro):
        j = int(op[1:])
        if op[0] == "F":
            if rank == 0:
                x_in, ready = model.input_stream(ids[rows[j]]), 0
            else:
                x_in, ready = recv(rank - 1)
                x_in.requires_grad_(True)
            outputs[j], saved[j] = saved_tensor_bytes(forward, j, x_in, exclude=model.parameters())
            inputs[j] = x_in
            tick(op, ready)
            live, live_bytes = live + 1, live_bytes + saved[j]
            peak, peak_bytes = max(peak, live), max(peak_bytes, live_bytes)
            if rank < last:
                send(outputs[j].detach(), rank + 1)
        else:
            if rank == last:
                ready = 0
                losses[j].backward()
            else:
                grad, ready = recv(rank + 1)
                outputs[j].backward(grad)
            tick(op, ready)
            if rank > 0:
                send(inputs[j].grad, rank - 1)
            del inputs[j], outputs[j]  # this micro-batch's activations are freed
            live, live_bytes = live - 1, live_bytes - saved[j]
    for work in pending[0::3] + pending[1::3]:
        work.wait()
    if config.tie_weights:
        sum_tied_embedding_grad(model, rank, p)
    grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}
    out = {
        "grads": grads,
        "log": log,
        "peak_in_flight": peak,
        "peak_saved_bytes": peak_bytes,
        "saved_bytes": [saved[j] for j in range(n_micro)],
    }
    if rank == last:
        out["loss"] = float(sum(l.item() for l in losses.values()))
        out["logits"] = torch.cat([logits[j].detach() for j in range(n_micro)])
    return out


def compare_schedules_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, n_micro: int
) -> dict:
    """:func:`scheduled_pipeline_worker` under each of :data:`SCHEDULES` in turn, in one set of
    processes."""
    return {
        name: scheduled_pipeline_worker(
            rank, world_size, config, state, ids, targets, n_micro, name
        )
        for name in SCHEDULES
    }
