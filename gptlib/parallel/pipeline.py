"""Pipeline parallelism (GPipe): the decoder stack cut into stages, micro-batches passed along.

Stage s of p holds a contiguous run of blocks (:func:`stage_layers`); the first also the
embedding, the last also ln_f, the unembedding and the loss. GPipe runs every micro-batch's
forward, then every backward in reverse; with m micro-batches each stage idles a fraction
(p - 1) / (m + p - 1) of the time, the bubble (:func:`gpipe_bubble`).

The stages compute exactly :meth:`gptlib.model.GPT.forward`, cut in three: :func:`embed_input`,
:func:`apply_blocks` and :func:`unembed_output` call the model's own submodules in its order,
and composed they equal ``model(ids)`` (the tests check it, dropout included).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from ..model import GPT
from .launch import lm_loss, shard_range, worker_model

__all__ = [
    "embed_input",
    "apply_blocks",
    "unembed_output",
    "stage_layers",
    "gpipe_schedule",
    "timetable",
    "bubble_fraction",
    "gpipe_bubble",
    "pipeline_worker",
]


def embed_input(model: GPT, ids: Tensor) -> Tensor:
    """The first stage's input to the blocks: Dropout(W_E[ids] + W_pos[:T]), (B, T, d_model), as in GPT.forward."""
    return model.drop(model.embed(ids) + model.pos(ids.shape[1]))  # (B, T, d_model)


def apply_blocks(model: GPT, layers: Iterable[int], x: Tensor) -> Tensor:
    """The residual stream after the blocks ``layers`` of ``model``, in order: (B, T, d_model)."""
    for i in layers:
        x = model.blocks[i](x)  # (B, T, d_model)
    return x


def unembed_output(model: GPT, x: Tensor) -> Tensor:
    """The last stage's logits: LN_f(x) W_U, (B, T, d_vocab), as in GPT.forward."""
    return model.unembed(model.ln_f(x))  # (B, T, d_vocab)


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


def pipeline_worker(
    rank: int, world_size: int, config, state: dict, ids: Tensor, targets: Tensor, n_micro: int
) -> dict:
    """Pipeline parallel (GPipe) over ``world_size`` stages: all forwards, then all backwards.

    Stage 0 embeds (:func:`embed_input`), every stage runs its blocks (:func:`apply_blocks`), the
    last also applies ln_f, the unembedding (:func:`unembed_output`) and the loss; activations
    go forward and their gradients back with ``dist.send`` / ``dist.recv``. Each message carries
    a logical clock, so every operation gets the time slot it actually ran in. With tied
    embeddings, W_E's gradient lives half on the first stage, half on the last: they add them.

    Returns this stage's gradients, its (op, slot) log and, on the last stage, loss and logits.
    """
    model = worker_model(config, state)
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
            x = embed_input(model, ids[rows[j]])  # (b, T, d_model)
        else:
            x_in, ready = recv((b, T, config.d_model), rank - 1)
            x_in.requires_grad_(True)
            x = x_in
        x = apply_blocks(model, layers, x)  # (b, T, d_model)
        tick(f"F{j}", ready)
        if rank == last:
            logits = unembed_output(model, x)  # (b, T, d_vocab)
            losses.append(lm_loss(logits, targets[rows[j]]) / n_micro)
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
