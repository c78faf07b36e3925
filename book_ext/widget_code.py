"""A Sphinx extension that puts the widgets' current code into the book's pages.

The notebooks store each widget's data, not its code (scripts/execute.py strips ``_esm`` and
``_css``). As Sphinx reads a notebook, this adds to the widget state the code the widget classes
send today (the bundles of ``gptlib/widgets/static/``, gptlib.widgets.stored.add_code), so each
page runs its widgets offline with no kernel. When the book's source tree holds gptlib, gptlib is
imported from it, so a page never gets another checkout's widget code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_widget_code(app, docname, source):
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    from gptlib.widgets.stored import add_code

    nb = json.loads(source[0])
    if add_code(nb):
        source[0] = json.dumps(nb, ensure_ascii=False)


def setup(app):
    root = Path(app.srcdir).resolve()
    if (root / "gptlib").is_dir() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    app.connect("source-read", add_widget_code)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
