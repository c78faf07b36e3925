"""Chapter 10's diagrams (data, tensor, pipeline and ring parallelism) and Chapter 11's pipeline
timetables.

Each function draws one figure of the chapter at the book's size (:func:`gptlib.figures.subplots`)
and returns it; the chapter's cell is one call. The pictures are schematic: their numbers (ranks,
stages, steps) are the arguments, and the timetable is the one it is given, so that the figure of
a schedule is the schedule the chapter computes.

>>> fig = ring_attention_diagram(R=3, step=2)
>>> [t.get_text() for t in fig.axes[1].texts][:3]
['$k=0$', 'skipped', 'skipped']
"""

from __future__ import annotations

import math

from matplotlib.patches import FancyBboxPatch, Polygon, Rectangle

from .figures import COLOURS, WIDTH, subplots
from .runtime import check_int

__all__ = [
    "box",
    "arrow",
    "data_parallel_diagram",
    "tensor_parallel_mlp_diagram",
    "timetable_diagram",
    "ring_attention_diagram",
    "timetables",
]

SHADE = "#f3f3f3"  # the collective operations' boxes


def box(ax, x, y, w, h, text, edge="black", face="white", fontsize=9):
    """A rounded box with its lower left corner at (x, y), ``w`` wide and ``h`` high, ``text``
    centred."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=face,
            edgecolor=edge,
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def arrow(ax, x0, y0, x1, y1, both=False, **style):
    """An arrow from (x0, y0) to (x1, y1), with a head at both ends if ``both``."""
    props = (
        dict(arrowstyle="<|-|>" if both else "-|>", lw=1.2, shrinkA=0, shrinkB=0, color="black")
        | style
    )
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=props)


def _rank_colour(r: int) -> str:
    return COLOURS[r % (len(COLOURS) - 1)]  # the grey is kept for what belongs to no rank


def data_parallel_diagram(R: int = 4):
    """``R`` ranks, each with a full copy of the weights and a slice of the batch, and the
    all-reduce
    of their gradients."""
    R = check_int("R", R, 1, 5)
    fig, ax = subplots(height=3.4)
    w, gap = 1.6, 0.4
    width = R * w + (R - 1) * gap
    for r in range(R):
        x0, c = r * (w + gap), _rank_colour(r)
        ax.add_patch(Rectangle((x0, 3.3), w, 0.45, facecolor=c, alpha=0.3, edgecolor=c))
        ax.text(
            x0 + w / 2,
            3.525,
            rf"$\mathcal{{B}}_{r}$: $B/R$ sequences",
            ha="center",
            va="center",
            fontsize=8,
        )
        arrow(ax, x0 + w / 2, 3.3, x0 + w / 2, 2.75)
        box(
            ax,
            x0,
            1.65,
            w,
            1.05,
            f"rank {r}\n"
            + r"$\theta$ (a full copy)"
            + "\n"
            + rf"$\nabla \mathcal{{L}}_{r}$ on $\mathcal{{B}}_{r}$",
            edge=c,
            fontsize=8.5,
        )
        arrow(ax, x0 + w / 2, 1.6, x0 + w / 2, 0.95, both=True)
    ax.text(
        width / 2,
        3.95,
        r"one batch $\mathcal{B}$ of $B$ sequences, cut into $R$ slices",
        ha="center",
        fontsize=9,
    )
    box(
        ax,
        0,
        0.3,
        width,
        0.6,
        r"all-reduce, then divide by $R$: every rank receives "
        r"$\nabla \mathcal{L} = \frac{1}{R}\sum_{r} \nabla \mathcal{L}_r$",
        face=SHADE,
        fontsize=9,
    )
    ax.text(
        width / 2,
        0.0,
        "the same optimiser step on every rank keeps the copies identical",
        ha="center",
        va="top",
        fontsize=8.5,
        style="italic",
    )
    ax.set_xlim(-0.1, width + 0.1)
    ax.set_ylim(-0.35, 4.2)
    ax.axis("off")
    ax.set_title(f"Data parallelism, $R = {R}$ ranks")
    return fig


def _mlp_weights_cut(ax, shade) -> None:
    """The cut of the MLP's weights over two ranks: W_in by column blocks, W_out by row blocks."""
    for r in range(2):
        ax.add_patch(
            Rectangle((1.2 * r, 0.2), 1.2, 0.9, facecolor=shade[r], alpha=0.4, edgecolor="black")
        )
        ax.text(
            1.2 * r + 0.6,
            0.65,
            rf"$W_\mathrm{{in}}^{{({r})}}$",
            ha="center",
            va="center",
            fontsize=11,
        )
        ax.add_patch(
            Rectangle(
                (4.6, 1.2 - 1.2 * r), 0.9, 1.2, facecolor=shade[r], alpha=0.4, edgecolor="black"
            )
        )
        ax.text(
            5.05,
            1.8 - 1.2 * r,
            rf"$W_\mathrm{{out}}^{{({r})}}$",
            ha="center",
            va="center",
            fontsize=11,
        )
    ax.text(
        1.2,
        1.35,
        r"$W_\mathrm{in}$ ($d_\mathrm{model} \times d_\mathrm{mlp}$): by columns",
        ha="center",
        fontsize=9,
    )
    ax.text(
        5.8,
        1.2,
        r"$W_\mathrm{out}$ ($d_\mathrm{mlp} \times d_\mathrm{model}$): by rows",
        va="center",
        fontsize=9,
    )
    ax.text(
        1.2, -0.15, "rank 0's share: blue; rank 1's: vermillion", ha="center", va="top", fontsize=9
    )
    ax.set_xlim(-0.4, 9.4)
    ax.set_ylim(-0.6, 2.5)
    ax.set_aspect("equal")
    ax.axis("off")


