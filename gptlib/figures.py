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


# --- Chapter 7: sampling ----------------------------------------------------------------------


def truncation_panels(panels, reference, *, ncols: int = 3, height: float = 4.6):
    """Bar charts of next-token distributions, one panel per ``(title, probabilities)`` in ``panels``
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
