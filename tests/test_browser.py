"""The built HTML book in a real browser: widgets live without a kernel, maths rendered, no CDN.

Needs `make book` first (`make test` runs it) and Debian's Chromium at /usr/bin/chromium, driven
by Playwright. Screenshots go to test-artifacts/. GPTLIB_BOOK_HTML points the test at another
built book (default: _build/html). A chapter whose page is not in the book is skipped, by name.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

browser_test = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("GPTLIB_BOOK_HTML", ROOT / "_build" / "html"))
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CDN_HOSTS = ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A chapter page with every request, failure and script error recorded."""

    def __init__(self, browser, site: str, chapter: str):
        if not (HTML / "chapters" / f"{chapter}.html").is_file():
            pytest.skip(f"chapter {chapter} is not in the built book")
        self.requests, self.failed, self.errors = [], [], []
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{site}/chapters/{chapter}.html", wait_until="networkidle")

    def check_offline(self):
        hosts = {urlparse(u).hostname for u in self.requests if urlparse(u).scheme in ("http", "https")}
        assert hosts <= {"127.0.0.1"}, f"requests left the machine: {sorted(hosts)}"
        assert not self.failed, f"failed requests: {self.failed}"
        assert not self.errors, f"script errors: {self.errors}"

    def check_maths(self):
        """MathJax (served from the book itself) has typeset every formula: none is left raw."""
        self.page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
        self.page.evaluate("() => MathJax.startup.promise")
        raw = self.page.evaluate(
            """() => [...document.querySelectorAll('article .math')]
                     .filter((e) => !e.querySelector('mjx-container')).map((e) => e.textContent.slice(0, 60))"""
        )
        assert not raw, f"formulas left untypeset: {raw[:5]}"
        assert self.page.locator("article mjx-container").count() > 0

    def screenshot(self, name: str, selector: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.locator(selector).first.screenshot(path=str(ARTIFACTS / name))

    def close(self):
        self.page.close()


def test_every_chapter_is_in_the_toc():
    """`only_build_toc_files` leaves a chapter missing from _toc.yml silently out of the book."""
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\s*(?:-\s*)?(?:file|root):\s*(\S+)\s*$", toc, re.M))
    pages = {p.with_suffix("").relative_to(ROOT).as_posix()
             for p in (ROOT / "chapters").iterdir() if p.suffix in (".ipynb", ".md")}
    assert pages - listed == set(), f"chapters missing from _toc.yml: {sorted(pages - listed)}"
    assert listed - pages == set(), f"_toc.yml lists files that do not exist: {sorted(listed - pages)}"


@browser_test
def test_built_pages_name_no_cdn():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    pages = sorted((HTML / "chapters").glob("*.html"))
    assert pages
    external = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=[\"'](?:https?:)?//", re.I)
    for page in pages + [HTML / "index.html"]:
        text = page.read_text(encoding="utf-8")
        assert not [h for h in CDN_HOSTS if h in text], f"{page.name} names a CDN"
        assert not external.search(text), f"{page.name} loads a resource from another host"


@browser_test
def test_maths_is_rendered_offline(browser, site):
    p = Page(browser, site, "00_next_token")
    p.check_maths()
    assert p.page.locator("mjx-container").count() > 5
    p.screenshot("maths.png", "article mjx-container[display='true']")
    p.check_offline()
    p.close()


@browser_test
def test_bpe_widget_slider_changes_the_split(browser, site):
    p = Page(browser, site, "01_tokens")
    root = p.page.locator(".gptlib-bpe").first
    root.wait_for(timeout=20_000)
    before = int(root.get_attribute("data-tokens"))
    slider = p.page.locator(".gptlib-bpe-slider").first
    slider.focus()
    slider.press("Home")  # back to step 0: one token per byte
    assert root.get_attribute("data-step") == "0"
    after = int(root.get_attribute("data-tokens"))
    assert after > before
    slider.press("ArrowRight")
    assert int(root.get_attribute("data-tokens")) == after - 1  # one merge, one token fewer
    assert int(root.get_attribute("data-merged")) >= 1  # the pieces the merge made are outlined
    for _ in range(4):
        slider.press("ArrowRight")
    p.screenshot("bpe_widget.png", ".gptlib-bpe")
    p.check_maths()
    p.check_offline()
    p.close()


@browser_test
def test_attention_widget_head_selector_changes_heatmap(browser, site):
    p = Page(browser, site, "04_attention")
    root = p.page.locator(".gptlib-attn").first
    root.wait_for(timeout=20_000)
    before = root.get_attribute("data-view")
    heads = p.page.locator(".gptlib-attn-head").first
    n = heads.locator("option").count()
    assert n >= 2
    heads.select_option("1")
    after = root.get_attribute("data-view")
    assert after != before and after.split(":")[0].endswith("/1")
    T = root.locator(".gptlib-attn-query").count()
    root.locator(".gptlib-attn-query").last.hover()  # the last query sees every key
    assert root.get_attribute("data-focus") == str(T - 1)
    shaded = [k.evaluate("e => e.style.background") for k in root.locator(".gptlib-attn-key").all()]
    assert len(shaded) == T and any(shaded), "hovering a query shades the keys it attends to"
    p.screenshot("attention_widget.png", ".gptlib-attn")
    p.check_maths()
    p.check_offline()
    p.close()


def _python_probs(logits, settings):
    from gptlib.sampling import next_token_probs

    return next_token_probs(torch.tensor(logits, dtype=torch.float64), temperature=settings["temperature"],
                            top_k=settings["top_k"] or None,
                            top_p=settings["top_p"] if settings["top_p"] < 1 else None)


@browser_test
def test_sampling_widget_matches_python(browser, site):
    p = Page(browser, site, "07_sampling")
    root = p.page.locator(".gptlib-samp").first
    root.wait_for(timeout=20_000)
    widths = lambda: [b.evaluate("e => e.style.width") for b in root.locator(".gptlib-samp-bar").all()]  # noqa: E731
    logits = json.loads(root.get_attribute("data-logits"))
    checked = []

    def matches_python():
        """The browser's distribution equals gptlib.sampling.next_token_probs to 1e-5."""
        probs = torch.tensor(json.loads(root.get_attribute("data-probs")), dtype=torch.float64)
        settings = json.loads(root.get_attribute("data-settings"))
        torch.testing.assert_close(probs, _python_probs(logits, settings), atol=1e-5, rtol=0,
                                   msg=lambda m: f"at {settings}: {m}")
        checked.append(settings)

    before = widths()
    matches_python()
    p.screenshot("sampling_widget_initial.png", ".gptlib-samp")
    t = root.locator(".gptlib-samp-temperature")
    t.focus()
    for _ in range(10):
        t.press("ArrowLeft")  # lower the temperature: a sharper distribution
    assert widths() != before
    matches_python()
    p.screenshot("sampling_widget.png", ".gptlib-samp")  # temperature lowered by 0.5
    for slider, key in ((".gptlib-samp-topp", "Home"), (".gptlib-samp-topk", "ArrowRight"),
                        (".gptlib-samp-temperature", "Home"), (".gptlib-samp-topp", "End")):
        root.locator(slider).focus()
        root.locator(slider).press(key)
        matches_python()
    assert len({json.dumps(c, sort_keys=True) for c in checked}) == 6, checked
    p.check_maths()
    p.check_offline()
    p.close()


@browser_test
def test_every_widget_in_the_book_renders(browser, site):
    """On every page with widgets, each stored widget view is drawn (html-manager + anywidget)."""
    pages = [p.stem for p in sorted((HTML / "chapters").glob("*.html"))
             if "application/vnd.jupyter.widget-view+json" in p.read_text(encoding="utf-8")]
    if not pages:
        pytest.skip("no page of the built book shows a widget")
    for chapter in pages:
        p = Page(browser, site, chapter)
        views = p.page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
        p.page.wait_for_function(f"() => document.querySelectorAll('.gptlib-widget').length >= {views}",
                                 timeout=20_000)
        assert p.page.locator(".gptlib-widget").count() == views, chapter
        p.check_offline()
        p.close()
