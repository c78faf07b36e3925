"""The chapters' page style (scripts/notebook_style.py), on every chapter, and the tool itself.

Each rule of the style is one test over all chapters, and every chapter meets every rule. A new
rule the chapters do not meet yet may be marked with ``xfail_today(reason)`` (a strict xfail):
when the chapters meet it, the run fails until the marker is removed, so the rule then holds.
"""

from __future__ import annotations

import doctest
import re
import shutil

import nbformat
import pytest
from browser_support import ROOT, load_module

style = load_module(ROOT / "scripts" / "notebook_style.py")

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
PAGES = sorted((ROOT / "chapters").glob("*.md"))


def has_ruff() -> bool:
    try:
        style.ruff_format(["x=1"])
    except RuntimeError:
        return False
    return True


needs_ruff = pytest.mark.skipif(
    not has_ruff(), reason="ruff is not installed (pinned in requirements.txt)"
)


def xfail_today(reason: str):
    return pytest.mark.xfail(strict=True, reason=f"not met by today's chapters: {reason}")


def per_chapter(find) -> dict[str, list]:
    """``{chapter: findings}`` for the chapters where ``find(notebook)`` finds something."""
    found = {path.stem: find(style.read(path)) for path in CHAPTERS}
    return {name: [str(f) for f in items] for name, items in found.items() if items}


def test_doctests():
    assert doctest.testmod(style).failed == 0


# --- the rules, on every chapter ----------------------------------------------------------------


def test_code_lines_fit_88_columns():
    found = per_chapter(style.long_lines)
    assert not found, f"code lines over {style.LINE_LENGTH} characters: {found}"


@pytest.mark.slow
@needs_ruff
def test_code_cells_are_formatted():
    changed = {}
    for path in CHAPTERS:
        report = style.format_notebook(style.read(path))
        if report.cells:
            changed[path.stem] = str(report)
    assert not changed, f"`scripts/notebook_style.py format` would change: {changed}"


def test_display_maths_stands_alone():
    found = per_chapter(lambda nb: style.markdown_findings(nb)[0])
    found.update(
        {
            p.stem: [
                f"line {n}: {what}"
                for n, what in style.display_maths_in_paragraphs(p.read_text("utf-8"))
            ]
            for p in PAGES
            if style.display_maths_in_paragraphs(p.read_text("utf-8"))
        }
    )
    assert not found, (
        f"display maths touching a paragraph or list item (MyST leaves it raw): {found}"
    )


def test_notes_boxes_are_collapsible():
    found = per_chapter(lambda nb: style.markdown_findings(nb)[1])
    assert not found, f"boxes about the notes that are not collapsed: {found}"


def test_check_cells_hide_their_code():
    found = per_chapter(style.check_cells_shown)
    assert not found, f"check cells not tagged hide-input: {found}"


def test_the_appendix_indexes_every_notes_box():
    """Every ``(notes-...)=`` target of a chapter is cited by the appendix, and the appendix cites
    nothing else under that name (Sphinx checks that each citation resolves)."""
    labels = {}
    for path in CHAPTERS:
        for cell in style.read(path).cells:
            if cell.cell_type == "markdown":
                labels.update({label: path.stem for label in style.notes_box_labels(cell.source)})
    appendix = (ROOT / "chapters" / "appendix_notes_errata.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"<(notes-[^>]+)>`", appendix))
    assert labels, "no (notes-...)= targets found in the chapters"
    assert not set(labels) - cited, (
        f"boxes missing from the appendix: {sorted(set(labels) - cited)}"
    )
    assert not cited - set(labels), (
        f"the appendix cites unknown boxes: {sorted(cited - set(labels))}"
    )


# --- the tool -------------------------------------------------------------------------------------


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def code(source, tags=(), output=None):
    cell = nbformat.v4.new_code_cell(source)
    if tags:
        cell.metadata["tags"] = list(tags)
    if output is not None:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return cell


def test_long_lines_include_the_colab_setup_cell():
    """Removed from the page, the set-up cell is still read in Colab: it keeps the 88 columns
    too."""
    long = "y = " + "1 + " * 30 + "1"
    nb = notebook(code(long, tags=["colab-setup", "remove-cell"]), code("x = 1\n" + long))
    assert [(f.cell, f.line) for f in style.long_lines(nb)] == [(0, 1), (1, 2)]


def test_display_maths_rules():
    find = style.display_maths_in_paragraphs
    assert find("Intro:\n$$\nx\n$$\n\nmore") == [(2, "no blank line before the display maths")]
    assert find("* an item\n  $$\n  x\n  $$\n* next") == [
        (2, "no blank line before the display maths"),
        (4, "no blank line after the display maths"),
    ]
    assert find("* an item\n\n  $$\n  x\n  $$ (eq-item)\n\n* next") == []
    assert find("one line\n$$ x = 1 $$\n\nafter") == [(2, "no blank line before the display maths")]
    assert find("text\n\\begin{align}\na &= b\n\\end{align}\n") == [
        (2, "no blank line before the display maths")
    ]
    # a code fence is not maths; an admonition's body is Markdown and is checked
    assert find("```python\nx = 1\n$$\n```") == []
    assert find("```{admonition} A box\n:class: dropdown\n$$\nx\n$$\n```") == []
    assert find("```{admonition} A box\nText\n$$\nx\n$$\n```") == [
        (3, "no blank line before the display maths")
    ]
    # $$ ... aligned ... $$ is one display, closed by its own $$
    assert find("Text\n\n$$\n\\begin{aligned} a\n\\end{aligned}\n$$\n\nmore") == []


def test_notes_boxes_and_their_collapse():
    text = (
        "(notes-wrong-x)=\n```{admonition} 004's table, checked\n:class: note\nText\n```\n\n"
        "```{admonition} Where the notes are wrong: y\n:class: dropdown warning\nText\n```\n\n"
        "```{admonition} Solutions\n:class: dropdown\nText\n```\n\n"
        "```{dropdown} The notes and GPT-2\n:open:\nText\n```\n"
    )
    boxes = list(style.notes_boxes(text))
    assert [title for _, title, _ in boxes] == [
        "004's table, checked",
        "Where the notes are wrong: y",
        "The notes and GPT-2",
    ]
    assert [style.is_collapsed(options) for _, _, options in boxes] == [False, True, False]
    assert style.notes_box_labels(text) == ["notes-wrong-x"]


