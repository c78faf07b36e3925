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


# --- Chapter 8: training curves ---------------------------------------------------------------
def loss_curves(lines=None, marked=None, *, level=None, lr=None, ylabel="loss (nats per token)", title=None,
                height: float = 3.0):
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
        (line,) = ax2.plot(list(lr[0]), list(lr[1]), color=COLOURS[-1], lw=1.0, ls="--", label="learning rate")
        ax2.set_ylabel("learning rate")
        ax2.set_ylim(0, max(lr[1]) * 1.05)
        ax2.spines["right"].set_visible(True)
        handles, labels = handles + [line], labels + ["learning rate (right)"]
    ax.legend(handles, labels)
    return fig, ax
