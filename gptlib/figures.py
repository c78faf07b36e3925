"""The book's figures: one size, one palette, typeset maths, for every chapter's plots.

A chapter makes a figure with one call, ``fig, ax = subplots(...)``, and gets the book's defaults:

* at most ``WIDTH`` = 7 inches wide, at ``DPI`` = 100: 700 pixels, which the book's page column
  (736 px at a 1280 px window) shows at full size, so no figure is shrunk until its ticks are
  unreadable; several panels share the width, or are stacked (``nrows``);
* tick labels, axis labels and titles at 9-11 pt;
* maths in labels typeset by matplotlib's mathtext in Computer Modern, like the page's MathJax:
  write ``r"$x_{T-1}$"``, ``r"$W_E$"``, never the bare ``x_{T-1}``;
* an opaque white background and a palette, ``COLOURS``, in which every colour keeps a contrast of
  at least 3:1 on white and on the light-grey card the theme puts figures on in dark mode.

``use()`` applies the same defaults to figures made with ``plt`` directly. This module and
:mod:`gptlib.figures_parallel` (Chapters 10 and 11's diagrams, drawn with it) are the two that
import matplotlib; the models and the maths do not.
"""

from __future__ import annotations

import matplotlib as mpl

from .runtime import check_float, check_int

WIDTH = 7.0  # inches: the widest figure
DPI = 100  # pixels per inch, as the notebook's inline backend draws
COLOURS = ("#0072B2", "#AD3C00", "#00735A", "#8E3B84", "#886600", "#5A5A5A")  # blue, vermillion,
# green, purple, ochre, grey: each >= 3:1 on white and on the dark theme's figure card (#cccccc)

RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "figure.constrained_layout.use": True,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "mathtext.fontset": "cm",
    "text.usetex": False,
    "axes.prop_cycle": mpl.cycler(color=list(COLOURS)),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
}

# The colour scale of attention weights, the same stops as the widgets' (gptlib/widgets/js/heads.js,
# STOPS; a test compares them): weight 0 white (the figure's background, as 0 is the page's in a
# widget), 1 dark blue, linear between the stops.
ATTENTION_STOPS = (
    (255, 255, 255),
    (198, 219, 239),
    (107, 174, 214),
    (33, 113, 181),
    (8, 48, 107),
)


def attention_cmap():
    """The colormap of attention weights in [0, 1] (``ATTENTION_STOPS``), for ``imshow``.

    >>> [round(float(c), 4) for c in attention_cmap()(1.0)]
    [0.0314, 0.1882, 0.4196, 1.0]
    """
    from matplotlib.colors import LinearSegmentedColormap

    stops = [tuple(c / 255 for c in rgb) for rgb in ATTENTION_STOPS]
    return LinearSegmentedColormap.from_list("gptlib-attention", stops)


def use() -> None:
    """Applies the book's figure defaults (``RC``) to every figure made from now on.

    >>> use(); mpl.rcParams["mathtext.fontset"], mpl.rcParams["xtick.labelsize"]
    ('cm', 9.0)
    """
    mpl.rcParams.update(RC)


def subplots(
    nrows: int = 1, ncols: int = 1, *, height: float = 3.0, width: float = WIDTH, **kwargs
):
    """``plt.subplots`` at the book's size and with its defaults: ``width`` inches wide (at most
    ``WIDTH``) and ``height`` inches high; other keywords go to ``plt.subplots``.

    >>> fig, axes = subplots(1, 2, height=2.5)
    >>> fig.get_size_inches().tolist(), len(axes)
    ([7.0, 2.5], 2)
    >>> subplots(width=10)
    Traceback (most recent call last):
    ...
    ValueError: width must be at most 7.0 inches (the page column; stack panels with nrows), got 10
    """
    import matplotlib.pyplot as plt

    width = check_float("width", width, 0.0, lo_open=True)
    height = check_float("height", height, 0.0, lo_open=True)
    if width > WIDTH:
        raise ValueError(
            f"width must be at most {WIDTH} inches (the page column; stack panels with nrows), "
            f"got {width:g}"
        )
    nrows, ncols = check_int("nrows", nrows, 1), check_int("ncols", ncols, 1)
    use()
    return plt.subplots(nrows, ncols, figsize=(width, height), **kwargs)


