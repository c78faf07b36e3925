"""What the browser tests share: where the built book is, how Chromium is started, a static server.

The pytest fixtures built on these (``site``, ``browser``, ``serve``) are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("GPTLIB_BOOK_HTML", ROOT / "_build" / "html"))


def load_module(path: Path):
    """The module in the file ``path`` (a script or a Sphinx extension, not a package), imported
    under its file name and registered in ``sys.modules``, without touching ``sys.path``."""
    import sys

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _parent(pid: str) -> str | None:
    try:
        return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def renderer_rss() -> int:
    """The largest VmRSS (bytes) among the renderer processes of the Chromium this process
    started (not another's on the same machine)."""
    me, best = str(os.getpid()), 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"--type=renderer" not in (proc / "cmdline").read_bytes():
                continue
            pid, mine = proc.name, False
            for _ in range(8):  # renderer -> zygote -> chromium -> playwright's driver -> us
                pid = _parent(pid)
                if pid in (None, "0", "1"):
                    break
                if pid == me:
                    mine = True
                    break
            if not mine:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    best = max(best, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return best


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def widget_page(
    root: Path,
    static: Path,
    views,
    *,
    width: int = 1200,
    styles: bool = False,
    body: str = "",
) -> Path:
    """Write ``root/index.html``, a page holding the ipywidgets ``views`` as a chapter page of the
    built book holds them (their state in the head, each view in a cell's output, in a column
    ``width`` px wide at most), which loads only the book's own scripts from ``root/_static``, a
    link to ``static`` (the built book's _static, or a folder with its vendor/ and live/); with
    ``styles``, the theme's stylesheets too. ``body`` (HTML) ends the page's body. Returns the
    page's path; the tests and bench/page_memory.py serve ``root``."""
    from ipywidgets.embed import embed_data

    data = embed_data(views=list(views), drop_defaults=False)

    def script(kind: str, value) -> str:
        text = json.dumps(value).replace("</", "<\\/")
        return f'<script type="application/vnd.jupyter.widget-{kind}+json">{text}</script>'

    theme = "".join(
        f'<link rel="stylesheet" href="_static/styles/{css}">'
        for css in ("theme.css", "pydata-sphinx-theme.css")
        if styles and (static / "styles" / css).is_file()
    )
    cells = "".join(
        f'<div class="cell_output docutils container">{script("view", v)}</div>'
        for v in data["view_specs"]
    )
    (root / "_static").symlink_to(Path(static).resolve(), target_is_directory=True)
    page = root / "index.html"
    page.write_text(
        '<!DOCTYPE html><html data-theme="light"><head><meta charset="utf-8">'
        f'<link rel="icon" href="data:,">{theme}'
        '<script src="_static/vendor/require.js"></script>'
        '<script src="_static/require-config.js"></script>'
        '<script src="_static/vendor/html-manager/embed-amd.js" '
        'data-jupyter-widgets-cdn="./no-cdn/"></script>'
        f"{script('state', data['manager_state'])}</head><body>"
        f'<main class="bd-content" style="max-width: {width}px; margin: 0 auto; padding: 0 8px">'
        f"{cells}</main>{body}</body></html>",
        encoding="utf-8",
    )
    return page


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Isolated(_Quiet):
    """Cross-origin isolated responses (COOP and COEP): what SharedArrayBuffer, and so
    onnxruntime-web's threads, need."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()


@contextlib.contextmanager
def serve(directory: Path, isolated: bool = False):
    """Serve ``directory`` on a free local port, cross-origin isolated if ``isolated``; yields its
    base address (no trailing slash)."""
    handler = _Isolated if isolated else _Quiet
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# Playwright hands a value from the page to Python as a tree with an object per number, each
# checked by its protocol's validators in Python: about 10 microseconds a number, so seconds for
# a model's logits, probabilities or attention weights. evaluate_json sends one JSON text instead
# (numbers as JSON writes them: the same doubles), typed arrays as arrays, and NaN and the
# infinities as the literals Python's json reads.
_AS_JSON = """
  if (value === undefined) return null;
  const mark = "__gptlib_nonfinite__";
  return JSON.stringify(value, (key, x) =>
    ArrayBuffer.isView(x) && !(x instanceof DataView) ? Array.from(x)
    : typeof x === "number" && !Number.isFinite(x) ? mark + x : x
  ).replace(new RegExp(`"${mark}(NaN|-?Infinity)"`, "g"), "$1");
"""


def evaluate_json(page, expression: str, arg=None):
    """``page.evaluate(expression, arg)`` for a large value (an array of numbers, nested or not):
    the value goes through one JSON text, not Playwright's serialization of every number.
    ``expression`` is a function of one argument (or none); ``undefined`` comes back as None."""
    text = page.evaluate(
        f"async (arg) => {{ const value = await ({expression})(arg);{_AS_JSON}}}", arg
    )
    return None if text is None else json.loads(text)


# maths.js has marked the page's wide inline formulas once (it does on the load event)
MATHS_MARKED = "() => document.documentElement.hasAttribute('data-maths-marked')"

# Whether the page loads MathJax in any way (it must not: its maths is typeset when the book is
# built), and the MathJax fonts the page asked for that failed to load.
NO_MATHJAX = """() => ({
    mathjax: window.MathJax !== undefined
        || document.querySelector('script[src*="mathjax" i], script[id^="MathJax" i]') !== null,
    fonts_failed: [...document.fonts]
        .filter((f) => f.family.startsWith("MJX") && f.status === "error").map((f) => f.family),
    fonts_loaded: [...document.fonts]
        .filter((f) => f.family.startsWith("MJX") && f.status === "loaded").map((f) => f.family),
})"""


def open_page(page, url: str, maths: bool = True, timeout: float = 20_000) -> None:
    """Go to ``url`` and wait for what a test reads: the page's load event, then each stored
    widget view drawn (a ``.gptlib-widget`` per ``widget-view+json`` script) and, unless
    ``maths`` is false, the book's maths.js done marking the wide inline formulas (the formulas
    arrive typeset: book_ext/typeset_maths.mjs). Deterministic where ``networkidle`` (half a
    second without a request) guesses, and faster."""
    page.goto(url, wait_until="load")
    views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    if views:
        page.wait_for_function(
            f"() => document.querySelectorAll('.gptlib-widget').length >= {views}",
            timeout=timeout,
        )
    if maths and page.locator('script[src$="maths.js"]').count():
        page.wait_for_function(MATHS_MARKED, timeout=timeout)
