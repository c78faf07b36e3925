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

``use()`` applies the same defaults to figures made with ``plt`` directly. This module (with the
plots of Chapters 2, 7 and 8), :mod:`gptlib.diagrams` (the schematic diagrams of Chapters 3, 5, 6
and 9) and :mod:`gptlib.figures_parallel` (Chapters 10 and 11's) import matplotlib; the models and
the maths do not.
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


# --- Chapter 2: the circle of a sinusoidal pair -----------------------------------------------


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