# --- Chapters 2 and 3: the circle of a sinusoidal pair; feed-forward networks as graphs ---------


def pair_on_circle(ax, PE, i: int, n_points: int, k: int, omega: float) -> None:
    """Chapter 2: pair ``i`` of a sinusoidal matrix ``PE`` (one row per position) on its unit
    circle: the points ``(PE[p, 2i], PE[p, 2i+1])`` for ``p < n_points``, numbered, and from every
    third ``p`` the arc of angle ``k * omega`` through which ``R_k`` turns the point.

    >>> from gptlib.positional import sinusoidal_encoding
    >>> fig, ax = subplots(width=3.5, height=3.5)
    >>> pair_on_circle(ax, sinusoidal_encoding(16, 8), i=0, n_points=6, k=2, omega=1.0)
    >>> len(ax.lines), len(ax.texts)  # the circle, 2 arcs; 2 arrow heads, 6 numbers
    (3, 8)
    """
    import numpy as np

    theta = np.linspace(0, 2 * np.pi, 400)
    ax.plot(np.sin(theta), np.cos(theta), color="lightgray", lw=1)
    points = np.asarray(PE[:n_points, 2 * i : 2 * i + 2], dtype=float)  # (n_points, 2)
    for p in range(0, n_points - k + 1, 3):
        a = np.linspace(p * omega, (p + k) * omega, 50)  # drawn just inside the circle
        xs, ys = 0.85 * np.sin(a), 0.85 * np.cos(a)
        ax.plot(xs, ys, color=COLOURS[1], lw=1.5)
        ax.annotate(
            "",
            xy=(xs[-1], ys[-1]),
            xytext=(xs[-3], ys[-3]),
            arrowprops={"arrowstyle": "->", "color": COLOURS[1], "lw": 1.5},
        )
    ax.scatter(points[:, 0], points[:, 1], s=18, color=COLOURS[0], zorder=3)
    for p, xy in enumerate(points):
        ax.annotate(str(p), tuple(xy), textcoords="offset points", xytext=(5, 3), fontsize=9)
    ax.set_title(rf"pair $i = {i}$: $\omega_{i} = {omega:.3f}$, $R_{k}$ turns by {k * omega:.3f}")
    ax.set_xlabel(rf"$\mathrm{{PE}}_{{p,{2 * i}}} = \sin p\omega_{i}$")
    ax.set_ylabel(rf"$\mathrm{{PE}}_{{p,{2 * i + 1}}} = \cos p\omega_{i}$")
    ax.set_aspect("equal")
    ax.set_xlim(-1.25, 1.25)
    ax.set_ylim(-1.25, 1.25)


def dag_layout(edges) -> dict:
    """Chapter 3: where to draw each vertex of a DAG given as ``{(u, v): weight}``. x is the
    length of the longest path from an input vertex (so every edge points right), y the vertex's
    rank in its column, centred; a lone vertex is moved up or down (by 0.3 or 0.6, column by
    column from the left) until every edge that passes its column passes at least 0.25 from it.

    >>> dag_layout({("x", "h"): 1.0, ("h", "y"): 1.0, ("x", "y"): 1.0})
    {'x': (0, 0.0), 'h': (1, 0.3), 'y': (2, 0.0)}
    >>> xy = dag_layout({("a", "b"): 1, ("b", "c"): 1, ("c", "d"): 1, ("a", "d"): 1, ("e", "b"): 1})
    >>> xy["b"], xy["c"]  # a -> d passes 1/3 above b, and 1/6 above c at 0: c moves down
    ((1, 0.0), (2, -0.3))
    """
    from .mlp import topological_order

    order = topological_order(edges)
    depth: dict = {}
    for v in order:
        depth[v] = max((depth[u] + 1 for (u, w) in edges if w == v), default=0)
    columns: dict = {}
    for v in order:
        columns.setdefault(depth[v], []).append(v)
    xy = {v: (x, (len(col) - 1) / 2 - r) for x, col in columns.items() for r, v in enumerate(col)}
    for x, col in sorted(columns.items()):
        if len(col) > 1:
            continue
        passing = [(xy[u], xy[w]) for (u, w) in edges if xy[u][0] < x < xy[w][0]]
        at_x = [y0 + (y1 - y0) * (x - x0) / (x1 - x0) for (x0, y0), (x1, y1) in passing]
        clear = [y for y in (0.0, 0.3, -0.3, 0.6, -0.6) if all(abs(y - e) >= 0.25 for e in at_x)]
        xy[col[0]] = (x, clear[0] if clear else 0.0)
    return xy


