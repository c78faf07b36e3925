"""The live models in a real browser: the book's English GPT here, SmolLM2-135M-Instruct in
test_browser_smollm2.py (a file of its own, so that `make browser`'s two workers share the two
pages), both run in the page, offline.

A test page is made here and served beside the built book's _static/ (`make book`; or a folder
named by GPTLIB_LIVE_STATIC that holds the same vendor/ and live/ files), loading only the book's
own static files (the widget manager, onnxruntime-web and @huggingface/tokenizers vendored from
npm, and the step graphs gptlib.export wrote), as a chapter page does. It holds the English
playground and two sampling views that replay stored distributions. Driven in Debian's Chromium
through Playwright, the page must give PyTorch's numbers (gptlib.step.step): the tokenizer's ids
on fuzzed text, the logits (max |diff| <= 1e-4), every head's pattern, the logit lens and the
sampling distribution for 40 seeded draws and more. No request may leave the local server. The
budgets of issue 33 (download, start to first token, ms a token, the tab's memory) are printed
(run with -s), never asserted.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch
from browser_support import evaluate_json, open_page, widget_page
from fuzz_texts import fuzzed_texts

from gptlib.sampling import next_token_probs
from gptlib.step import step, step_inputs

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("GPTLIB_BOOK_HTML", ROOT / "_build" / "html"))
STATIC = Path(os.environ.get("GPTLIB_LIVE_STATIC", HTML / "_static"))
ARTIFACTS = ROOT / "test-artifacts"
LIVE_FILES = ("vendor/onnxruntime-web/", "vendor/tokenizers/", "live/")
OPENING = "The President said that the"
# Texts that are not in the chapters.
PROMPTS = [
    "My grandmother kept bees behind the old mill, and every summer",
    "Zoë's café opened at 7:45 \u2014 \U0001f600 three   spaces\n\tand a tab",
    "In 1962 the committee voted 14 to 3",
]


@torch.no_grad()
def reference(model, window: list[int], lens=(), targets=(), mask=None) -> dict:
    """gptlib.step.step on the whole window from an empty cache, every query's attention row (what
    the kernel answers)."""
    past, ones, lens_t, targets_t, queries = step_inputs(
        model, lens=lens, targets=targets, queries=range(len(window))
    )
    mask = ones if mask is None else mask
    return step(model, torch.tensor([window]), past, mask, lens_t, targets_t, queries)


class Served:
    """A folder served on 127.0.0.1, recording each request's path and the bytes sent for it."""

    def __init__(self, directory: Path):
        log = self.log = []

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = Path(self.translate_path(self.path))
                log.append(
                    (
                        unquote(urlparse(self.path).path),
                        path.stat().st_size if path.is_file() else 0,
                    )
                )
                super().do_GET()

        self.server = ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory))
        )
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def bytes_since(self, n: int, prefix: str = "") -> int:
        return sum(size for path, size in self.log[n:] if path.startswith(prefix))

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def site(english, tmp_path_factory):
    """The test page beside the built book's _static/, served locally. Yields the Served folder."""
    from gptlib.widgets import PlaygroundView, SamplingView

    static = STATIC
    if not (static / "live" / "english.json").is_file():
        pytest.skip(f"no live model in {static} (run `make book`)")
    model, tok = english
    torch.manual_seed(0)
    playground = PlaygroundView(
        model, tok, OPENING, top_p=0.9, title="the book's English GPT, live"
    )
    stored = SamplingView.from_model(
        model,
        tok,
        ["She looked at the", OPENING],
        n_logits=256,
        n_logits_deep=64,
        top_p=0.9,
        title="stored: 256 tokens, then 64",
    )
    g = torch.Generator().manual_seed(5)
    wide = SamplingView(
        torch.randn(20_000, generator=g, dtype=torch.float64) * 1.5,
        [f"t{i}" for i in range(20_000)],
        top_p=0.9,
        title="stored: 4096 of 20000 tokens",
    )
    root = tmp_path_factory.mktemp("live")
    widget_page(
        root,
        static,
        [playground, stored, wide],
        width=900,
        styles=True,
        body='<button id="pst-back-to-top" type="button" style="display: block">Back to top'
        "</button>",
    )
    served = Served(root)
    served.root, served.views = root, (playground, stored, wide)
    try:
        yield served
    finally:
        served.close()


