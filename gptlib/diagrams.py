"""The book's schematic diagrams, drawn with :mod:`gptlib.figures`' size and palette: graphs of
vertices and weighted edges (Chapter 3's feed-forward networks), a block's sub-layers and the
decoder stack with its shapes (Chapters 5 and 6), and the pipeline of fine-tuning from preferences
(Chapter 9). Their numbers are their arguments, and each function returns the figure (or draws on
the axes it is given); Chapters 10 and 11's diagrams are in :mod:`gptlib.figures_parallel`.
"""

from __future__ import annotations

import matplotlib as mpl

from .figures import COLOURS, subplots

# --- Chapter 3: feed-forward networks as graphs ------------------------------------------------


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


# --- Chapters 5 and 6: diagrams of a block and of the decoder stack ----------------------------

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


# --- Chapter 9: fine-tuning from preferences --------------------------------------------------


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