def draw_dag(ax, edges, label=str, title: str = "") -> dict:
    """Chapter 3: a weighted DAG ``{(u, v): weight}`` drawn at ``dag_layout``'s places: positive
    weights blue, negative vermillion, line width growing with ``|w|``; input vertices white,
    hidden grey, outputs ochre, each named by ``label(v)``. Returns the layout.

    >>> fig, ax = subplots(width=3.5, height=2)
    >>> xy = draw_dag(ax, {("x", "h"): 1.0, ("h", "y"): -2.0, ("x", "y"): 0.5})
    >>> len(ax.lines), xy["y"]
    (3, (2, 0.0))
    """
    from .mlp import dag_vertices

    xy = dag_layout(edges)
    w_max = max(abs(float(w)) for w in edges.values())
    for (u, v), w in edges.items():
        ax.plot(
            *zip(xy[u], xy[v]),
            color=COLOURS[0] if float(w) > 0 else COLOURS[1],
            lw=0.4 + 2.5 * abs(float(w)) / w_max,
            alpha=0.8,
            zorder=1,
        )
    for group, fill in zip(dag_vertices(edges), ("white", "lightgray", "#f0e0a0")):
        ax.scatter(
            [xy[v][0] for v in group],
            [xy[v][1] for v in group],
            s=420,
            color=fill,
            edgecolor="black",
            zorder=2,
        )
    for v, (x, y) in xy.items():
        ax.annotate(label(v), (x, y), ha="center", va="center", fontsize=9, zorder=3)
    ax.set_title(title)
    ax.axis("off")
    return xy


# --- Chapters 5 and 6: diagrams of a block and of the decoder stack
# ---------------------------------

LAYER_FILL = {"LN": "#dbe9f6", "sub-layer": "#fde0c5", "stream": "white"}  # light fills, dark text

# The three block kinds of Chapter 5 as graphs: (title, nodes, edges), a node name -> (x, y, label).
_LN1, _LN2, _ATT, _MLP = (
    r"$\mathrm{LN}_1$",
    r"$\mathrm{LN}_2$",
    r"$\mathrm{Attn}$",
    r"$\mathrm{MLP}$",
)
BLOCK_GRAPHS = {
    "pre_ln": (
        "pre-LN\n(GPT-2, GPT-3)",
        {
            "X": (0, 0, "$X$"),
            "ln1": (0.8, 1, _LN1),
            "att": (0.8, 2.2, _ATT),
            "add1": (0, 3.4, "+"),
            "ln2": (0.8, 4.4, _LN2),
            "mlp": (0.8, 5.6, _MLP),
            "add2": (0, 6.8, "+"),
            "Z": (0, 7.8, "$Z$"),
        },
        [
            ("X", "ln1"),
            ("ln1", "att"),
            ("att", "add1"),
            ("X", "add1"),
            ("add1", "ln2"),
            ("ln2", "mlp"),
            ("mlp", "add2"),
            ("add1", "add2"),
            ("add2", "Z"),
        ],
    ),
    "post_ln": (
        "post-LN\n(2017, 002)",
        {
            "X": (0, 0, "$X$"),
            "att": (0.8, 1.2, _ATT),
            "add1": (0, 2.4, "+"),
            "ln1": (0, 3.4, _LN1),
            "mlp": (0.8, 4.6, _MLP),
            "add2": (0, 5.8, "+"),
            "ln2": (0, 6.8, _LN2),
            "Z": (0, 7.8, "$Z$"),
        },
        [
            ("X", "att"),
            ("att", "add1"),
            ("X", "add1"),
            ("add1", "ln1"),
            ("ln1", "mlp"),
            ("mlp", "add2"),
            ("ln1", "add2"),
            ("add2", "ln2"),
            ("ln2", "Z"),
        ],
    ),
    "parallel": (
        "parallel\n(000 remark 4.1, GPT-J)",
        {
            "X": (0, 0, "$X$"),
            "ln1": (0.8, 1.4, _LN1),
            "att": (0.4, 3.2, _ATT),
            "mlp": (1.2, 3.2, _MLP),
            "add": (0, 5.2, "+"),
            "Z": (0, 6.6, "$Z$"),
        },
        [
            ("X", "ln1"),
            ("ln1", "att"),
            ("ln1", "mlp"),
            ("att", "add"),
            ("mlp", "add"),
            ("X", "add"),
            ("add", "Z"),
        ],
    ),
}