class Page:
    """The test page with every request, failure and script error recorded."""

    def __init__(self, browser, url: str, width: int = 1200):
        self.requests, self.failed, self.errors = [], [], []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on(
            "response",
            lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"),
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        open_page(self.page, url)
        self.page.locator(".gptlib-play").first.wait_for(timeout=30_000)
        self.play = self.page.locator(".gptlib-play").first

    def check_offline(self):
        hosts = {
            urlparse(u).hostname for u in self.requests if urlparse(u).scheme in ("http", "https")
        }
        assert hosts <= {"127.0.0.1"}, f"requests left the machine: {sorted(hosts)}"
        assert not self.failed, f"failed requests: {self.failed}"
        assert not self.errors, f"script errors: {self.errors}"

    def js(self, expr: str):
        """The value of ``expr`` with ``root`` bound to the playground's element (as one JSON text:
        logits, probabilities and patterns are large)."""
        return evaluate_json(
            self.page,
            f"() => {{ const root = document.querySelector('.gptlib-play'); return {expr}; }}",
        )

    def wait_idle(self, timeout=60_000):
        self.page.wait_for_function(
            "() => { const r = document.querySelector('.gptlib-play'); "
            "return r.dataset.busy === '0' && "
            "(r.dataset.live === 'browser' || r.dataset.live === 'failed'); }",
            timeout=timeout,
        )
        error = self.play.get_attribute("data-error")
        assert error is None, error

    def start(self) -> float:
        """Press "start the live model"; returns the page's own time from start to the first result
        (ms)."""
        self.play.locator(".gptlib-play-start").click()
        self.page.wait_for_function(
            "() => document.querySelector('.gptlib-play').dataset.firstMs !== undefined ||"
            " document.querySelector('.gptlib-play').dataset.live === 'failed'",
            timeout=60_000,
        )
        self.wait_idle()
        assert self.play.get_attribute("data-live") == "browser", self.play.locator(
            ".gptlib-play-status"
        ).text_content()
        return float(self.play.get_attribute("data-first-ms"))

    def type(self, text: str):
        before = self.play.get_attribute("data-ids")
        self.play.locator(".gptlib-play-text").fill(text)
        self.page.wait_for_function(
            "(before) => { const r = document.querySelector('.gptlib-play');"
            " return r.dataset.ids !== before && r.dataset.busy === '0'; }",
            arg=before,
            timeout=30_000,
        )
        self.wait_idle()

    def press(self, cls: str) -> tuple[float, float]:
        """Click a button of the playground and wait for its result. Returns two times in ms: the
        page's own, from the click's handler to the result drawn, and the test's wall time from
        the click to seeing it (which adds Playwright's round trips)."""
        n = self.js("Number(root.dataset.ids ? JSON.parse(root.dataset.ids).length : 0)")
        t0 = time.perf_counter()
        self.play.locator(cls).click()
        self.page.wait_for_function(
            "(n) => { const r = document.querySelector('.gptlib-play');"
            " return JSON.parse(r.dataset.ids).length !== n && r.dataset.busy === '0'; }",
            arg=n,
        )
        return float(self.play.get_attribute("data-act-ms")), 1000 * (time.perf_counter() - t0)

    def slider(self, cls: str, key: str, times: int = 1):
        s = self.play.locator(cls)
        s.focus()
        for _ in range(times):
            s.press(key)

    def close(self):
        self.page.close()


def _settings(page) -> dict:
    return json.loads(page.play.get_attribute("data-settings"))


def page_patterns(page) -> list:
    """The page's patterns as nested lists [l][h][i][j] for the keys j <= i."""
    return page.js(
        "root.__gptlib.patterns.map((l) => l.map((h) => h.map((r, i) =>"
        " Array.from(r.slice(0, i + 1)))))"
    )


def pattern_diff(got: list, attn: torch.Tensor) -> float:
    """max |page - PyTorch| over the causal weights of every head."""
    worst = 0.0
    for l, layer in enumerate(got):
        for h, rows in enumerate(layer):
            for i, row in enumerate(rows):
                d = (torch.tensor(row) - attn[l, h, i, : i + 1]).abs().max()
                worst = max(worst, float(d))
    return worst


def check_model_numbers(page, model, ids: list[int]) -> dict:
    """The page's window, logits, patterns and lens equal PyTorch's step on the same window."""
    n_ctx, L = model.config.n_ctx, model.config.n_layers
    assert json.loads(page.play.get_attribute("data-ids")) == ids
    window = ids[-n_ctx:]
    assert json.loads(page.play.get_attribute("data-window")) == window
    want = reference(model, window, lens=range(L + 1))
    got = torch.tensor(page.js("Array.from(root.__gptlib.logits)"))
    diff = {
        "logits": float((got - want["logits"][0]).abs().max()),
        "patterns": pattern_diff(page_patterns(page), want["attn"]),
    }
    # the logit lens: the top tokens read off each residual stream, at temperature 1
    lens = json.loads(page.play.get_attribute("data-lens"))
    p = torch.exp(want["lens_logits"].double() - want["lens_lse"].double()[:, None])
    diff["lens"] = max(
        float((torch.tensor(row["probs"]) - q[: len(row["probs"])]).abs().max())
        for row, q in zip(lens, p)
    )
    assert diff["logits"] <= 1e-4 and diff["lens"] <= 1e-4 and diff["patterns"] <= 1e-5, diff
    # the enlarged head is drawn from these patterns
    l, h = (
        int(x)
        for x in page.play.locator(".gptlib-attn")
        .get_attribute("data-view")
        .split(":")[0]
        .split("/")
    )
    shown = json.loads(page.play.locator(".gptlib-attn").get_attribute("data-pattern"))
    for i, row in enumerate(shown):
        torch.testing.assert_close(
            torch.tensor(row[: i + 1], dtype=torch.float32),
            want["attn"][l, h, i, : i + 1],
            atol=1e-5,
            rtol=0,
        )
    return diff


def check_distribution(page, model, ids: list[int]) -> dict:
    """The probabilities the page shows and samples from are next_token_probs of PyTorch's
    logits."""
    s = _settings(page)
    y = reference(model, ids[-model.config.n_ctx :])["logits"][0].double()
    want = next_token_probs(
        y,
        temperature=s["temperature"],
        top_k=s["top_k"] or None,
        top_p=s["top_p"] if s["top_p"] < 1 else None,
    )
    got = torch.tensor(page.js("Array.from(root.__gptlib.probs)"), dtype=torch.float64)
    # near-ties at a cut may fall either way in float32; all else agrees to float32 rounding
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0, msg=lambda m: f"at {s}: {m}")
    n = page.play.locator(".gptlib-samp-bar").count()
    order = torch.sort(y, descending=True, stable=True).indices[:n]
    widths = [
        float(w)
        for w in page.play.locator(".gptlib-samp-bar").evaluate_all(
            "bs => bs.map((b) => b.getAttribute('width'))"
        )
    ]
    assert widths == pytest.approx((320 * want[order]).tolist(), abs=0.02)
    other = float(page.play.locator(".gptlib-samp-other-bar").get_attribute("width"))
    assert other == pytest.approx(320 * (1 - float(want[order].sum())), abs=0.02)
    return s