def _mlp_rank_lanes(ax, shade) -> None:
    """Each rank's lane through the MLP (its blocks of W_in and W_out, no communication between
    them) and the all-reduce that sums the lanes."""
    box(ax, -0.3, 1.55, 1.2, 0.9, "$X$\n" + r"$T\times d_\mathrm{model}$")
    for r, y in ((0, 2.75), (1, 0.35)):  # one lane per rank
        arrow(ax, 0.9, 2.0, 1.5, y + 0.45)
        box(
            ax,
            1.5,
            y,
            2.5,
            0.9,
            rf"$g(X W_\mathrm{{in}}^{{({r})}} + b_\mathrm{{in}}^{{({r})}})$"
            + "\n"
            + r"$T \times d_\mathrm{mlp}/R$",
            edge=shade[r],
            fontsize=10,
        )
        arrow(ax, 4.0, y + 0.45, 4.4, y + 0.45)
        box(
            ax,
            4.4,
            y,
            1.9,
            0.9,
            rf"$Y_{r} = g(\cdot)\, W_\mathrm{{out}}^{{({r})}}$"
            + "\n"
            + r"$T\times d_\mathrm{model}$",
            edge=shade[r],
            fontsize=10,
        )
        arrow(ax, 6.3, y + 0.45, 6.7, 2.0)
        ax.text(
            0.1,
            y + 0.45 + (0.65 if r == 0 else -0.65),
            f"rank {r}",
            color=shade[r],
            fontsize=9,
            va="center",
        )
    box(
        ax,
        6.7,
        1.45,
        2.7,
        1.1,
        "all-reduce (sum), then\n"
        + r"$Y_0 + Y_1 + b_\mathrm{out}$"
        + "\n"
        + r"$= \mathrm{MLP}(X)$ on both ranks",
        face=SHADE,
    )
    ax.text(
        2.75,
        1.95,
        "no communication:\n" + "$g$ acts on each unit",
        ha="center",
        va="center",
        fontsize=8.5,
        style="italic",
    )
    ax.set_xlim(-0.4, 9.5)
    ax.set_ylim(0.1, 4.1)
    ax.axis("off")


def tensor_parallel_mlp_diagram():
    """The MLP on two ranks: above, W_in cut into column blocks and W_out into row blocks; below,
    each rank's lane and the all-reduce that sums them."""
    fig, (ax0, ax1) = subplots(2, 1, height=5.0, gridspec_kw={"height_ratios": [0.85, 1.45]})
    shade = [_rank_colour(0), _rank_colour(1)]
    _mlp_weights_cut(ax0, shade)
    _mlp_rank_lanes(ax1, shade)
    fig.suptitle(r"Tensor parallelism of the MLP, $R = 2$: one all-reduce", fontsize=11)
    return fig


def timetable_diagram(grid, title: str = ""):
    """A pipeline schedule as a timetable: ``grid[s][t]`` is the operation stage ``s`` runs in slot
    ``t``
    ("F3" forward of micro-batch 3, "B3" its backward) or ``None`` (idle, left white)."""
    if not grid or not grid[0] or any(len(row) != len(grid[0]) for row in grid):
        raise ValueError(
            "grid must be a non-empty list of rows of one length (stages x time slots)"
        )
    fig, ax = subplots(height=0.45 * len(grid) + 1.1)
    _draw_timetable(ax, grid, title)
    ax.set_xlabel("time slot")
    return fig


def _draw_timetable(ax, grid, title: str) -> None:
    """``grid`` on ``ax``: a forward in blue, a backward in vermillion, idle slots left white."""
    for s, row in enumerate(grid):
        for t, op in enumerate(row):
            if op:
                colour = COLOURS[0] if op[0] == "F" else COLOURS[1]
                ax.add_patch(Rectangle((t, s), 1, 1, facecolor=colour, edgecolor="white"))
                ax.text(t + 0.5, s + 0.5, op, ha="center", va="center", color="white", fontsize=8)
    ax.set_xlim(0, max(len(row) for row in grid))
    ax.set_ylim(len(grid), 0)
    ax.set_yticks([s + 0.5 for s in range(len(grid))], [f"stage {s}" for s in range(len(grid))])
    ax.set_title(title, fontsize=10)