def draw_block(ax, title: str, nodes: dict, edges: list) -> None:
    """Draws one block on ``ax`` as a graph whose stream runs upwards: ``nodes`` maps a name to
    ``(x, y, label)`` (a ``"+"`` is the residual addition, drawn as a circle), ``edges`` are
    ``(from, to)`` pairs of names, drawn as arrows.

    >>> fig, ax = subplots(width=2.5, height=3)
    >>> draw_block(ax, "a residual", {"X": (0, 0, "$X$"), "f": (0.8, 1, "f"),
    ...            "+": (0, 2, "+")}, [("X", "f"), ("f", "+"), ("X", "+")])
    >>> [t.get_text() or "->" for t in ax.texts]  # three labels, three arrows
    ['$X$', 'f', '+', '->', '->', '->']
    """
    for x, y, label in nodes.values():
        kind = "LN" if "LN" in label else "stream" if label in ("+", "$X$", "$Z$") else "sub-layer"
        box = {
            "boxstyle": "circle,pad=0.15" if label == "+" else "round,pad=0.3",
            "fc": LAYER_FILL[kind],
            "ec": "black",
        }
        ax.text(x, y, label, ha="center", va="center", fontsize=11, bbox=box)
    for a, b in edges:
        (xa, ya, _), (xb, yb, _) = nodes[a], nodes[b]
        ax.annotate(
            "",
            xy=(xb, yb),
            xytext=(xa, ya),
            arrowprops={"arrowstyle": "->", "shrinkA": 11, "shrinkB": 11},
        )
    ax.set_title(title)
    ax.set_xlim(-0.7, 1.6)
    ax.set_ylim(-0.6, 8.1)
    ax.axis("off")


def block_diagrams():
    """Chapter 5's figure: the pre-LN, post-LN and parallel blocks side by side; returns the figure.

    >>> fig = block_diagrams()
    >>> [ax.get_title().split()[0] for ax in fig.axes], fig.get_size_inches().tolist()
    (['pre-LN', 'post-LN', 'parallel'], [7.0, 5.0])
    """
    fig, axes = subplots(1, 3, height=5.0)
    for ax, (title, nodes, edges) in zip(axes, BLOCK_GRAPHS.values()):
        draw_block(ax, title, nodes, edges)
    fig.suptitle("three ways to assemble a block (the stream runs upwards; + adds the residual)")
    return fig


SHAPE_SYMBOLS = {"d_model": r"d_\mathrm{model}", "d_vocab": "|V|"}  # mathtext has no \lvert


def shape_label(dims) -> str:
    """A tensor shape in symbols, typeset: ``("B", "T", "d_model")`` -> ``$(B, T,
    d_\\mathrm{model})$``.

    >>> shape_label(("B", "T", "d_vocab"))
    '$(B, T, |V|)$'
    """
    return "$(" + ", ".join(SHAPE_SYMBOLS.get(d, d) for d in dims) + ")$"


