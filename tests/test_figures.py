"""gptlib.figures: the book's figure size, palette and maths labels."""

from __future__ import annotations

import doctest
import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from PIL import Image

from gptlib import figures

COLUMN_PX = (
    736  # the page column at a 1280 px window (book_static/book.css), where figures are shown
)
DARK_CARD = "#cccccc"  # pydata-sphinx-theme's dark mode: figures on a light card, dimmed to 0.8


@pytest.fixture(autouse=True)
def _restore_rc():
    with matplotlib.rc_context():
        yield
    plt.close("all")


def luminance(colour: str) -> float:
    """WCAG relative luminance of an sRGB colour."""
    r, g, b = matplotlib.colors.to_rgb(colour)
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_doctests():
    assert doctest.testmod(figures).failed == 0


def test_contrast_is_wcag():
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # WCAG's AA grey


@pytest.mark.parametrize("colour", figures.COLOURS)
def test_every_colour_reads_in_light_and_dark_mode(colour):
    assert contrast(colour, "#ffffff") >= 3.0
    assert contrast(colour, DARK_CARD) >= 3.0


def test_colours_are_distinct_and_cycle():
    assert len(set(figures.COLOURS)) == len(figures.COLOURS)
    _fig, ax = figures.subplots()
    lines = [ax.plot([0, 1], [k, k])[0] for k in range(len(figures.COLOURS))]
    assert [matplotlib.colors.to_hex(line.get_color()) for line in lines] == [
        c.lower() for c in figures.COLOURS
    ]


def drawn_width(fig) -> int:
    """The width in pixels of the PNG the notebook's inline backend would store (tight bounding
    box)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return Image.open(io.BytesIO(buf.getvalue())).size[0]


@pytest.mark.slow
def test_the_widest_figure_is_shown_at_full_size():
    fig, axes = figures.subplots(1, 3, height=2.5)
    for ax in axes:
        ax.plot(range(10), [v * v for v in range(10)])
        ax.set_xlabel(r"$t$")
        ax.set_ylabel(r"$\mathcal{L}$")
    width = drawn_width(fig)
    assert 0.9 * figures.WIDTH * figures.DPI <= width <= COLUMN_PX  # shown at scale 1, not shrunk


def test_maths_labels_are_typeset_in_computer_modern():
    fig, ax = figures.subplots()
    ax.set_xlabel(r"$x_{T-1} W_E$")
    fig.canvas.draw()
    assert (
        matplotlib.rcParams["mathtext.fontset"] == "cm" and not matplotlib.rcParams["text.usetex"]
    )
    # mathtext typesets the subscript: narrower than the literal characters set as text
    raw = ax.text(0, 0, "x_{T-1} W_E").get_window_extent().width
    typeset = ax.xaxis.label.get_window_extent().width
    assert typeset < raw


def test_readable_text_and_a_white_background():
    figures.use()
    assert (
        min(
            matplotlib.rcParams[k]
            for k in ("xtick.labelsize", "ytick.labelsize", "legend.fontsize")
        )
        >= 9
    )
    assert matplotlib.colors.to_rgba(matplotlib.rcParams["figure.facecolor"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    assert matplotlib.colors.to_rgba(matplotlib.rcParams["savefig.facecolor"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"width": 7.5}, "width must be at most 7.0 inches"),
        ({"width": 0}, "width must be > 0.0"),
        ({"height": float("nan")}, "height must be a finite number"),
        ({"nrows": 0}, "nrows must be >= 1"),
        ({"ncols": 1.5}, "ncols must be an int"),
    ],
)
def test_bad_sizes_raise_naming_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        figures.subplots(**kwargs)