# --- before the reader starts the live model ----------------------------------------------------


@pytest.fixture(scope="module")
def unstarted(browser, site):
    """One page of the module whose live model no test starts, shared by the tests that read it
    and its stored views: ``(page, n)``, ``n`` the requests served before it was opened."""
    n = len(site.log)
    page = Page(browser, site.url + "/index.html")
    try:
        yield page, n
    finally:
        page.close()


def test_a_page_that_does_not_start_the_live_model_downloads_nothing_new(unstarted, site, english):
    model, tok = english
    page, n = unstarted
    page.page.wait_for_function(
        "() => document.querySelectorAll('.gptlib-widget').length >= 3", timeout=30_000
    )
    paths = [p for p, _ in site.log[n:]]
    assert not [p for p in paths if any(f"/_static/{f}" in p for f in LIVE_FILES)], paths
    assert page.play.get_attribute("data-live") == "off"
    print(
        f"\n[live budget] page without starting the live model: {site.bytes_since(n) / 1e6:.2f} MB "
        "in "
        f"{len(paths)} requests, none of them the live model's files"
    )
    # the stored analysis is the model's: its tokens, its distribution under the settings
    ids = tok.encode(OPENING)
    assert json.loads(page.play.get_attribute("data-ids")) == ids
    assert [t.text_content() for t in page.play.locator(".gptlib-play-tok").all()] == [
        tok.token_str(i).replace(" ", "\u2423") for i in ids
    ]
    y = reference(model, ids)["logits"][0].double()
    got = torch.tensor(page.js("Array.from(root.__gptlib.probs)"), dtype=torch.float64)
    torch.testing.assert_close(got, next_token_probs(y, top_p=0.9), atol=2e-4, rtol=0)
    page.check_offline()


# --- the live model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def started(browser, site):
    """One page of the module with the live model started, shared by the tests that type into it
    or only read what it computes: ``(page, first, downloaded, live)``, the page's time from the
    start to the first result (ms), the bytes its start downloaded and the paths it asked."""
    page = Page(browser, site.url + "/index.html")
    n = len(site.log)
    first = page.start()
    try:
        yield page, first, site.bytes_since(n), {p for p, _ in site.log[n:]}
    finally:
        page.close()


DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 0.9}  # as site() made the playground


def fresh(page: Page, tok) -> Page:
    """The started page back where the reader found it, through its own controls: the lens and
    heads panels open, the one head's panel closed, no head removed, the sliders at DEFAULTS,
    the opening text typed with nothing drawn and the seed at its start (a new text, or the seed
    box's change, reseeds). So the tests that type, draw or press share one started page instead
    of loading and starting one each."""
    page.js(
        "(root.querySelector('.gptlib-play-lens-panel').open = true,"
        " root.querySelector('.gptlib-play-heads-panel').open = true,"
        " root.querySelector('.gptlib-play-head-panel').open = false)"
    )
    page.wait_idle()
    if page.play.locator(".gptlib-play-ablate-mode").is_checked():
        page.play.locator(".gptlib-play-ablate-mode").uncheck()
    if json.loads(page.play.get_attribute("data-ablated") or "[]"):
        page.play.locator(".gptlib-play-restore").click()
        page.wait_idle()
    if page.play.locator(".gptlib-play-text").input_value() != OPENING:
        page.type(OPENING)
    else:  # the seed box's change restarts the draws from the seed, as "reset" does
        page.play.locator(".gptlib-play-seed").dispatch_event("change")
        page.wait_idle()
    s = _settings(page)
    if s["temperature"] != DEFAULTS["temperature"]:
        page.slider(".gptlib-samp-temperature", "Home")
        page.slider(".gptlib-samp-temperature", "ArrowRight", 20)
    if s["top_k"] != DEFAULTS["top_k"]:
        page.slider(".gptlib-samp-topk", "Home")
    if s["top_p"] != DEFAULTS["top_p"]:
        page.slider(".gptlib-samp-topp", "End")
        page.slider(".gptlib-samp-topp", "ArrowLeft", 2)
    page.wait_idle()
    assert _settings(page) == DEFAULTS
    assert json.loads(page.play.get_attribute("data-ids")) == tok.encode(OPENING)
    assert json.loads(page.play.get_attribute("data-path")) == []
    assert json.loads(page.play.get_attribute("data-ablated") or "[]") == []
    return page


