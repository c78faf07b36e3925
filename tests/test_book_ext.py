"""The book's Sphinx extensions (book_ext/): equation numbers relative to the chapter, and the
widgets' code put into the pages.

A small book is built here with Sphinx, MyST-NB, book_ext/book_equations.py and
book_ext/widget_code.py: a chapter notebook and a Markdown page that label equations
(``$$ ... $$ (label)``) and cite them with ``{eq}``, on the page and across pages; the notebook
shows a widget whose stored state holds its data only. The built book itself is checked too, in the
browser stage of
``make test`` (marked ``browser``: it runs just after ``make book``, never on a stale build).
"""

from __future__ import annotations

import doctest
import json
import re

import nbformat
import pytest
from browser_support import HTML, ROOT, load_module

from gptlib.widgets.stored import WIDGET_STATE

book_equations = load_module(ROOT / "book_ext" / "book_equations.py")  # Sphinx finds it by name
chapter_of, renumber = book_equations.chapter_of, book_equations.renumber
load_module(ROOT / "book_ext" / "widget_code.py")
WIDGET_MODEL = "0" * 32


def eq_numbers(html: str) -> list[str]:
    """The numbers shown beside the display equations of a built page, in page order."""
    return re.findall(r'<span class="eqno">\(([^)<]*)\)', html)


def eq_links(html: str) -> list[tuple[str, str]]:
    """Every equation reference of a built page: (the target's anchor, the text shown)."""
    return re.findall(
        r'<a class="reference internal" href="[^"]*#(equation-[^"]+)">\(([^)<]*)\)</a>', html
    )


def test_doctests():
    assert doctest.testmod(book_equations).failed == 0


def test_chapter_of_reads_the_page_name():
    assert chapter_of("chapters/12_todays_gpts") == 12
    assert chapter_of("chapters/00_next_token") == 0
    assert chapter_of("chapters/appendix_notes_errata") is None
    assert chapter_of("chapters/intro") is None


def test_renumber_keeps_page_order_and_prefixes_the_chapter():
    sphinx_numbers = {"equation-c": (14,), "equation-a": (12,), "equation-b": (13,)}  # global count
    assert renumber("chapters/07_sampling", sphinx_numbers) == {
        "equation-a": (7, 1),
        "equation-b": (7, 2),
        "equation-c": (7, 3),
    }
    assert renumber("chapters/notation", sphinx_numbers) == {
        "equation-a": (1,),
        "equation-b": (2,),
        "equation-c": (3,),
    }


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _bpe_state() -> dict:
    """A BPE widget's state as scripts/execute.py stores it: its data, not its code."""
    from gptlib.widgets import BPEMergeView
    from gptlib.widgets.stored import CODE_TRAITS

    state = BPEMergeView([list("ab"), ["ab"]], ["'a' + 'b' -> 'ab'"]).get_state()
    state.pop("layout")  # a reference to another model
    return json.loads(
        json.dumps({k: v for k, v in state.items() if k not in CODE_TRAITS})
    )  # as JSON stores it


def _markdown_cell(text: str):
    return nbformat.v4.new_markdown_cell(text)


