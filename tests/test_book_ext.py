"""The book's Sphinx extensions (book_ext/): equation numbers relative to the chapter, the
widgets' code put into the pages, and the maths typeset when the book is built.

The typesetting script, book_ext/typeset_maths.mjs, is run with node on small pages written here:
inline, display and numbered formulas, idempotence, and the errors that stop the build. A small
book is built here with Sphinx, MyST-NB, book_ext/book_equations.py, book_ext/widget_code.py and
book_ext/built_maths.py: a chapter notebook and a Markdown page that label equations
(``$$ ... $$ (label)``) and cite them with ``{eq}``, on the page and across pages; the notebook
shows a widget whose stored state holds its data only. The built book itself is checked too, in the
browser stage of
``make test`` (marked ``browser``: it runs just after ``make book``, never on a stale build).
"""

from __future__ import annotations

import doctest
import json
import re
import shutil
import subprocess

import nbformat
import pytest
from browser_support import HTML, ROOT, load_module

from gptlib.widgets.stored import WIDGET_STATE

book_equations = load_module(ROOT / "book_ext" / "book_equations.py")  # Sphinx finds it by name
chapter_of, renumber = book_equations.chapter_of, book_equations.renumber
load_module(ROOT / "book_ext" / "widget_code.py")
load_module(ROOT / "book_ext" / "built_maths.py")
TYPESET = ROOT / "book_ext" / "typeset_maths.mjs"
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
        "extensions": ["myst_nb", "book_equations", "widget_code", "built_maths"],
        "html_math_renderer": "built",
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
    pages = {
        name: (out / "chapters" / f"{name}.html").read_text(encoding="utf-8")
        for name in ("03_mlp", "notation")
    }
    pages["fonts"] = sorted(p.name for p in (out / "_static" / "mathjax-woff").glob("*.woff"))
    return pages


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


def test_the_small_book_arrives_typeset_without_mathjax(small_book):
    """book_ext/built_maths.py: Sphinx adds no MathJax to a page, whose formulas are MathJax's
    CHTML markup (with MathML for screen readers) and whose head holds their stylesheet, with
    the fonts served from the book."""
    chapter = small_book["03_mlp"]
    assert "window.MathJax" not in chapter and "tex-chtml" not in chapter
    assert not re.search(r"<script[^>]*mathjax", chapter, re.I)
    assert chapter.count('<mjx-container class="MathJax" jax="CHTML" display="true"') == 3
    assert chapter.count('<mjx-container class="MathJax" jax="CHTML"') == 4  # and $y$
    assert chapter.count("<mjx-assistive-mml") == 4
    assert "\\(" not in chapter and "\\[" not in chapter
    assert chapter.count('<style id="gptlib-maths-chtml">') == 1
    assert 'url("../_static/mathjax-woff/MathJax_Main-Regular.woff")' in chapter
    assert "MathJax_Main-Regular.woff" in small_book["fonts"]


def page(body: str) -> str:
    return f"<html><head><title>t</title></head><body>{body}</body></html>"


INLINE = '<p>With <span class="math notranslate nohighlight">\\(a &lt; b^2\\)</span>.</p>'
NUMBERED = (
    '<div class="math notranslate nohighlight" id="equation-x">\n'
    '<span class="eqno">(4.1)<a class="headerlink" href="#equation-x" title="Link">#</a></span>'
    "\\[\n\\frac{1}{\\sqrt{d}}\n\\]</div>"
)
DISPLAY = '<div class="math notranslate nohighlight">\n\\[x \\mapsto \\mathbb{R}\\]</div>'


