"""The SmolLM2 playground started in Chromium, measured: the renderer's resident memory (VmRSS of
Chromium's renderer processes, read from /proc every 50 ms; a Web Worker lives in its page's
renderer) before the start, at its peak and once loaded, and again over a reload and a second
start; the time from the reader's "yes" to the first result, and the worker's parts of it (files:
downloaded or read from the Cache API; sha256; tokenizer; session: onnxruntime-web's, the
unpacking of the 4-bit blocks within it); the model bytes downloaded by each start; one cached
step at 200 tokens of context; the longest main-thread task (PerformanceObserver "longtask")
during each start and during a greedy run of 16 tokens.

    python bench/page_memory.py [STATIC]    # STATIC: a folder with the book's vendor/ and live/

The page is the one tests/test_browser_smollm2.py makes (tests/browser_support.py, widget_page; the
widget code of the gptlib on the path), served on 127.0.0.1 beside STATIC (default
_build/html/_static). Prints one line per start.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser_support import CHROMIUM, CHROMIUM_ARGS, renderer_rss, widget_page  # noqa: E402
from test_browser_live import Served  # noqa: E402
from test_browser_smollm2 import SMOL_QUESTION  # noqa: E402

LONGTASKS = (
    "window.__longest = 0; new PerformanceObserver((l) => { for (const e of l.getEntries())"
    " window.__longest = Math.max(window.__longest, e.duration); })"
    ".observe({ type: 'longtask', buffered: false });"
)


class Poll:
    """The renderer's RSS every 50 ms in a thread; peak() since the last reset()."""

    def __init__(self):
        self.top, self.stop = 0, False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop:
            self.top = max(self.top, renderer_rss())
            time.sleep(0.05)

    def reset(self) -> None:
        self.top = renderer_rss()


def page_html(root: Path, static: Path) -> None:
    from gptlib.gguf import load_smollm2
    from gptlib.widgets import PlaygroundView

    model, tok = load_smollm2()
    view = PlaygroundView(
        model, tok, SMOL_QUESTION, chat=True, source="live/smollm2.json", title="SmolLM2, live"
    )
    widget_page(root, static, [view])


def start(page, served, poll, label: str, reset: bool = True) -> int:
    """Start the model (the reader says yes); print what it took; returns the peak RSS."""
    play = page.locator(".gptlib-play").first
    play.wait_for(timeout=30_000)
    page.evaluate(LONGTASKS)
    time.sleep(1.0)
    before = renderer_rss()
    if reset:
        poll.reset()
    n = len(served.log)
    play.locator(".gptlib-play-start").click()
    play.locator(".gptlib-play-confirm-yes").wait_for(timeout=30_000)
    t0 = time.perf_counter()
    play.locator(".gptlib-play-confirm-yes").click()
    page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play'); return r.dataset.firstMs "
        "!== undefined || r.dataset.live === 'failed'; }",
        timeout=300_000,
    )
    wall = time.perf_counter() - t0
    error = play.get_attribute("data-error")
    time.sleep(3.0)
    loaded, peak = renderer_rss(), poll.top
    longest = page.evaluate("window.__longest")
    got = served.bytes_since(n, "/_static/live/")
    started = page.evaluate(
        "() => document.querySelector('.gptlib-play').__gptlib?.backend?.started?.phases || {}"
    )
    print(
        f"[{label}] renderer RSS before {before / 1e9:.2f} GB, peak {peak / 1e9:.2f} GB "
        f"(+{(peak - before) / 1e9:.2f}), loaded {loaded / 1e9:.2f} GB "
        f"(+{(loaded - before) / 1e9:.2f}); start to first result {wall:.1f} s; live files "
        f"downloaded {got / 1e6:.1f} MB; longest main-thread task {longest:.0f} ms"
        + (f"; error: {error}" if error else "")
        + "; in the worker (ms): "
        + ", ".join(f"{k} {v}" for k, v in started.items()),
        flush=True,
    )
    return peak


def greedy(page) -> None:
    play = page.locator(".gptlib-play").first
    page.evaluate("window.__longest = 0")
    play.locator(".gptlib-play-run-n").fill("16")
    play.locator(".gptlib-play-run-greedy").check()
    t0 = time.perf_counter()
    play.locator(".gptlib-play-run").click()
    page.wait_for_function(
        "() => document.querySelector('.gptlib-play').dataset.runSteps !== undefined",
        timeout=300_000,
    )
    wall = time.perf_counter() - t0
    time.sleep(2.0)
    print(
        f"[greedy 16] {wall:.1f} s; longest main-thread task "
        f"{page.evaluate('window.__longest'):.0f} ms; renderer RSS after it "
        f"{renderer_rss() / 1e9:.2f} GB",
        flush=True,
    )


STEP = """async () => {
  const b = document.querySelector('.gptlib-play').__gptlib.backend;
  const ids = Array.from({ length: 200 }, (_, i) => 100 + ((i * 7919) % 40000));
  await b.run(ids);
  const ms = [];
  for (let k = 0; k < 7; k++) { ids.push(200 + k); ms.push((await b.run(ids)).ms); }
  return ms.sort((a, b) => a - b)[3];
}"""


def cached_step(page) -> None:
    ms = page.evaluate(STEP)
    print(f"[one cached step at 200 tokens] {ms:.0f} ms (median of 7)", flush=True)


def main() -> int:
    from playwright.sync_api import sync_playwright

    static = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / "html" / "_static"
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        root = Path(tmp)
        page_html(root, static)
        served = Served(root)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        poll = Poll()
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script("window.__gptlibTest = true;")
            page.goto(served.url + "/index.html")
            start(page, served, poll, "first start")
            cached_step(page)
            greedy(page)
            poll.reset()
            page.reload()
            peak = start(page, served, poll, "reload, second start", reset=False)
            print(f"[over the reload and the second start] renderer peak {peak / 1e9:.2f} GB")
        finally:
            poll.stop = True
            browser.close()
            served.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
