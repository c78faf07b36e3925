"""A Sphinx extension that typesets the book's maths when the book is built, so that a page
arrives with its formulas drawn and loads no MathJax.

Sphinx writes a formula as MathJax expects it (``sphinx.ext.mathjax``'s markup, reused here under
the math renderer ``built``: ``\\(...\\)`` in a ``span.math``, ``\\[...\\]`` after the equation's
number in a ``div.math``), but, this renderer not being ``mathjax``, adds no MathJax script to the
page. Once the HTML is written, ``node book_ext/typeset_maths.mjs`` turns every such formula into
MathJax's CHTML markup (mathjax-full from npm, pinned by package-lock.json), with its MathML for
screen readers, and puts the stylesheet of the characters each page uses into that page; the
fonts are served from ``_static/mathjax-woff``. A TeX error stops the build, naming the page and
the formula. Pages already typeset (an incremental build leaves the unchanged ones) are not
touched.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from sphinx.errors import ExtensionError
from sphinx.ext import mathjax
from sphinx.util import logging

logger = logging.getLogger(__name__)

RENDERER = "built"
SCRIPT = Path(__file__).with_name("typeset_maths.mjs")


def typeset(app, exception) -> None:
    """At ``build-finished``: typesets the maths of every page under the output folder."""
    builder = app.builder
    if exception is not None or builder.format != "html":
        return
    if getattr(builder, "math_renderer_name", None) != RENDERER:
        return
    node = shutil.which("node")
    if node is None:
        raise ExtensionError(
            "built_maths: node is needed to typeset the maths (apt install nodejs)"
        )
    done = subprocess.run(
        [node, str(SCRIPT), str(app.outdir)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ExtensionError(f"built_maths: {(done.stderr or done.stdout).strip()}")
    logger.info(done.stdout.strip())


def setup(app):
    app.setup_extension("sphinx.ext.mathjax")  # its markup and its config values
    app.add_html_math_renderer(
        RENDERER, (mathjax.html_visit_math, None), (mathjax.html_visit_displaymath, None)
    )
    app.connect("build-finished", typeset)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