def test_the_live_model_gives_pytorchs_numbers(started, english):
    model, tok = english
    page, first, downloaded, live = started
    assert any(p.endswith(".wasm") for p in live) and any(
        p.endswith("english.onnx.0") for p in live
    )
    print(
        f"\n[live budget] start -> first result: {first:.0f} ms (page clock; budget 3000 ms); "
        "downloaded on start: "
        f"{downloaded / 1e6:.2f} MB (budget 25 MB): "
        + ", ".join(sorted(Path(p).name for p in live))
    )
    check_model_numbers(page, model, tok.encode(OPENING))
    worst = {}
    for text in PROMPTS:
        page.type(text)
        ids = tok.encode(text)
        diff = check_model_numbers(page, model, ids)
        worst = {k: max(worst.get(k, 0.0), v) for k, v in diff.items()}
        titles = page.play.locator(".gptlib-play-tok").evaluate_all("ts => ts.map((t) => t.title)")
        assert titles == [
            f"token {k}: id {i}, bytes {tok.token_bytes(i).hex(' ')}" for k, i in enumerate(ids)
        ]
    # no text: nothing is computed, and what belonged to the last text is cleared
    page.play.locator(".gptlib-play-text").fill("")
    page.page.wait_for_function(
        "() => JSON.parse(document.querySelector('.gptlib-play').dataset.ids || '[1]').length === 0"
        " || document.querySelector('.gptlib-play-tokens .gptlib-play-tok') === null",
        timeout=10_000,
    )
    page.wait_idle()
    assert "at least one token" in page.play.locator(".gptlib-samp-msg").text_content()
    assert (
        page.play.locator(".gptlib-samp-bar").count() == 0
        and page.play.locator(".gptlib-play-heads").is_hidden()
    )
    # a text longer than the context: the model sees its last n_ctx tokens
    long = " ".join(PROMPTS) * 6
    page.type(long)
    assert len(tok.encode(long)) > model.config.n_ctx
    diff = check_model_numbers(page, model, tok.encode(long))
    worst = {k: max(worst[k], v) for k, v in diff.items()}
    print(
        f"[live] max |page - PyTorch| over {len(PROMPTS) + 2} texts: "
        + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.play.screenshot(path=str(ARTIFACTS / "playground_live.png"))
    page.check_offline()


def test_closed_panels_cost_nothing_and_the_readers_latest_action_waits(started, english):
    """With the lens and the heads' panels closed a greedy click runs one bare step (no lens, no
    contributions, no rows) whose logits are still PyTorch's; opening the panels runs the model
    once for what they show, the rows of the positions computed while they were closed included.
    Three clicks in one moment: the first runs, the third waits, the second is superseded."""
    model, tok = english
    page = fresh(started[0], tok)
    page.js(
        "(root.querySelector('.gptlib-play-lens-panel').open = false,"
        " root.querySelector('.gptlib-play-heads-panel').open = false)"
    )
    page.press(".gptlib-play-greedy")
    ids = json.loads(page.play.get_attribute("data-ids"))
    assert page.js("root.__gptlib.patterns") is None and page.js("root.__gptlib.lens") is None
    assert page.js("root.__gptlib.direct") is None
    assert "(bare)" in page.play.locator(".gptlib-play-status").text_content()
    y = reference(model, ids)["logits"][0]
    got = torch.tensor(page.js("Array.from(root.__gptlib.logits)"))
    assert float((got - y).abs().max()) <= 1e-4 and int(got.argmax()) == int(y.argmax())
    page.js("[0, 1, 2].forEach(() => root.querySelector('.gptlib-play-greedy').click())")
    page.page.wait_for_function(
        "(n) => { const r = document.querySelector('.gptlib-play');"
        " return JSON.parse(r.dataset.ids).length >= n && r.dataset.busy === '0'; }",
        arg=len(ids) + 2,
    )
    page.wait_idle()
    time.sleep(0.2)  # a third token would have come by now
    page.wait_idle()
    ids = json.loads(page.play.get_attribute("data-ids"))
    assert len(ids) == len(tok.encode(OPENING)) + 3, ids  # 1 + 2 clicks, not 1 + 3
    page.js(
        "(root.querySelector('.gptlib-play-lens-panel').open = true,"
        " root.querySelector('.gptlib-play-heads-panel').open = true)"
    )
    page.page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play');"
        " return r.__gptlib.patterns && r.__gptlib.lens && r.dataset.busy === '0'; }",
    )
    page.wait_idle()
    check_model_numbers(page, model, ids)
    top = int(torch.tensor(page.js("Array.from(root.__gptlib.logits)")).argmax())
    want = reference(model, ids, targets=[top])["direct"].flatten()
    direct = torch.tensor(page.js("Array.from(root.__gptlib.direct)"))
    assert float((direct - want).abs().max()) <= 1e-4
    page.check_offline()