def decoder_stack(stages, n_layers: int, title: str):
    """Chapter 6's figure: the decoder stack, one box per stage from the token ids (top) to the
    next-token distribution, each with its shape in symbols and, in brackets, as measured.
    ``stages`` holds ``(label, dims, measured)``: a label in mathtext, the shape as symbol names
    (``shape_label``) and the measured shape; boxes whose label starts with "Block" are the
    ``n_layers`` blocks. Returns the figure.

    >>> import re
    >>> stages = [(r"token ids $x_0, \\ldots, x_{T-1}$", ("B", "T"), (2, 12)),
    ...           ("Block 1", ("B", "T", "d_model"), (2, 12, 64)),
    ...           (r"logits $Y$", ("B", "T", "d_vocab"), (2, 12, 512))]
    >>> fig = decoder_stack(stages, 1, "a stack")
    >>> fig.canvas.draw()  # mathtext parses every label
    >>> texts = [t.get_text() for t in fig.axes[0].texts]
    >>> texts[:2]
    ['token ids $x_0, \\\\ldots, x_{T-1}$', '$(B, T)$  [2, 12]']
    >>> [t for t in texts if re.search(r"[_^]", re.sub(r"[$][^$]*[$]", "", t))]  # no raw TeX
    []
    """
    n = len(stages)
    fig, ax = subplots(height=0.62 * n + 0.6)
    blocks = [i for i, (label, _, _) in enumerate(stages) if label.startswith("Block")]
    for i, (label, dims, measured) in enumerate(stages):
        y = n - 1 - i
        fill = LAYER_FILL["LN"] if i in blocks else "#f2f2f2"
        ax.add_patch(
            mpl.patches.FancyBboxPatch(
                (0.02, y + 0.15), 0.8, 0.6, fc=fill, ec="gray", boxstyle="round,pad=0.02"
            )
        )
        ax.text(0.05, y + 0.45, label, va="center", fontsize=11)
        ax.text(
            0.79,
            y + 0.45,
            f"{shape_label(dims)}  {list(measured)}",
            va="center",
            ha="right",
            fontsize=11,
        )
        if i < n - 1:
            ax.annotate(
                "",
                xy=(0.42, y - 0.23),
                xytext=(0.42, y + 0.13),
                arrowprops={"arrowstyle": "->", "color": "gray"},
            )
    if blocks:
        middle = n - 1 - (blocks[0] + blocks[-1]) / 2 + 0.45
        ax.text(
            0.86, middle, f"$L = {n_layers}$\nblocks", va="center", fontsize=11, color=COLOURS[0]
        )
    ax.set_xlim(0, 1.0)
    ax.set_ylim(-0.1, n)
    ax.axis("off")
    ax.set_title(title)
    return fig


# --- Chapter 7: sampling ----------------------------------------------------------------------


