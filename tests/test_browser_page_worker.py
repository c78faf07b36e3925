"""SmolLM2 in the page's Web Worker, in Chromium (the page of tests/test_browser_live.py): a step
that fails in onnxruntime (an id outside the vocabulary, after the cache would have been cut)
leaves the cache as it was, so the next steps still give PyTorch's greedy tokens; leaving the page
releases the session; a reload starts from the browser's Cache API (the 4-bit blocks and the
graph are not downloaded again). The renderer's resident memory (Chromium's renderer processes,
/proc) is printed (run with -s), never asserted."""

from __future__ import annotations

import json
import time

import pytest
import torch
from browser_support import renderer_rss, widget_page
from test_browser_live import STATIC, Page, Served

from gptlib.step import step, step_inputs

pytestmark = pytest.mark.browser
QUESTION = "Which animals live in the Arctic?"


@pytest.fixture(scope="module")
def worker_page(browser, smollm2, tmp_path_factory):
    from gptlib.widgets import PlaygroundView

    if not (STATIC / "live" / "smollm2.json").is_file():
        pytest.skip(f"no SmolLM2 live model in {STATIC} (run `make book`)")
    model, tok = smollm2
    view = PlaygroundView(model, tok, QUESTION, chat=True, source="live/smollm2.json")
    root = tmp_path_factory.mktemp("worker")
    widget_page(root, STATIC, [view])
    served = Served(root)
    page = Page(browser, served.url + "/index.html", width=1280)
    try:
        yield page, served
    finally:
        page.close()
        served.close()


def _start(page, served) -> tuple[int, float]:
    """Start the model (the reader agrees); returns (live bytes downloaded, seconds)."""
    n, t0 = len(served.log), time.perf_counter()
    page.play.locator(".gptlib-play-start").click()
    page.play.locator(".gptlib-play-confirm-yes").click()
    page.page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.firstMs !== undefined || r.dataset.live === 'failed'; }",
        timeout=180_000,
    )
    page.wait_idle(timeout=180_000)
    assert page.play.get_attribute("data-live") == "browser"
    return served.bytes_since(n, "/_static/live/"), time.perf_counter() - t0


RUN = (
    "async ([ids]) => { const b = document.querySelector('.gptlib-play').__gptlib.backend;"
    " try { const r = await b.run(ids); return {logits: Array.from(r.logits)}; }"
    " catch (e) { return {error: e.message}; } }"
)


def test_a_failed_step_leaves_the_cache_and_a_reload_reads_the_cache(worker_page, smollm2, summary):
    page, served = worker_page
    model, tok = smollm2
    before = renderer_rss()
    first, seconds = _start(page, served)
    loaded = renderer_rss()
    ids = json.loads(page.play.get_attribute("data-ids"))
    assert page.page.evaluate(RUN, [ids]).get("logits")
    # a step whose last id is outside the vocabulary, on a window that cuts the cache by two
    bad = page.page.evaluate(RUN, [ids[:-2] + [10**9]])
    assert "error" in bad, bad
    # the next steps: greedy from the whole prompt through the cache, as PyTorch gives them
    past, mask, lens, targets, rows = step_inputs(model)
    x, ctx, got, want = torch.tensor([ids]), list(ids), [], []
    for _ in range(6):
        out = step(model, x, past, mask, lens, targets, rows)
        past, nxt = torch.cat([past, out["kv"]]), int(out["logits"][0].argmax())
        want.append(nxt)
        got.append(int(torch.tensor(page.page.evaluate(RUN, [ctx])["logits"]).argmax()))
        ctx.append(got[-1])
        x = torch.tensor([[nxt]])
    assert got == want, (tok.decode(got), tok.decode(want))
    # a reload: the old page's session and worker go, the files come from the Cache API
    page.page.reload()
    page.page.locator(".gptlib-play").first.wait_for(timeout=30_000)
    again, seconds2 = _start(page, served)
    listed = json.loads((STATIC / "live" / "smollm2.json").read_text(encoding="utf-8"))
    assert first >= listed["download_bytes"]
    assert again <= 5_000_000, again  # the manifest and the tokenizer, not the model
    summary(
        "SmolLM2 in the page's worker",
        f"\n[smollm2 worker] after a failed step, 6 greedy tokens equal PyTorch's; renderer RSS "
        f"{before / 1e9:.2f} GB before the start, {loaded / 1e9:.2f} GB once loaded, "
        f"{renderer_rss() / 1e9:.2f} GB after a reload and a second start; start "
        f"{seconds:.1f} s ({first / 1e6:.1f} MB downloaded), again {seconds2:.1f} s "
        f"({again / 1e6:.1f} MB)",
    )
    page.check_offline()