def _head_shown(page, before: str | None) -> dict:
    """Wait for the head panel's next answer (after ``before``, its last ``data-head-n``) and
    return what it asked and the view's stages (head.js's traceHead)."""
    page.page.wait_for_function(
        "(before) => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.headN && r.dataset.headN !== before && r.dataset.busy === '0'; }",
        arg=before,
        timeout=60_000,
    )
    page.wait_idle()
    asked = json.loads(page.play.get_attribute("data-head-asked"))
    trace = page.js(
        "JSON.parse(JSON.stringify(root.__gptlib.headTrace, (k, v) =>"
        " typeof v === 'number' && !Number.isFinite(v) ? null : v))"
    )
    return {"asked": asked, "trace": trace, "key": page.play.get_attribute("data-head-n")}


def _check_head(model, window: list[int], shown: dict, removed=(), tol=1e-4) -> dict:
    """Every stage the view shows equals head_trace's on the same window (the removed heads
    ablated, as the step's mask removes them; RoPE's stages for a rotary model), to ``tol``
    times the stage's largest entry (at least 1); returns the largest such relative difference
    of each stage."""
    from gptlib.circuits import ablate_heads
    from gptlib.head_trace import head_trace

    a, got = shown["asked"], shown["trace"]
    with ablate_heads(model, list(removed)):
        tr = head_trace(
            model, window, a["layer"], a["head"], a["position"], a["target"], a.get("pair")
        )
    names = ["q", "k", "v", "scores", "scaled", "pattern", "z", "out"]
    names = {**dict(zip(names, names)), "lnOut": "ln_out", "qRaw": "q_raw", "kRaw": "k_raw"}
    if tr.pair is not None:
        names |= {"angleRel": "angle_rel", "pairScores": "pair_scores"}
    worst = {}
    for name, field in names.items():
        want = getattr(tr, field).double()
        diff = float((torch.tensor(got[name], dtype=torch.float64) - want).abs().max())
        worst[name] = diff / max(1.0, float(want.abs().max()))
        assert worst[name] <= tol, (name, diff)
    assert got["contribution"] == pytest.approx(tr.contribution, abs=tol, rel=tol)
    assert got["sum"] == pytest.approx(1.0, abs=1e-9)
    return worst


def test_one_head_step_by_step(started, english):
    """The head panel, closed, costs nothing; opened, it shows the selected head at the last query
    with the step's most probable token: its softmax row is the heads panel's row of that head,
    its contribution the step's direct attribution, and every stage head_trace's. A click on a
    token moves the query (the token v is then the one that follows), the layer and head
    selectors the head; with a head ablated the view is the ablated model's."""
    model, tok = english
    H = model.config.n_heads
    page = fresh(started[0], tok)  # no test before this one opens the head panel
    assert page.play.get_attribute("data-head-asked") is None  # closed: no head computed
    window = tok.encode(OPENING)
    page.js("(root.querySelector('.gptlib-play-head-panel').open = true)")
    shown = _head_shown(page, None)
    layer, head = shown["asked"]["layer"], shown["asked"]["head"]
    T = len(window)
    top = int(torch.tensor(page.js("Array.from(root.__gptlib.logits)")).argmax())
    assert shown["asked"]["position"] == T - 1 and shown["asked"]["target"] == top
    row = page.js(f"Array.from(root.__gptlib.patterns[{layer}][{head}][{T - 1}])")
    assert (
        float((torch.tensor(shown["trace"]["pattern"]) - torch.tensor(row[:T])).abs().max()) <= 1e-6
    )
    direct = page.js(f"root.__gptlib.direct[{layer * H + head}]")
    assert shown["trace"]["contribution"] == pytest.approx(direct, abs=1e-5, rel=1e-4)
    _check_head(model, window, shown)
    panel = page.play.locator(".gptlib-head").text_content()
    assert "(4.6) (4.3) (4.2) (4.1)" in panel and "NaN" not in panel
    # a click on token 2: the query moves there, v is token 3
    page.play.locator(".gptlib-play-tok").nth(2).click()
    shown = _head_shown(page, shown["key"])
    assert shown["asked"]["position"] == 2 and shown["asked"]["target"] == window[3]
    _check_head(model, window, shown)
    # another layer and head by the selectors
    page.play.locator(".gptlib-head-pick-layer").select_option("1")
    shown = _head_shown(page, shown["key"])
    page.play.locator(".gptlib-head-pick-head").select_option("3")
    shown = _head_shown(page, shown["key"])
    assert (shown["asked"]["layer"], shown["asked"]["head"]) == (1, 3)
    _check_head(model, window, shown)
    # head 0 of layer 0 ablated (a click on it in ablation mode): the streams after it change,
    # and the view, computed again, is the ablated model's
    page.play.locator(".gptlib-play-ablate-mode").check()
    page.play.locator(".gptlib-attn-thumb[data-layer='0'][data-head='0']").click()
    shown = _head_shown(page, shown["key"])
    assert json.loads(page.play.get_attribute("data-ablated")) == [[0, 0]]
    _check_head(model, window, shown, removed=[(0, 0)])
    page.check_offline()


