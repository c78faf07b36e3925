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


# =============================================================================================
# Chapter 11: pipeline timetables
# =============================================================================================


def timetables(grids: list[list[list[str]]], titles: list[str], *, height: float = 1.8):
    """Pipeline timetables, one panel per grid, stacked: ``grid[stage][slot]`` is ``"F3"`` (a
    forward, blue), ``"B3"`` (a backward, vermillion) or ``""`` (idle, left white).

    >>> fig = timetables([[["F0", "B0"], ["", "F0"]]], ["two stages"])
    >>> len(fig.axes), fig.axes[0].get_title()
    (1, 'two stages')
    """
    import matplotlib.pyplot as plt

    if len(grids) != len(titles) or not grids:
        raise ValueError(f"grids and titles must be non-empty and match, got {len(grids)} and {len(titles)}")
    fig, axes = subplots(len(grids), 1, height=height * len(grids), sharex=True, squeeze=False)
    for ax, grid, title in zip(axes[:, 0], grids, titles):
        for s, row in enumerate(grid):
            for t, op in enumerate(row):
                if op:
                    colour = COLOURS[0] if op[0] == "F" else COLOURS[1]
                    ax.add_patch(plt.Rectangle((t, s), 1, 1, facecolor=colour, edgecolor="white"))
                    ax.text(t + 0.5, s + 0.5, op, ha="center", va="center", color="white", fontsize=8)
        ax.set_xlim(0, max(len(row) for row in grid))
        ax.set_ylim(len(grid), 0)
        ax.set_yticks([s + 0.5 for s in range(len(grid))], [f"stage {s}" for s in range(len(grid))])
        ax.set_title(title, fontsize=10)
    axes[-1, 0].set_xlabel("time slot")
    return fig
