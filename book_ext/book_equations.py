"""A Sphinx extension that numbers a chapter's equations after the chapter: (9.3) is the third
labelled equation of Chapter 9.

Sphinx numbers the equations that carry a label (MyST ``$$ ... $$ (label)``) once ``numfig`` and
``math_numfig`` are on, but counts them through the whole book unless the table of contents is
numbered, and this book numbers its chapters in their titles instead ("9. Fine-tuning ...").
After Sphinx has assigned its numbers, each page's equations are renumbered in page order, with
the chapter's number (from the page name, ``chapters/09_rlhf`` is Chapter 9) in front; a page that
is not a chapter (the notation page, the appendix) numbers its own equations (1), (2), ...
Both the number shown beside an equation and every ``{eq}`` reference to it read this numbering.
"""

from __future__ import annotations

import re

CHAPTER_PAGE = re.compile(r"(?:^|/)(\d+)_[^/]*$")


def chapter_of(docname: str) -> int | None:
    """The chapter number of a page, from its name; None for a page that is not a chapter.

    >>> (
    ...     chapter_of("chapters/09_rlhf"),
    ...     chapter_of("chapters/00_next_token"),
    ...     chapter_of("chapters/notation"),
    ... )
    (9, 0, None)
    """
    match = CHAPTER_PAGE.search(docname)
    return int(match.group(1)) if match else None


def renumber(docname: str, numbers: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The equations of one page numbered 1, 2, ... in page order, after the page's chapter.

    >>> renumber("chapters/04_attention", {"equation-b": (12,), "equation-a": (11,)})
    {'equation-a': (4, 1), 'equation-b': (4, 2)}
    >>> renumber("chapters/notation", {"equation-x": (3,)})
    {'equation-x': (1,)}
    """
    chapter = chapter_of(docname)
    prefix = () if chapter is None else (chapter,)
    in_order = sorted(numbers, key=numbers.__getitem__)
    return {node_id: prefix + (k,) for k, node_id in enumerate(in_order, start=1)}


def number_by_chapter(app, env) -> list[str]:
    """Runs after Sphinx's own numbering (``env-get-updated``); returns the pages it changed."""
    if not (env.config.numfig and env.config.math_numfig):
        return []
    changed = []
    for docname, numbers in env.toc_fignumbers.items():
        if numbers.get("displaymath"):
            new = renumber(docname, numbers["displaymath"])
            if new != numbers["displaymath"]:
                numbers["displaymath"] = new
                changed.append(docname)
    return changed


def setup(app):
    app.connect("env-get-updated", number_by_chapter, priority=900)  # Sphinx's own runs at 500
    return {"parallel_read_safe": True, "parallel_write_safe": True}