def ring_attention_diagram(R: int = 4, step: int = 1):
    """Left, the ring of ``R`` ranks in step ``step``: queries stay, key/value blocks travel (rank r
    holds those of rank (r - step) mod R). Right, the blocks of scores each rank computes, and in
    which step, under the causal mask."""
    R = check_int("R", R, 2, 5)
    step = check_int("step", step, 0, R - 1)
    fig, (ax0, ax1) = subplots(1, 2, height=3.6, width=WIDTH, gridspec_kw={"width_ratios": [1, 1]})
    where = [
        (1.6 * math.cos(a), 1.6 * math.sin(a))
        for a in (math.pi / 2 - 2 * math.pi * r / R for r in range(R))
    ]
    for r in range(R):  # rank 0 on top, clockwise
        (px, py), (nx, ny) = where[r], where[(r + 1) % R]
        box(
            ax0,
            px - 0.6,
            py - 0.42,
            1.2,
            0.84,
            f"rank {r}\n" + rf"$Q_{r}$ stays",
            edge=_rank_colour(r),
            fontsize=8,
        )
        s = (r - step) % R  # whose keys and values rank r holds in this step
        cx, cy = 1.65 * px, 1.55 * py  # just outside the ring
        ax0.add_patch(
            FancyBboxPatch(
                (cx - 0.33, cy - 0.2),
                0.66,
                0.4,
                boxstyle="round,pad=0.02",
                facecolor=_rank_colour(s),
                alpha=0.4,
                edgecolor=_rank_colour(s),
            )
        )
        ax0.text(cx, cy, rf"$K_{s}V_{s}$", ha="center", va="center", fontsize=8)
        arrow(
            ax0,
            0.72 * px + 0.28 * nx,
            0.72 * py + 0.28 * ny,
            0.28 * px + 0.72 * nx,
            0.28 * py + 0.72 * ny,
            color="#5A5A5A",
            connectionstyle="arc3,rad=-0.25",
        )
    ax0.text(
        0,
        0,
        f"step $k = {step}$:\nrank $r$ holds\n$K, V$ of rank\n$(r - k)$ mod {R}",
        ha="center",
        va="center",
        fontsize=8,
    )
    ax0.set_xlim(-3.3, 3.3)
    ax0.set_ylim(-3.0, 3.0)
    ax0.set_aspect("equal")
    ax0.axis("off")
    ax0.set_title(f"the ring, $R = {R}$:\nqueries stay, keys and values travel", fontsize=10)
    for r in range(R):  # query block (row) ...
        for s in range(R):  # ... against key block (column)
            if s > r:  # later positions: masked entirely, never computed
                ax1.add_patch(Rectangle((s, r), 1, 1, facecolor="#eeeeee", edgecolor="white"))
                ax1.text(
                    s + 0.5,
                    r + 0.5,
                    "skipped",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="#5A5A5A",
                )
            elif s == r:  # the diagonal block: only its lower triangle is visible
                ax1.add_patch(
                    Polygon(
                        [(s, r), (s, r + 1), (s + 1, r + 1)],
                        facecolor=_rank_colour(s),
                        alpha=0.4,
                        edgecolor="white",
                    )
                )
                ax1.text(s + 0.32, r + 0.68, "$k=0$", ha="center", va="center", fontsize=8)
            else:
                ax1.add_patch(
                    Rectangle((s, r), 1, 1, facecolor=_rank_colour(s), alpha=0.4, edgecolor="white")
                )
                ax1.text(
                    s + 0.5, r + 0.5, f"$k={(r - s) % R}$", ha="center", va="center", fontsize=8
                )
    ax1.set_xlim(0, R)
    ax1.set_ylim(R, 0)
    ax1.set_aspect("equal")
    ax1.set_xticks([s + 0.5 for s in range(R)], [rf"$K_{s}V_{s}$" for s in range(R)])
    ax1.set_yticks([r + 0.5 for r in range(R)], [f"rank {r}: $Q_{r}$" for r in range(R)])
    ax1.xaxis.tick_top()
    ax1.tick_params(length=0)
    ax1.set_title("score blocks computed, and in which\nstep $k$ (causal mask)", fontsize=10)
    return fig


def timetables(grids: list[list[list[str]]], titles: list[str], *, height: float = 1.8):
    """Chapter 11: pipeline timetables, one panel per grid, stacked: ``grid[stage][slot]`` is
    ``"F3"`` (a
    forward, blue), ``"B3"`` (a backward, vermillion) or ``""`` (idle, left white).

    >>> fig = timetables([[["F0", "B0"], ["", "F0"]]], ["two stages"])
    >>> len(fig.axes), fig.axes[0].get_title()
    (1, 'two stages')
    """
    if len(grids) != len(titles) or not grids:
        raise ValueError(
            f"grids and titles must be non-empty and match, got {len(grids)} and {len(titles)}"
        )
    fig, axes = subplots(len(grids), 1, height=height * len(grids), sharex=True, squeeze=False)
    for ax, grid, title in zip(axes[:, 0], grids, titles):
        _draw_timetable(ax, grid, title)
    axes[-1, 0].set_xlabel("time slot")
    return fig
