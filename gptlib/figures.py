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

``use()`` applies the same defaults to figures made with ``plt`` directly. This module needs
matplotlib, which the chapters import; nothing else in gptlib imports it.
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


def use() -> None:
    """Applies the book's figure defaults (``RC``) to every figure made from now on.

    >>> use(); mpl.rcParams["mathtext.fontset"], mpl.rcParams["xtick.labelsize"]
    ('cm', 9.0)
    """
    mpl.rcParams.update(RC)


def subplots(nrows: int = 1, ncols: int = 1, *, height: float = 3.0, width: float = WIDTH, **kwargs):
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
        raise ValueError(f"width must be at most {WIDTH} inches (the page column; stack panels with nrows), "
                         f"got {width:g}")
    nrows, ncols = check_int("nrows", nrows, 1), check_int("ncols", ncols, 1)
    use()
    return plt.subplots(nrows, ncols, figsize=(width, height), **kwargs)


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
        "ppo": (7.7, 0.1, "RL policy $\\pi^\\mathrm{RL}_\\phi$\n(PPO on the\nKL-regularised objective)"),
    }
    for x, y, label in boxes.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc="#eef3fb", ec=COLOURS[0]))
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=8)
    arrows = [  # start, end, label position, label, horizontal alignment
        ((2.75, 3.62), (3.85, 3.62), (3.3, 4.5), "demonstrations\n(judged score 1)", "center"),
        ((6.55, 3.62), (7.65, 3.62), (7.1, 4.5), "$K = 4$ samples per\nprompt, ranked pairs", "center"),
        ((9.0, 3.05), (9.0, 1.2), (9.1, 2.1), "reward", "left"),
        ((6.0, 3.05), (7.9, 1.2), (7.05, 2.45), "reference for\nthe KL penalty;\ninitial policy", "left"),
        ((5.2, 3.05), (5.2, 1.2), (5.1, 2.1), "the ranked pairs;\nreference", "right"),
    ]
    for start, end, (tx, ty), label, ha in arrows:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#333333"))
        ax.text(tx, ty, label, ha=ha, va="center", fontsize=7.5, color="#333333")
    return fig