def test_the_pages_tokenizer_gives_bpe_ids(started, english):
    """@huggingface/tokenizers on the exported tokenizer.json, in the browser, against
    BPETokenizer.encode on fuzzed text (emoji, accents, digits, whitespace runs); and the page's
    decoder against BPETokenizer.decode (on the started page, which they leave as it was)."""
    _, tok = english
    page = started[0]
    texts = fuzzed_texts(1000, 25, ("<|endoftext|>",)) + PROMPTS
    got = evaluate_json(
        page.page,
        "async (texts) => { const g = document.querySelector('.gptlib-play').__gptlib;"
        " const out = []; for (const t of texts) out.push(await g.encode(t)); return out; }",
        texts,
    )
    bad = [(t, a, tok.encode(t)) for t, a in zip(texts, got) if a != tok.encode(t)]
    assert not bad, bad[:3]
    ids = [tok.encode(t) for t in texts[:200]] + [[0xE9], [4095, 100, 0xC3]]
    decoded = evaluate_json(
        page.page,
        "(all) => all.map((ids) => document.querySelector('.gptlib-play').__gptlib.decode(ids))",
        ids,
    )
    assert decoded == [tok.decode(i) for i in ids]
    page.check_offline()


def test_forty_draws_and_the_sliders_follow_next_token_probs(started, english):
    model, tok = english
    page = fresh(started[0], tok)
    ids = tok.encode(OPENING)
    checked = [check_distribution(page, model, ids)]
    # the sliders: temperature down, top-k on, top-p lower, then off again; each is next_token_probs
    for cls, key, times in [
        (".gptlib-samp-temperature", "ArrowLeft", 6),
        (".gptlib-samp-topk", "ArrowRight", 12),
        (".gptlib-samp-topp", "ArrowLeft", 4),
        (".gptlib-samp-topk", "Home", 1),
        (".gptlib-samp-temperature", "ArrowRight", 16),
        (".gptlib-samp-topp", "End", 1),
        (".gptlib-samp-temperature", "Home", 1),
    ]:
        page.slider(cls, key, times)
        checked.append(check_distribution(page, model, ids))
    assert len({json.dumps(c, sort_keys=True) for c in checked}) == len(checked)
    # greedy at temperature 0: the argmax
    page.press(".gptlib-play-greedy")
    y = reference(model, ids)["logits"][0]
    assert json.loads(page.play.get_attribute("data-path")) == [int(torch.argmax(y))]
    page.play.locator(".gptlib-samp-reset").click()
    page.wait_idle()
    # 40 seeded draws at temperature 1, top-p 0.9; each the inverse CDF at the page's u
    page.slider(".gptlib-samp-temperature", "ArrowRight", 20)
    page.slider(".gptlib-samp-topp", "ArrowLeft", 2)
    assert _settings(page) == {"temperature": 1.0, "top_k": 0, "top_p": 0.9}
    times, path = [], []
    for draw in range(40):
        probs = page.js("Array.from(root.__gptlib.probs)")
        times.append(page.press(".gptlib-samp-step"))
        u = float(page.play.get_attribute("data-u"))
        path = json.loads(page.play.get_attribute("data-path"))
        assert len(path) == draw + 1
        mass, want = 0.0, None  # the inverse CDF at u, most probable first
        logits = reference(model, (ids + path[:-1])[-model.config.n_ctx :])["logits"][0]
        for i in torch.sort(logits, descending=True, stable=True).indices.tolist():
            if probs[i] > 0:
                mass += probs[i]
                want = i
                if u < mass:
                    break
        assert path[-1] == want, (draw, u)
        if draw % 10 == 9:
            check_distribution(page, model, ids + path)
            check_model_numbers(page, model, ids + path)
    assert page.play.locator(".gptlib-samp-msg").text_content() == ""
    assert page.play.get_attribute("data-error") is None
    inside, outside = (sorted(t[k] for t in times) for k in (0, 1))
    print(
        "\n[live budget] per drawn token, 40 draws (forward pass and drawing): in the page median "
        f"{inside[20]:.0f} ms, "
        f"max {inside[-1]:.0f} ms (budget 100 ms); seen by the test median {outside[20]:.0f} ms; "
        "the last forward pass "
        f"({len(json.loads(page.play.get_attribute('data-window')))} tokens): "
        f"{page.play.get_attribute('data-ms')} ms"
    )
    assert page.play.locator(".gptlib-play-out").text_content() == tok.decode(ids + path)
    # undo, then reset: the seeded draws repeat
    page.play.locator(".gptlib-samp-undo").click()
    page.wait_idle()
    assert json.loads(page.play.get_attribute("data-path")) == path[:-1]
    page.play.locator(".gptlib-samp-reset").click()
    page.wait_idle()
    assert json.loads(page.play.get_attribute("data-path")) == []
    for _ in range(3):
        page.press(".gptlib-samp-step")
    assert json.loads(page.play.get_attribute("data-path")) == path[:3]
    page.check_offline()