@pytest.fixture(scope="module")
def small_book(tmp_path_factory):
    """Builds a three-page book (an index, a chapter notebook, a Markdown page) and returns the
    HTML of the two pages."""
    from sphinx.application import Sphinx

    src = tmp_path_factory.mktemp("book")
    (src / "chapters").mkdir()
    (src / "index.md").write_text(
        "# A small book\n\n```{toctree}\nchapters/03_mlp\nchapters/notation\n```\n",
        encoding="utf-8",
    )
    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        }
    )
    nb.cells = [
        _markdown_cell("# 3. An MLP\n\nSome prose first.\n\n$$\ny = x W + b\n$$ (mlp-affine)\n"),
        nbformat.v4.new_code_cell("x = 1", outputs=[]),
        _markdown_cell(
            "Then\n\n$$\nz = g(y)\n$$ (mlp-activation)\n\nwith $y$ from {eq}`mlp-affine`, "
            "and the notation page's {eq}`notation-softmax`.\n"
        ),
        nbformat.v4.new_code_cell(
            "view",
            outputs=[
                nbformat.v4.new_output(
                    "display_data",
                    {
                        "text/plain": "BPEMergeView(...)",
                        WIDGET_VIEW: {
                            "model_id": WIDGET_MODEL,
                            "version_major": 2,
                            "version_minor": 0,
                        },
                    },
                )
            ],
        ),
        _markdown_cell(
            "* Two aligned lines, one number:\n\n  $$\n  \\begin{aligned}\n  a &= b \\\\\n"
            "  c &= d\n  \\end{aligned}\n  $$ (mlp-aligned)\n\n* and {eq}`mlp-aligned`.\n"
        ),
    ]
    nb.metadata["widgets"] = {
        WIDGET_STATE: {
            "version_major": 2,
            "version_minor": 0,
            "state": {
                WIDGET_MODEL: {
                    "model_module": "anywidget",
                    "model_module_version": "~0.11.*",
                    "model_name": "AnyModel",
                    "state": _bpe_state(),
                }
            },
        }
    }
    nbformat.write(nb, src / "chapters" / "03_mlp.ipynb")
    (src / "chapters" / "notation.md").write_text(
        "# Notation\n\n$$\n\\operatorname{softmax}(y)_v = e^{y_v} / \\sum_u e^{y_u}\n$$ "
        "(notation-softmax)\n\n"
        "Cited: {eq}`notation-softmax` here, {eq}`mlp-activation` in Chapter 3.\n",
        encoding="utf-8",
    )
    out = src / "_build"
    conf = {
        "extensions": ["myst_nb", "book_equations", "widget_code"],
        "myst_enable_extensions": ["dollarmath", "amsmath"],
        "nb_execution_mode": "off",
        "numfig": True,
        "math_numfig": True,
        "math_numsep": ".",
        "html_theme": "basic",
    }
    app = Sphinx(
        str(src),
        None,
        str(out),
        str(out / ".doctrees"),
        "html",
        confoverrides=conf,
        status=None,
        warning=None,
        freshenv=True,
        warningiserror=True,
    )
    app.build(force_all=True)
    return {
        name: (out / "chapters" / f"{name}.html").read_text(encoding="utf-8")
        for name in ("03_mlp", "notation")
    }


def test_chapter_equations_are_numbered_after_the_chapter(small_book):
    chapter, notation = small_book["03_mlp"], small_book["notation"]
    assert eq_numbers(chapter) == ["3.1", "3.2", "3.3"]
    assert eq_numbers(notation) == ["1"]  # not a chapter: its own count
    # references are links that show the same numbers, on the page and across pages
    assert eq_links(chapter) == [
        ("equation-mlp-affine", "3.1"),
        ("equation-notation-softmax", "1"),
        ("equation-mlp-aligned", "3.3"),
    ]
    assert eq_links(notation) == [
        ("equation-notation-softmax", "1"),
        ("equation-mlp-activation", "3.2"),
    ]


def test_the_page_gets_the_widgets_current_code(small_book):
    """The notebook stores the widget's data only; its page holds that data and the code the
    widget class sends today (bundle and stylesheet)."""
    from gptlib.widgets import BPEMergeView

    found = re.findall(
        r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)</script>',
        small_book["03_mlp"],
        re.S,
    )
    assert len(found) == 1
    state = json.loads(found[0])["state"][WIDGET_MODEL]["state"]
    assert state["_esm"] == BPEMergeView._esm and state["_css"] == BPEMergeView._css
    assert {k: v for k, v in state.items() if k not in ("_esm", "_css")} == _bpe_state()


@pytest.mark.browser  # the browser stage of `make test` runs it, just after `make book`
def test_the_built_notation_page_numbers_and_links_its_equations():
    page = HTML / "chapters" / "notation.html"
    if not page.is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    html = page.read_text(encoding="utf-8")
    assert eq_numbers(html) == ["1", "2", "3"]  # the slice, the softmax, the loss
    assert ("equation-notation-softmax", "2") in eq_links(html)
    assert ("equation-notation-loss", "3") in eq_links(html)