def typeset(folder, *pages: str) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    return subprocess.run(
        [node, str(TYPESET), str(folder), *pages], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def typeset_page(tmp_path_factory):
    """A page in a subfolder with an inline, a numbered and an unnumbered display formula,
    typeset once: ``(folder, html)``."""
    folder = tmp_path_factory.mktemp("html")
    (folder / "chapters").mkdir()
    (folder / "chapters" / "a.html").write_text(page(INLINE + NUMBERED + DISPLAY), "utf-8")
    done = typeset(folder)
    assert done.returncode == 0, done.stderr
    assert "typeset the maths of 1 page(s)" in done.stdout
    return folder, (folder / "chapters" / "a.html").read_text("utf-8")


def test_each_formula_becomes_chtml_in_place(typeset_page):
    _, html = typeset_page
    inline = re.search(r'<span class="math notranslate nohighlight">(.*?)</span>.</p>', html)
    assert inline.group(1).startswith('<mjx-container class="MathJax" jax="CHTML"')
    assert 'display="true"' not in inline.group(1)
    # the HTML-escaped TeX was read as TeX: a < b squared, in the MathML for screen readers
    mml = re.search(r"<mjx-assistive-mml[^>]*>(.*?)</mjx-assistive-mml>", html).group(1)
    assert re.sub(r"\s+", "", mml).startswith(
        '<mathxmlns="http://www.w3.org/1998/Math/MathML"><mi>a</mi><mo>&lt;</mo><msup>'
        "<mi>b</mi><mn>2</mn></msup></math>"
    )
    # the number and its link stay, before the formula; the unnumbered one has none
    numbered = re.search(r'<div [^>]*id="equation-x">\n(.*?)</div>', html, re.S).group(1)
    assert numbered.startswith(
        '<span class="eqno">(4.1)<a class="headerlink" href="#equation-x" title="Link">#</a>'
        '</span><mjx-container class="MathJax" jax="CHTML" display="true"'
    )
    assert "mjx-msqrt" in numbered and "mjx-mfrac" in numbered
    assert html.count('display="true"><mjx-math') == 0  # attributes, not positions, tested
    assert html.count('<mjx-container class="MathJax" jax="CHTML" display="true"') == 2
    assert "\\(" not in html and "\\[" not in html and "\\frac" not in html
    # the stylesheet: in the head, once, the fonts relative to the page, double-struck R in it
    head = html[: html.index("</head>")]
    assert head.count('<style id="gptlib-maths-chtml">') == 1
    assert 'url("../_static/mathjax-woff/MathJax_AMS-Regular.woff")' in head
    assert "mjx-c211D.TEX-A::before" in head  # the AMS font's R, used by \\mathbb{R}


def test_the_fonts_are_copied_into_the_book(typeset_page):
    folder, _ = typeset_page
    fonts = sorted(p.name for p in (folder / "_static" / "mathjax-woff").iterdir())
    assert len(fonts) == 23 and "MathJax_Zero.woff" in fonts


def test_typesetting_again_changes_nothing(typeset_page):
    folder, html = typeset_page
    file = folder / "chapters" / "a.html"
    before = file.stat().st_mtime_ns
    done = typeset(folder)
    assert done.returncode == 0, done.stderr
    assert "typeset the maths of 0 page(s)" in done.stdout
    assert file.read_text("utf-8") == html and file.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('<span class="math notranslate nohighlight">\\(x^{2\\)</span>', '"x^{2"'),
        ('<span class="math notranslate nohighlight">\\(\\nosuchmacro y\\)</span>', "nosuchmacro"),
        (
            '<div class="math notranslate nohighlight">\n\\[\\begin{matrix}\\]</div>',
            "begin{matrix}",
        ),
        ('<span class="math notranslate nohighlight">x + y</span>', '"x + y'),  # no delimiters
        ('<span class="math notranslate nohighlight">\\(a &bogus; b\\)</span>', "&bogus;"),
    ],
)
def test_a_tex_error_stops_naming_the_page_and_formula(tmp_path, body, named):
    good = page(INLINE)
    (tmp_path / "good.html").write_text(good, "utf-8")
    (tmp_path / "bad.html").write_text(page(INLINE + body), "utf-8")
    done = typeset(tmp_path, "bad.html")
    assert done.returncode == 1
    assert done.stderr.startswith("bad.html: "), done.stderr
    assert named in done.stderr, done.stderr
    assert (tmp_path / "bad.html").read_text("utf-8") == page(INLINE + body)  # left as it was
    assert (tmp_path / "good.html").read_text("utf-8") == good  # not named: not read