def truncation_panels(panels, reference, *, ncols: int = 3, height: float = 4.6):
    """Bar charts of next-token distributions, one panel per ``(title, probabilities)`` in
    ``panels``
    (tokens in the order given), on a grid of ``ncols`` columns; a token a panel removes
    (probability 0) is drawn in grey at its probability in ``reference``. Each title gets the
    panel's entropy in nats and the number of tokens left; a spare cell of the grid holds the key.

    >>> import torch
    >>> p = torch.tensor([0.5, 0.3, 0.2])
    >>> fig = truncation_panels([("all", p), ("top-2", torch.tensor([0.625, 0.375, 0.0]))], p)
    >>> [ax.get_title().splitlines()[1] for ax in fig.axes[:2]]
    ['1.03 nats, 3 tokens', '0.66 nats, 2 tokens']
    """
    import torch

    ncols = check_int("ncols", ncols, 1)
    if not panels:
        raise ValueError("panels must hold at least one (title, probabilities) pair")
    nrows = -(-(len(panels) + 1) // ncols)  # one cell more, for the key
    fig, axes = subplots(nrows, ncols, height=height, sharey=True, squeeze=False)
    axes = axes.ravel()
    n = len(reference)
    for ax, (title, q) in zip(axes, panels):
        if len(q) != n:
            raise ValueError(f"panel {title!r} has {len(q)} probabilities, reference has {n}")
        removed = q == 0
        ax.bar(range(n), torch.where(removed, reference, 0), color="#c8c8c8")
        ax.bar(range(n), q, color=COLOURS[0])
        entropy = float(-(q[q > 0] * q[q > 0].log()).sum())
        ax.set_title(f"{title}\n{entropy:.2f} nats, {int((~removed).sum())} tokens", fontsize=10)
        ax.set_xticks(range(0, n, 2))
    for ax in axes[::ncols]:
        ax.set_ylabel("probability")
    for ax in axes[max(0, len(panels) - ncols) : len(panels)]:  # the lowest panel of each column
        ax.set_xlabel("token (by logit)")
    key = axes[len(panels)]
    key.bar([0], [0], color=COLOURS[0], label="probability after the operation")
    key.bar([0], [0], color="#c8c8c8", label="removed (its probability\nbefore the operation)")
    key.legend(loc="center", frameon=False)
    key.axis("off")
    for ax in axes[len(panels) + 1 :]:
        ax.axis("off")
    return fig


# --- Chapter 8: training curves ---------------------------------------------------------------


def loss_curves(
    lines=None,
    marked=None,
    *,
    level=None,
    lr=None,
    ylabel="loss (nats per token)",
    title=None,
    height: float = 3.0,
):
    """One panel of losses against the training step, the figure Chapter 8 draws four times.

    ``lines`` and ``marked`` map a label to ``(steps, losses)``: the first are drawn as thin lines
    (a loss per training batch), the second with their points marked (an evaluation every few
    steps). ``level = (value, label)`` adds a dotted horizontal line (the uniform model's
    :math:`\\ln|V|`); ``lr = (steps, rates)`` the learning rate, in grey on a second axis at the
    right. Returns ``(fig, ax)``.

    >>> fig, ax = loss_curves({"train": ([0, 1, 2], [3.0, 2.0, 1.5])}, {"held-out": ([2], [2.5])},
    ...                       level=(3.5, "uniform"), lr=([0, 1, 2], [1e-3, 1e-3, 1e-4]))
    >>> [line.get_label() for line in ax.get_lines()], len(fig.axes), fig.get_size_inches().tolist()
    (['train', 'held-out', 'uniform'], 2, [7.0, 3.0])
    """
    fig, ax = subplots(height=height)
    for label, (x, y) in (lines or {}).items():
        ax.plot(list(x), list(y), lw=0.8, label=label)
    for label, (x, y) in (marked or {}).items():
        ax.plot(list(x), list(y), "o-", ms=3, label=label)
    if level is not None:
        ax.axhline(level[0], color=COLOURS[-1], ls=":", label=level[1])
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if lr is not None:
        ax2 = ax.twinx()
        (line,) = ax2.plot(
            list(lr[0]), list(lr[1]), color=COLOURS[-1], lw=1.0, ls="--", label="learning rate"
        )
        ax2.set_ylabel("learning rate")
        ax2.set_ylim(0, max(lr[1]) * 1.05)
        ax2.spines["right"].set_visible(True)
        handles, labels = handles + [line], labels + ["learning rate (right)"]
    ax.legend(handles, labels)
    return fig, ax


# --- Chapter 9: fine-tuning from preferences ------------------------------------------------------


def rlhf_pipeline():
    """Chapter 9's pipeline: boxes are models, arrows say what trains what. Returns the figure.

    >>> rlhf_pipeline().get_size_inches().tolist()
    [7.0, 3.4]
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = subplots(height=3.4)
    ax.set_xlim(0, 10.4)
    ax.set_ylim(0, 5.0)
    ax.axis("off")
    w, h = 2.6, 1.05
    boxes = {  # name: (x, y) of the lower-left corner, label
        "base": (0.1, 3.1, "pretrained model\n(Chapter 8)"),
        "sft": (3.9, 3.1, "SFT policy $\\pi^\\mathrm{SFT}$\n(next-token loss\non demonstrations)"),
        "rm": (7.7, 3.1, "reward model $r_\\theta$\n(Bradley–Terry loss)"),
        "dpo": (3.9, 0.1, "DPO policy\n(the reward-model loss\non log-ratios)"),
        "ppo": (
            7.7,
            0.1,
            "RL policy $\\pi^\\mathrm{RL}_\\phi$\n(PPO on the\nKL-regularised objective)",
        ),
    }
    for x, y, label in boxes.values():
        ax.add_patch(
            FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc="#eef3fb", ec=COLOURS[0])
        )
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=8)
    arrows = [  # start, end, label position, label, horizontal alignment
        ((2.75, 3.62), (3.85, 3.62), (3.3, 4.5), "demonstrations\n(judged score 1)", "center"),
        (
            (6.55, 3.62),
            (7.65, 3.62),
            (7.1, 4.5),
            "$K = 4$ samples per\nprompt, ranked pairs",
            "center",
        ),
        ((9.0, 3.05), (9.0, 1.2), (9.1, 2.1), "reward", "left"),
        (
            (6.0, 3.05),
            (7.9, 1.2),
            (7.05, 2.45),
            "reference for\nthe KL penalty;\ninitial policy",
            "left",
        ),
        ((5.2, 3.05), (5.2, 1.2), (5.1, 2.1), "the ranked pairs;\nreference", "right"),
    ]
    for start, end, (tx, ty), label, ha in arrows:
        ax.add_patch(
            FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#333333")
        )
        ax.text(tx, ty, label, ha=ha, va="center", fontsize=7.5, color="#333333")
    return fig
