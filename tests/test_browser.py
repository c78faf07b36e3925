"""The built HTML book in a real browser: widgets live without a kernel, maths rendered, no CDN.

Needs `make book` first (`make test` runs it) and Debian's Chromium at /usr/bin/chromium, driven
by Playwright. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import functools
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
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
        pytest.skip("no built book: run `make book` first")
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
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{site}/chapters/{chapter}.html", wait_until="networkidle")

    def check_offline(self):
        hosts = {urlparse(u).hostname for u in self.requests if urlparse(u).scheme in ("http", "https")}
        assert hosts <= {"127.0.0.1"}, f"requests left the machine: {sorted(hosts)}"
        assert not self.failed, f"failed requests: {self.failed}"
        assert not self.errors, f"script errors: {self.errors}"

    def screenshot(self, name: str, selector: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.locator(selector).first.screenshot(path=str(ARTIFACTS / name))


def test_built_pages_name_no_cdn():
    if not (HTML / "index.html").is_file():
        pytest.skip("no built book: run `make book` first")
    pages = sorted((HTML / "chapters").glob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not [h for h in CDN_HOSTS if h in text], f"{page.name} names a CDN"


def test_maths_is_rendered_offline(browser, site):
    p = Page(browser, site, "00_next_token")
    p.page.wait_for_selector("mjx-container", timeout=20_000)
    assert p.page.locator("mjx-container").count() > 5
    p.check_offline()


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
    p.screenshot("bpe_widget.png", ".gptlib-bpe")
    p.check_offline()


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
    p.page.locator(".gptlib-attn-cell").last.hover()
    assert root.get_attribute("data-focus") is not None
    p.screenshot("attention_widget.png", ".gptlib-attn")
    p.check_offline()


def _python_probs(logits, settings):
    from gptlib.sampling import next_token_probs

    return next_token_probs(torch.tensor(logits, dtype=torch.float64), temperature=settings["temperature"],
                            top_k=settings["top_k"] or None,
                            top_p=settings["top_p"] if settings["top_p"] < 1 else None)


def test_sampling_widget_matches_python(browser, site):
    p = Page(browser, site, "07_sampling")
    root = p.page.locator(".gptlib-samp").first
    root.wait_for(timeout=20_000)
    widths = lambda: [b.evaluate("e => e.style.width") for b in root.locator(".gptlib-samp-bar").all()]  # noqa: E731
    before = widths()
    t = root.locator(".gptlib-samp-temperature")
    t.focus()
    for _ in range(10):
        t.press("ArrowLeft")  # lower the temperature: a sharper distribution
    assert widths() != before
    # The browser's distribution equals gptlib.sampling.next_token_probs, at several settings.
    logits = json.loads(root.get_attribute("data-logits"))
    checked = 0
    for slider, key in ((".gptlib-samp-topp", "Home"), (".gptlib-samp-topk", "ArrowRight"),
                        (".gptlib-samp-temperature", "Home"), (".gptlib-samp-topp", "End")):
        root.locator(slider).focus()
        root.locator(slider).press(key)
        probs = torch.tensor(json.loads(root.get_attribute("data-probs")), dtype=torch.float64)
        settings = json.loads(root.get_attribute("data-settings"))
        torch.testing.assert_close(probs, _python_probs(logits, settings), atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked == 4
    p.screenshot("sampling_widget.png", ".gptlib-samp")
    p.check_offline()