def test_sampling_past_the_context_slides_the_window(started, english):
    model, tok = english
    page = started[0]  # (a text of its own typed below)
    text = " ".join(PROMPTS * 2)
    ids = tok.encode(text)
    assert 100 < len(ids) < model.config.n_ctx
    page.type(text)
    page.slider(".gptlib-samp-temperature", "Home")  # greedy through the boundary: as generate does
    from gptlib.sampling import generate

    times = [page.press(".gptlib-samp-step")[0] for _ in range(model.config.n_ctx + 5 - len(ids))]
    path = json.loads(page.play.get_attribute("data-path"))
    full = sorted(times[-6:])  # the window full: n_ctx positions per step
    print(
        f"\n[live budget] per drawn token with a full window of {model.config.n_ctx} tokens, in "
        "the page: "
        f"{full[0]:.0f} to {full[-1]:.0f} ms (budget 100 ms)"
    )
    want = generate(model, torch.tensor(ids), len(path), temperature=0.0).tolist()
    assert ids + path == want
    check_model_numbers(page, model, ids + path)
    assert len(json.loads(page.play.get_attribute("data-window"))) == model.config.n_ctx
    assert (
        page.play.locator(".gptlib-play-tok.out").count()
        == len(ids) + len(path) - model.config.n_ctx
    )
    page.check_offline()


def test_a_page_opened_from_a_file_says_why_the_live_model_cannot_start(browser, site):
    page = Page(browser, (site.root / "index.html").as_uri())
    page.play.locator(".gptlib-play-start").click()
    page.page.wait_for_function(
        "() => document.querySelector('.gptlib-play').dataset.live === 'failed'", timeout=30_000
    )
    status = page.play.locator(".gptlib-play-status").text_content()
    assert "file://" in status and "stored analysis" in status
    assert page.play.locator(".gptlib-play-start").is_enabled()
    assert not page.errors, page.errors
    page.close()


# --- the stored sampling views tell the truth ---------------------------------------------------