def test_check_cells_are_those_that_assert_and_print_a_check():
    nb = notebook(
        code('assert 1 + 1 == 2\nprint("check passed: 1 + 1 = 2")'),  # a check cell
        code("torch.testing.assert_close(a, b)", output="check: a = b\n"),  # known by its output
        code("assert x > 0\ny = f(x)"),  # asserts, prints no check: not one
        code('print("check this later")'),  # prints, asserts nothing: not one
        code('assert ok\nprint("check: ok")', tags=["hide-input"]),  # already hidden
    )
    assert [f.cell for f in style.check_cells_shown(nb)] == [0, 1]
    ids = [nb.cells[0].id, nb.cells[1].id]
    assert style.tag_check_cells(nb, skip={ids[1]}) == [ids[0]]
    assert nb.cells[0].metadata["tags"] == ["hide-input"] and "tags" not in nb.cells[1].metadata
    assert [f.cell for f in style.check_cells_shown(nb)] == [1]


@needs_ruff
def test_format_keeps_magics_the_setup_cell_and_what_it_cannot_parse():
    setup = "import os, subprocess, sys\nif 'google.colab' in sys.modules:  pass"
    nb = notebook(
        code(setup, tags=["colab-setup", "remove-cell"]),
        code("%matplotlib inline\nx=[1,2,\n3]\nif x:\n    !ls {x}\n    y =x"),
        code("%%timeit\nx=1"),
        code("x = = 1"),
    )
    ids = [c.id for c in nb.cells]
    report = style.format_notebook(nb)
    assert nb.cells[0].source == setup  # scripts/colab.py owns it
    assert nb.cells[1].source == "%matplotlib inline\nx = [1, 2, 3]\nif x:\n    !ls {x}\n    y = x"
    assert nb.cells[2].source == "%%timeit\nx=1" and nb.cells[3].source == "x = = 1"
    assert report.cells == 1 and report.skipped == (ids[2], ids[3])
    assert [c.id for c in nb.cells] == ids


@needs_ruff
def test_command_line_dry_run_writes_nothing_and_a_run_writes_once(tmp_path, capsys):
    path = tmp_path / "nb.ipynb"
    nb = notebook(code("x=1", output="1\n"), code('assert x\nprint("check: x")'))
    nbformat.write(nb, path)
    before = path.read_text(encoding="utf-8")
    assert style.main(["format", "--dry-run", str(path)]) == 0
    assert style.main(["tag-checks", "--dry-run", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == before
    assert "1 cells reformatted" in capsys.readouterr().out
    assert style.main(["format", str(path)]) == 0 and style.main(["tag-checks", str(path)]) == 0
    after = style.read(path)
    assert after.cells[0].source == "x = 1" and after.cells[0].outputs[0]["text"] == "1\n"
    assert after.cells[1].metadata["tags"] == ["hide-input"]
    assert style.main(["check", str(path)]) == 0  # nothing left to report
    written = path.read_text(encoding="utf-8")
    style.main(["format", str(path)])
    assert path.read_text(encoding="utf-8") == written  # idempotent


def test_command_line_rejects_what_is_not_a_notebook(tmp_path, capsys):
    text = tmp_path / "page.md"
    text.write_text("# A page\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        style.main(["check", str(text)])
    assert e.value.code == 2 and "page.md is not a notebook" in capsys.readouterr().err


def test_check_on_a_chapter_reports_by_kind(capsys, tmp_path):
    path = tmp_path / CHAPTERS[0].name
    shutil.copy(CHAPTERS[0], path)
    status = style.main(["check", str(path)])
    out = capsys.readouterr().out
    assert out.startswith(f"{path.name}: ") and "long lines" in out and "check cells shown" in out
    assert status == (0 if all(not v for v in style.check(style.read(path)).values()) else 1)