def test_stored_views_show_the_models_true_probabilities(unstarted, english):
    """A view that stores 256 logits (64 deeper) and the others' weight: each stored token's
    probability is the model's own under every setting; the others are one bar; top-p cuts the
    true cumulative mass; a draw past the stored tree ends with a plain statement of fact."""
    model, tok = english
    page = unstarted[0]
    views = page.page.locator(".gptlib-samp")
    root = views.nth(0)
    root.wait_for()
    for k, prompt in enumerate(["She looked at the", OPENING]):
        root.locator(".gptlib-samp-prompt").select_option(str(k))
        y = reference(model, tok.encode(prompt))["logits"][0].double()
        for cls, key in [
            (None, None),
            (".gptlib-samp-temperature", "ArrowLeft"),
            (".gptlib-samp-topp", "ArrowLeft"),
            (".gptlib-samp-topk", "ArrowRight"),
            (".gptlib-samp-topk", "Home"),
            (".gptlib-samp-topp", "End"),
        ]:
            if cls:
                root.locator(cls).focus()
                root.locator(cls).press(key)
            s = json.loads(root.get_attribute("data-settings"))
            want = next_token_probs(
                y,
                temperature=s["temperature"],
                top_k=s["top_k"] or None,
                top_p=s["top_p"] if s["top_p"] < 1 else None,
            )
            got = torch.tensor(json.loads(root.get_attribute("data-probs")), dtype=torch.float64)
            stored_ids = json.loads(root.get_attribute("data-ids"))
            if root.get_attribute("data-approx") == "0":
                torch.testing.assert_close(
                    got, want[stored_ids], atol=1e-4, rtol=1e-3, msg=lambda m: f"{prompt} {s}: {m}"
                )
                assert float(root.get_attribute("data-rest")) == pytest.approx(
                    1 - float(want[stored_ids].sum()), abs=1e-4
                )
            else:  # top-p reaches past the stored tokens: their proportions are still the model's
                torch.testing.assert_close(
                    got / got.sum(), want[stored_ids] / want[stored_ids].sum(), atol=1e-4, rtol=1e-3
                )
                assert (
                    "Top-p reaches past the stored tokens"
                    in root.locator(".gptlib-samp-stats").text_content()
                )
            other = float(root.locator(".gptlib-samp-other-bar").get_attribute("width"))
            shown = sum(
                float(b.get_attribute("width")) for b in root.locator(".gptlib-samp-bar").all()
            )
            assert other + shown == pytest.approx(
                320, abs=0.1
            )  # the bars add up to the whole distribution
    # the stop is a fact, not an error: greedy draws walk the stored tree, then the text ends
    root.locator(".gptlib-samp-temperature").focus()
    root.locator(".gptlib-samp-temperature").press("Home")
    for _ in range(4):
        root.locator(".gptlib-samp-step").click()
    msg = root.locator(".gptlib-samp-msg").text_content()
    assert (
        root.get_attribute("data-stuck") == "1"
        and "so the text ends here" in msg
        and "cannot" not in msg
    )
    # 20000 tokens, 4096 stored: the others' bar, and a draw among them said plainly
    wide_root = views.nth(1)
    rest = float(wide_root.get_attribute("data-rest"))
    assert (
        0 < rest < 1
        and "the total weight of the other 15904"
        in wide_root.locator(".gptlib-samp-stats").text_content()
    )
    y = (
        torch.randn(20_000, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 1.5
    )  # as in site()
    kept = json.loads(wide_root.get_attribute("data-ids"))
    want = next_token_probs(y, top_p=0.9)
    got = torch.tensor(json.loads(wide_root.get_attribute("data-probs")), dtype=torch.float64)
    if wide_root.get_attribute("data-approx") == "0":
        torch.testing.assert_close(got, want[kept], atol=2e-5, rtol=1e-4)
    wide_root.locator(".gptlib-samp-topp").focus()
    wide_root.locator(".gptlib-samp-topp").press(
        "End"
    )  # no cut: the others hold their whole weight
    got = torch.tensor(json.loads(wide_root.get_attribute("data-probs")), dtype=torch.float64)
    torch.testing.assert_close(got, next_token_probs(y)[kept], atol=2e-5, rtol=1e-4)
    assert float(wide_root.get_attribute("data-rest")) == pytest.approx(
        1 - float(next_token_probs(y)[kept].sum()), abs=2e-5
    )
    for _ in range(40):  # draws until one falls among the others, which the page says plainly
        if wide_root.get_attribute("data-stuck") == "1":
            wide_root.locator(".gptlib-samp-reset").click()
        wide_root.locator(".gptlib-samp-step").click()
        if json.loads(wide_root.get_attribute("data-path"))[-1] == -1:
            break
    assert json.loads(wide_root.get_attribute("data-path"))[-1] == -1
    assert (
        "The draw fell among the 15904 tokens this page does not list"
        in wide_root.locator(".gptlib-samp-msg").text_content()
    )
    page.check_offline()


# --- dark mode, narrow pages
# ------------------------------------------------------------------------


def _luminance(css: str) -> float:
    r, g, b = (int(float(v)) for v in css[css.index("(") + 1 : css.index(")")].split(",")[:3])

    def lin(c):
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def _contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_dark_mode_and_a_420_pixel_page(browser, site):
    page = Page(browser, site.url + "/index.html", width=420)
    if not page.page.evaluate(
        "() => getComputedStyle(document.documentElement).getPropertyValue('--pst-color-text-base')"
    ):
        pytest.skip("the built book has no pydata-sphinx-theme styles")
    for theme in ("light", "dark"):
        page.page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{theme}'; }}")
        # text against what is behind it: the nearest box with a background (the theme's, or its
        # card around widget outputs)
        behind = (
            "e => { for (let a = e; a; a = a.parentElement) { "
            "const c = getComputedStyle(a).backgroundColor;"
            " if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c; "
            "} return 'rgb(255, 255, 255)'; }"
        )
        for cls in (
            ".gptlib-samp-tok",
            ".gptlib-play-status",
            ".gptlib-samp-stats",
            ".gptlib-attn-score-key",
            ".gptlib-attn-ov-layer",
            ".gptlib-title",
        ):
            e = page.page.locator(cls).first
            colour = (
                e.evaluate("e => getComputedStyle(e).color")
                if cls != ".gptlib-samp-tok"
                else e.evaluate("e => getComputedStyle(e).fill")
            )
            bg = e.evaluate(behind)
            assert _contrast(colour, bg) >= 3, (theme, cls, colour, bg)
        ARTIFACTS.mkdir(exist_ok=True)
        page.page.screenshot(path=str(ARTIFACTS / f"live_page_420px_{theme}.png"), full_page=True)
    # nothing is wider than the page: the charts scale down
    width = page.page.evaluate("() => document.documentElement.clientWidth")
    for cls in (".gptlib-samp", ".gptlib-play", ".gptlib-samp-chart"):
        for e in page.page.locator(cls).all():
            box = e.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (cls, box, width)
    # the back-to-top button never covers a widget's control in use
    step = page.page.locator(".gptlib-samp .gptlib-samp-step").first
    step.scroll_into_view_if_needed()
    step.hover()
    box = step.bounding_box()
    hit = page.page.evaluate(
        "([x, y]) => document.elementFromPoint(x, y).className",
        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
    )
    assert "gptlib-samp-step" in hit
    assert (
        page.page.locator("#pst-back-to-top").evaluate("e => getComputedStyle(e).display") == "none"
    )
    page.check_offline()
    page.close()
