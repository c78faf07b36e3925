"""The built HTML book in a real browser: widgets live without a kernel, maths rendered, no CDN.
(That every page's maths is typeset, offline, is measured in test_browser_reading.py's one load of
each page.)

Needs `make book` first (`make test` runs it) and Debian's Chromium at /usr/bin/chromium, driven
by Playwright (the fixtures ``site`` and ``browser`` are in conftest.py). Screenshots go to
test-artifacts/. GPTLIB_BOOK_HTML points the test at another
built book (default: _build/html). A chapter whose page is not in the book is skipped, by name.

Besides the chapters, one page is made here, served beside the built book and loading only the
book's own scripts: both widgets on the shipped English model (models/english), so that every
interaction
is tested on a trained model whatever the chapters show.
"""

from __future__ import annotations

import json
import math
import re
from urllib.parse import urlparse

import pytest
import torch
from browser_support import (
    HTML,
    MATHS_MARKED,
    NO_MATHJAX,
    ROOT,
    open_page,
    serve,
    widget_page,
)

from gptlib.sampling import next_token_probs

browser_test = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts"
CDN_HOSTS = ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com")


class Page:
    """A chapter page (or ``url``), a tab of the module's browser ``context``, with every
    request, failure and script error recorded."""

    def __init__(self, context, site: str, chapter: str, url: str | None = None):
        if url is None and not (HTML / "chapters" / f"{chapter}.html").is_file():
            pytest.skip(f"chapter {chapter} is not in the built book")
        self.requests, self.failed, self.errors = [], [], []
        self.page = context.new_page()
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.on(
            "response",
            lambda r: r.status >= 400 and self.failed.append(f"{r.url} (HTTP {r.status})"),
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        open_page(self.page, url or f"{site}/chapters/{chapter}.html")

    def check_offline(self):
        hosts = {
            urlparse(u).hostname for u in self.requests if urlparse(u).scheme in ("http", "https")
        }
        assert hosts <= {"127.0.0.1"}, f"requests left the machine: {sorted(hosts)}"
        assert not self.failed, f"failed requests: {self.failed}"
        assert not self.errors, f"script errors: {self.errors}"

    def check_maths(self):
        """Every formula arrives typeset (book_ext/typeset_maths.mjs, when the book was built):
        none is left raw, the page loads no MathJax, and the maths fonts it uses come from the
        book itself (check_offline: no other host)."""
        self.page.wait_for_function(MATHS_MARKED, timeout=20_000)
        self.page.evaluate("() => document.fonts.ready.then(() => null)")
        loads = self.page.evaluate(NO_MATHJAX)
        assert not loads["mathjax"], "the page loads MathJax"
        assert not loads["fonts_failed"], f"maths fonts that failed: {loads['fonts_failed']}"
        assert "MJXTEX" in loads["fonts_loaded"], loads
        raw = self.page.evaluate(
            """() => [...document.querySelectorAll('article .math')]
                     .filter((e) => !e.querySelector('mjx-container'))
                     .map((e) => e.textContent.slice(0, 60))"""
        )
        assert not raw, f"formulas left untypeset: {raw[:5]}"
        assert self.page.locator("article mjx-container").count() > 0

    def screenshot(self, name: str, selector: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.locator(selector).first.screenshot(path=str(ARTIFACTS / name))

    def close(self):
        self.page.close()


@pytest.fixture(scope="module")
def context(browser):
    """One browser context for the module's tabs, as a reader's, with the widgets' test hook on
    (as conftest's ``browser.new_page``): the scripts every page loads (the theme's, the
    widget manager) come from its caches, not fetched and set up afresh for each page. Each
    test opens its own tab (a test changes its widgets), so that none depends on another's."""
    ctx = browser.new_context(viewport={"width": 1200, "height": 900})
    ctx.add_init_script("window.__gptlibTest = true;")
    try:
        yield ctx
    finally:
        ctx.close()


def test_every_chapter_is_in_the_toc():
    """`only_build_toc_files` leaves a chapter missing from _toc.yml silently out of the book."""
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\s*(?:-\s*)?(?:file|root):\s*(\S+)\s*$", toc, re.M))
    pages = {
        p.with_suffix("").relative_to(ROOT).as_posix()
        for p in (ROOT / "chapters").iterdir()
        if p.suffix in (".ipynb", ".md")
    }
    assert pages - listed == set(), f"chapters missing from _toc.yml: {sorted(pages - listed)}"
    assert listed - pages == set(), (
        f"_toc.yml lists files that do not exist: {sorted(listed - pages)}"
    )


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
def test_bpe_widget_slider_changes_the_split(context, site):
    p = Page(context, site, "01_tokens")
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


def _rgb(a: float) -> str:
    """The page's colour for attention weight a (heads.js's scale on the light theme's white
    background), as the browser writes it."""
    stops = [(255, 255, 255), (198, 219, 239), (107, 174, 214), (33, 113, 181), (8, 48, 107)]
    x = min(max(a, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    c = [round(u + f * (v - u)) for u, v in zip(stops[i], stops[i + 1])]
    return f"rgb({c[0]}, {c[1]}, {c[2]})"


def check_attention_view(root) -> list[str]:
    """Every interaction of the attention view: the overview's heads and their scores, click to
    enlarge, the colour legend, the head selector, hover on a query row and on a token of the text.
    Returns the names of the scores shown."""
    from gptlib.circuits import (
        first_token_score,
        induction_pairs,
        induction_score,
        previous_token_score,
    )

    root.wait_for(timeout=20_000)
    more = root.locator(".gptlib-attn-text .gptlib-more")  # a long text is shown cut short:
    if more.count():  # its button puts every token back
        more.first.click()
    tokens = [
        t.replace("\u21b5\n", "\n")
        for t in root.locator(".gptlib-attn-tok").evaluate_all("ts => ts.map((t) => t.textContent)")
    ]
    repeats = bool(induction_pairs(tokens))
    layers = root.locator(".gptlib-attn-layer option").count()
    heads = root.locator(".gptlib-attn-head option").count()
    thumbs = root.locator(".gptlib-attn-thumb")
    assert thumbs.count() == layers * heads, "one cell per head in the overview"
    labels = thumbs.evaluate_all("ts => ts.map((t) => t.getAttribute('aria-label'))")
    assert len(set(labels)) == layers * heads and all(", " in x for x in labels)
    names = ["previous token", "first token"] + (["induction"] if repeats else [])
    assert root.locator(".gptlib-attn-thumb.selected").count() == 1
    # the colour scale's legend: a gradient from the colour of 0 to the colour of 1
    legend = root.locator(".gptlib-attn-legend-bar").last.evaluate("e => e.style.background")
    assert _rgb(0) in legend and _rgb(1) in legend, legend
    # each cell is coloured by the chosen score (the first: previous token)
    scores = json.loads(root.get_attribute("data-scores"))
    assert list(scores)[: len(names)] == names and root.get_attribute("data-colour-by") == names[0]
    first = thumbs.first.evaluate("e => e.style.background")
    assert first == _rgb(scores[names[0]][0][0]), first
    # the pointer on the last cell shows its head; a click keeps it, and its scores are those of
    # the shown pattern
    last = thumbs.last
    l, h = int(last.get_attribute("data-layer")), int(last.get_attribute("data-head"))
    before = root.get_attribute("data-view")
    last.hover()
    root.page.wait_for_function(
        "([e, v]) => e.dataset.view.startsWith(v)", arg=[root.element_handle(), f"{l}/{h}:"]
    )
    last.click()
    assert (
        root.get_attribute("data-view").startswith(f"{l}/{h}:")
        and root.get_attribute("data-view") != before
    )
    assert (
        "selected" in last.get_attribute("class")
        and root.locator(".gptlib-attn-thumb.selected").count() == 1
    )
    A = torch.tensor(json.loads(root.get_attribute("data-pattern")), dtype=torch.float64)
    want = {"previous token": previous_token_score(A), "first token": first_token_score(A)}
    if repeats:
        want["induction"] = induction_score(A, tokens)
    for name, value in want.items():
        shown = scores[name][l][h]
        assert abs(shown - float(value)) <= 1e-3 + 1e-9, (name, shown, float(value))
    assert all(
        f"{name} score" in root.locator(".gptlib-attn-current").text_content() for name in names
    )
    # another score colours the cells; the arrow keys move to a head and show it
    root.locator(".gptlib-attn-colour").select_option(names[1])
    assert thumbs.first.evaluate("e => e.style.background") == _rgb(scores[names[1]][0][0])
    last.focus()
    last.press("ArrowUp" if l > 0 else "ArrowLeft")
    moved = (l - 1, h) if l > 0 else (l, h - 1)
    root.page.wait_for_function(
        "([e, v]) => e.dataset.view.startsWith(v)",
        arg=[root.element_handle(), f"{moved[0]}/{moved[1]}:"],
    )
    root.page.keyboard.press("Enter")  # Enter keeps the head the keyboard is on
    sel = root.locator(".gptlib-attn-thumb.selected")
    assert (sel.get_attribute("data-layer"), sel.get_attribute("data-head")) == tuple(
        map(str, moved)
    )
    root.page.evaluate("() => document.activeElement.blur()")
    # the selector still works and moves the selection
    root.locator(".gptlib-attn-head").select_option("0")
    root.locator(".gptlib-attn-layer").select_option("0")
    assert root.get_attribute("data-view").startswith("0/0:")
    assert root.locator(".gptlib-attn-thumb.selected").first.get_attribute("data-head") == "0"
    A = json.loads(root.get_attribute("data-pattern"))
    T = root.locator(".gptlib-attn-query").count()
    # hover a query row of the heatmap: the key tokens are shaded by its weights
    root.locator(".gptlib-attn-query").last.hover()  # the last query sees every key
    assert root.get_attribute("data-focus") == str(T - 1)
    shaded = root.locator(".gptlib-attn-key").evaluate_all(
        "ks => ks.map((k) => k.style.background)"
    )
    assert shaded == [_rgb(a) for a in A[T - 1]], "hovering a query shades the keys it attends to"
    # hover a token of the text: every token is coloured by the weight it gets from that one
    i = T // 2
    words = root.locator(".gptlib-attn-tok")
    assert words.count() == T
    words.nth(i).hover()
    assert root.get_attribute("data-focus") == str(i)
    colours = words.evaluate_all("ws => ws.map((w) => w.style.background)")
    assert colours[: i + 1] == [_rgb(a) for a in A[i][: i + 1]] and not any(colours[i + 1 :])
    assert "gptlib-attn-hot" in words.nth(i).get_attribute("class")
    assert root.locator(".gptlib-attn-focus").text_content().startswith("query ")
    return names


@browser_test
def test_attention_widget_head_selector_changes_heatmap(context, site):
    p = Page(context, site, "04_attention")
    root = p.page.locator(".gptlib-attn").first
    root.wait_for(timeout=20_000)
    before = root.get_attribute("data-view")
    heads = p.page.locator(".gptlib-attn-head").first
    n = heads.locator("option").count()
    assert n >= 2
    heads.select_option("1")
    after = root.get_attribute("data-view")
    assert after != before and after.split(":")[0].endswith("/1")
    check_attention_view(root)
    p.screenshot("attention_widget.png", ".gptlib-attn")
    p.check_maths()
    p.check_offline()
    p.close()


def _python_probs(logits, settings, rest_logz=None):
    """next_token_probs over the stored tokens and, where a node does not store every token, the
    others as one block after them, of weight exp(rest_logz) at this temperature (relative to the
    largest logit): top-k keeps only stored tokens; top-p keeps the others' mass up to p.
    Returns (probabilities of the stored tokens, mass kept of the others)."""
    y = torch.tensor(logits, dtype=torch.float64)
    T, k, p = (
        settings["temperature"],
        settings["top_k"] or None,
        settings["top_p"] if settings["top_p"] < 1 else None,
    )
    if rest_logz is None or T == 0:
        return next_token_probs(y, temperature=T, top_k=k, top_p=p), 0.0
    w = torch.exp((y - y.max()) / T)
    z = float(w.sum()) + math.exp(rest_logz)
    q, rest = w / z, math.exp(rest_logz) / z
    order = torch.sort(y, descending=True, stable=True).indices
    if k is not None:
        q[order[k:]] = 0
        q, rest = q / q.sum(), 0.0
    if p is not None:
        before = torch.cumsum(q[order], 0) - q[order]
        q[order[before >= p]] = 0
        rest = min(rest, max(0.0, p - float(q.sum()))) if rest else 0.0
        total = float(q.sum()) + rest
        q, rest = q / total, rest / total
    return q, rest


SHIPPED = ROOT / "models" / "english"
PROMPTS = ["The", "It is", "She looked at the"]
X0, W = 120, 320  # sampling.js: where the probability axis starts, and its length (0 to 1)


def _widths(root, cls):
    """The widths of the bars of class ``cls`` in ``root`` (one round trip to the page)."""
    widths = root.locator(f".{cls}").evaluate_all("bs => bs.map((b) => b.getAttribute('width'))")
    return [float(w) for w in widths]


def check_sampling_distribution(root, checked: list):
    """The browser's distribution equals gptlib.sampling.next_token_probs to 1e-5; the bars, the
    temperature-1 ghosts and the cumulative-mass line are drawn from it on the fixed axis."""
    logits = json.loads(root.get_attribute("data-logits"))
    probs = torch.tensor(json.loads(root.get_attribute("data-probs")), dtype=torch.float64)
    settings = json.loads(root.get_attribute("data-settings"))
    rest_logz = (
        float(root.get_attribute("data-rest-logz"))
        if root.get_attribute("data-rest-logz")
        else None
    )
    want, rest = _python_probs(logits, settings, rest_logz)
    torch.testing.assert_close(probs, want, atol=1e-5, rtol=0, msg=lambda m: f"at {settings}: {m}")
    assert float(root.get_attribute("data-rest")) == pytest.approx(rest, abs=1e-5)
    y = torch.tensor(logits, dtype=torch.float64)
    order = torch.sort(y, descending=True, stable=True).indices
    n = root.locator(".gptlib-samp-bar").count()
    assert n >= 1 and root.locator(".gptlib-samp-ghost").count() == n
    shown = order[:n]
    assert _widths(root, "gptlib-samp-bar") == pytest.approx((W * probs[shown]).tolist(), abs=0.01)
    rest1 = (
        float(root.get_attribute("data-rest-logz1"))
        if root.get_attribute("data-rest-logz1")
        else None
    )
    ghost, _ = _python_probs(
        logits, {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, rest1
    )  # temperature 1, nothing cut
    assert _widths(root, "gptlib-samp-ghost") == pytest.approx(
        (W * ghost[shown]).tolist(), abs=0.01
    )
    q, _ = _python_probs(logits, settings | {"top_p": 1.0}, rest_logz)
    cum = torch.cumsum(q[order], 0)[:n]
    xs = [
        float(pt.split(",")[0])
        for pt in root.locator(".gptlib-samp-cum").get_attribute("points").split()
    ]
    assert xs == pytest.approx((X0 + W * cum).tolist(), abs=0.01), "the cumulative mass line"
    pline = root.locator(".gptlib-samp-pline")
    if settings["top_p"] < 1:
        assert float(pline.get_attribute("x1")) == pytest.approx(
            X0 + W * settings["top_p"], abs=0.01
        )
    else:
        assert pline.count() == 0
    checked.append(settings)


def check_sample_step(root, tree_root: dict | None = None) -> int:
    """One "sample next token" step: the token drawn is the inverse CDF, at the page's seeded u,
    of the distribution shown (most probable first); the text grows by it; the view moves on to
    the stored distribution after it, or says plainly that it has none. Returns the drawn id."""
    path = json.loads(root.get_attribute("data-path"))
    probs = torch.tensor(json.loads(root.get_attribute("data-probs")), dtype=torch.float64)
    logits = torch.tensor(json.loads(root.get_attribute("data-logits")), dtype=torch.float64)
    ids = json.loads(root.get_attribute("data-ids"))
    new = root.locator(".gptlib-samp-new").count()
    root.locator(".gptlib-samp-step").click()
    # a step that asks the live model (past a stored tree) ends when the page is no longer busy
    root.page.wait_for_function(
        "(r) => r.dataset.busy !== '1'", arg=root.element_handle(), timeout=120_000
    )
    u = float(root.get_attribute("data-u"))
    after = json.loads(root.get_attribute("data-path"))
    assert after[:-1] == path and len(after) == len(path) + 1
    expected, mass = None, 0.0  # the inverse CDF at u, most probable first, as the page defines it
    for i in torch.sort(logits, descending=True, stable=True).indices.tolist():
        if probs[i] > 0:
            mass += float(probs[i])
            expected = i
            if u < mass:
                break
    assert after[-1] == ids[expected] and probs[expected] > 0
    assert root.locator(".gptlib-samp-new").count() == new + 1
    if tree_root is not None:
        node = tree_root
        for t in path:
            node = node["next"][str(t)]
        child = node["next"].get(str(after[-1]))
        if child is None:
            assert (
                root.get_attribute("data-stuck") == "1"
                and root.locator(".gptlib-samp-step").is_disabled()
            )
            assert "so the text ends here" in root.locator(".gptlib-samp-msg").text_content()
        else:
            assert root.get_attribute("data-stuck") == "0"
            assert json.loads(root.get_attribute("data-logits")) == child["logits"]
    return after[-1]


@pytest.fixture(scope="module")
def chapter_7(context, site):
    """Chapter 7's page, loaded once for its three tests: the bigram view's (which ends reset, its
    sliders untouched), the sliders' on that view after it, and the view on a model (a view of
    its own)."""
    p = Page(context, site, "07_sampling")
    try:
        yield p
    finally:
        p.close()


def _chapter_table(chapter: str = "07_sampling") -> dict:
    """The bigram table that a chapter's SamplingView.from_table stores (its nonzero counts)."""
    from gptlib.widgets.stored import WIDGET_STATE

    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    states = nb["metadata"]["widgets"][WIDGET_STATE]["state"].values()
    tables = [s["state"]["table"] for s in states if s["state"].get("table")]
    assert len(tables) == 1, f"{chapter} must show one SamplingView.from_table"
    return tables[0]


@browser_test
def test_bigram_view_draws_forty_tokens_without_a_stop(chapter_7):
    """Chapter 7's bigram view holds the whole table: 40 draws in a row, in a few seconds, none
    stopping; after each, the row the page computes is table_logits of the drawn token
    (log(count + 0.01)); each draw is the inverse CDF, at the page's seeded u, of the
    distribution shown; undo and reset."""
    from gptlib.widgets.sampling import table_logits

    table = _chapter_table()
    p = chapter_7
    root = p.page.locator(".gptlib-samp").first
    root.wait_for(timeout=20_000)
    assert root.get_attribute("data-from") == "table"
    first = json.loads(root.get_attribute("data-logits"))
    ms = root.evaluate(
        """(r) => { const t0 = performance.now();
                    for (let i = 0; i < 40; i++) r.querySelector('.gptlib-samp-step').click();
                    return performance.now() - t0; }"""
    )
    print(f"40 draws from the bigram view in {ms:.0f} ms")
    assert ms < 5000, f"40 draws took {ms:.0f} ms"
    path = json.loads(root.get_attribute("data-path"))
    assert len(path) == 40 and min(path) >= 0 and root.get_attribute("data-stuck") == "0"
    assert root.locator(".gptlib-samp-new").count() == 40
    assert "40 token(s) drawn" in root.locator(".gptlib-samp-msg").text_content()
    assert root.locator(".gptlib-samp-step").is_enabled()
    for n in range(40, 0, -1):  # undo, draw by draw: the row after each drawn token
        assert json.loads(root.get_attribute("data-path")) == path[:n]
        logits = torch.tensor(json.loads(root.get_attribute("data-logits")), dtype=torch.float64)
        torch.testing.assert_close(logits, table_logits(table, path[n - 1]), atol=1e-12, rtol=0)
        root.locator(".gptlib-samp-undo").click()
    assert json.loads(root.get_attribute("data-logits")) == first  # the row after ' is'
    checked = []
    for _ in range(5):  # seeded draws, each the inverse CDF of what is shown
        check_sampling_distribution(root, checked)
        drawn = check_sample_step(root)
        logits = torch.tensor(json.loads(root.get_attribute("data-logits")), dtype=torch.float64)
        torch.testing.assert_close(logits, table_logits(table, drawn), atol=1e-12, rtol=0)
    root.locator(".gptlib-samp-reset").click()
    assert json.loads(root.get_attribute("data-path")) == []
    assert json.loads(root.get_attribute("data-logits")) == first
    assert root.locator(".gptlib-samp-new").count() == 0
    p.screenshot("sampling_widget_bigram.png", ".gptlib-samp")
    p.check_offline()


@browser_test
def test_sampling_widget_matches_python(chapter_7):
    p = chapter_7
    root = p.page.locator(".gptlib-samp").first
    root.wait_for(timeout=20_000)
    checked = []
    before = _widths(root, "gptlib-samp-bar")
    check_sampling_distribution(root, checked)
    p.screenshot("sampling_widget_initial.png", ".gptlib-samp")
    t = root.locator(".gptlib-samp-temperature")
    t.focus()
    for _ in range(10):
        t.press("ArrowLeft")  # lower the temperature: a sharper distribution
    assert _widths(root, "gptlib-samp-bar") != before
    check_sampling_distribution(root, checked)
    p.screenshot("sampling_widget.png", ".gptlib-samp")  # temperature lowered by 0.5
    for slider, key in (
        (".gptlib-samp-topp", "Home"),
        (".gptlib-samp-topk", "ArrowRight"),
        (".gptlib-samp-temperature", "Home"),
        (".gptlib-samp-topp", "End"),
    ):
        root.locator(slider).focus()
        root.locator(slider).press(key)
        check_sampling_distribution(root, checked)
    assert len({json.dumps(c, sort_keys=True) for c in checked}) == 6, checked
    # a sample step from the stored distribution (temperature 0 now: the argmax)
    logits = json.loads(root.get_attribute("data-logits"))
    argmax = json.loads(root.get_attribute("data-ids"))[
        max(range(len(logits)), key=lambda i: (logits[i], -i))
    ]
    assert check_sample_step(root) == argmax
    p.check_maths()
    p.check_offline()


@browser_test
def test_sampling_widget_in_chapter_7_on_a_model(chapter_7):
    """Chapter 7's SamplingView.from_model (three prompts, the English GPT): prompt switch, the
    maths, sample steps through the stored continuations, and past them the live model: its
    logits are PyTorch's after the whole text, and the draws go on."""
    p = chapter_7
    p.page.locator(".gptlib-samp").first.wait_for(timeout=20_000)
    multi = [
        r
        for r in p.page.locator(".gptlib-samp").all()
        if r.locator(".gptlib-samp-prompt option").count() >= 2
    ]
    assert multi, (
        "chapter 7 must show SamplingView.from_model(model, tokenizer, prompts) (section 7.7)"
    )
    root, checked = multi[0], []
    select = root.locator(".gptlib-samp-prompt")
    first = root.get_attribute("data-logits")
    select.select_option("1")
    assert root.get_attribute("data-prompt") == "1" and root.get_attribute("data-logits") != first
    check_sampling_distribution(root, checked)
    _set_temperature(root, 0.0)
    check_sampling_distribution(root, checked)
    for _ in range(6):  # argmax draws follow the stored tree to its end, then the live model
        check_sample_step(root)
        if root.get_attribute("data-from") != "tree":
            break
    msg = root.locator(".gptlib-samp-msg").text_content()
    if not (HTML / "_static" / "live" / "english.json").is_file():  # no live model to hand to
        assert root.get_attribute("data-stuck") == "1" and "so the text ends here" in msg
        pytest.skip("the built book has no live model (_static/live/english.json)")
    assert root.get_attribute("data-from") == "live" and root.get_attribute("data-stuck") == "0"
    assert "every distribution is the live model's, computed by the page itself" in msg, msg
    from gptlib.model import GPT
    from gptlib.tokenizers import BPETokenizer

    model = GPT.load(SHIPPED).eval()
    tok = BPETokenizer.load(SHIPPED / "tokenizer.json")
    prompt = root.locator(".gptlib-samp-prompt option").nth(1).text_content()
    _set_temperature(root, 1.0)
    for step in range(6):  # each distribution is the model's after the whole text; no stop
        path = json.loads(root.get_attribute("data-path"))
        ids = (tok.encode(prompt) + path)[-model.config.n_ctx :]
        with torch.no_grad():
            y = model(torch.tensor([ids]))[0, -1].double()
        got = torch.tensor(json.loads(root.get_attribute("data-logits")), dtype=torch.float64)
        torch.testing.assert_close(got, y, atol=1e-4, rtol=0, msg=lambda m: f"step {step}: {m}")
        check_sampling_distribution(root, checked)
        check_sample_step(root)
        assert root.get_attribute("data-stuck") == "0"
    p.screenshot("sampling_widget_chapter_model.png", ".gptlib-samp >> nth=1")
    p.check_offline()


@pytest.fixture(scope="module")
def shipped_page(site, tmp_path_factory):
    """A page with both widgets on the shipped model, served beside the book: it loads only the
    book's own scripts (its _static), as a chapter page does. Yields (url, attention, sampling)."""
    from gptlib.model import GPT
    from gptlib.tokenizers import BPETokenizer
    from gptlib.widgets import AttentionView, SamplingView

    if not (SHIPPED / "model.safetensors").is_file():
        pytest.skip(f"no shipped model at {SHIPPED}")
    torch.manual_seed(0)
    model = GPT.load(SHIPPED).eval()
    tok = BPETokenizer.load(SHIPPED / "tokenizer.json")
    ids = tok.encode("Mr. Dursley said that the cat sat on the mat, and then the dog came in. ")
    ids = (ids + ids)[
        : model.config.n_ctx
    ]  # a repeated text: induction heads have something to find
    with torch.no_grad():
        patterns = model.attention_patterns(torch.tensor([ids]))[0]  # (n_layers, n_heads, T, T)
    attention = AttentionView(
        [tok.token_str(i) for i in ids], patterns, title="the shipped model, a text repeated"
    )
    sampling = SamplingView.from_model(
        model, tok, PROMPTS, top_p=0.9, title="the shipped model's next token"
    )
    root = tmp_path_factory.mktemp("shipped")
    widget_page(root, HTML / "_static", [attention, sampling])
    with serve(root) as url:
        yield f"{url}/index.html", attention, sampling


@pytest.fixture(scope="module")
def shipped_tab(context, site, shipped_page):
    """The shipped model's page, loaded once for its two tests: one uses only its attention
    view, the other only its sampling view, and neither view reads the other."""
    p = Page(context, site, "", url=shipped_page[0])
    try:
        yield p
    finally:
        p.close()


@browser_test
def test_attention_view_on_the_shipped_model(shipped_tab):
    p = shipped_tab
    root = p.page.locator(".gptlib-attn").first
    assert "induction" in check_attention_view(root)  # the text repeats
    p.screenshot("attention_widget_shipped.png", ".gptlib-attn")
    p.check_offline()


def _set_temperature(root, value: float):
    t = root.locator(".gptlib-samp-temperature")
    t.focus()
    t.press("Home")
    for _ in range(round(value / 0.05)):
        t.press("ArrowRight")
    assert json.loads(root.get_attribute("data-settings"))["temperature"] == pytest.approx(value)


@browser_test
def test_sampling_view_on_the_shipped_model(shipped_tab, shipped_page):
    _, _, sampling = shipped_page
    p = shipped_tab
    root = p.page.locator(".gptlib-samp").first
    root.wait_for(timeout=20_000)
    trees = [q["root"] for q in sampling.prompts]
    checked = []
    # the prompt selector: each prompt shows the model's distribution after it
    select = root.locator(".gptlib-samp-prompt")
    assert select.locator("option").evaluate_all("os => os.map((o) => o.textContent)") == PROMPTS
    for k in (1, 2, 0):
        select.select_option(str(k))
        assert root.get_attribute("data-prompt") == str(k)
        assert json.loads(root.get_attribute("data-logits")) == trees[k]["logits"]
        assert root.locator(".gptlib-samp-ctx").text_content() == PROMPTS[k]
        check_sampling_distribution(root, checked)
    # sliders: the maths stays next_token_probs; the ghost stays the temperature-1 distribution
    ghost = _widths(root, "gptlib-samp-ghost")
    _set_temperature(root, 1.5)
    assert _widths(root, "gptlib-samp-ghost") == ghost and _widths(root, "gptlib-samp-bar") != ghost
    check_sampling_distribution(root, checked)
    for slider, key in (
        (".gptlib-samp-topk", "ArrowRight"),
        (".gptlib-samp-topp", "ArrowLeft"),
        (".gptlib-samp-topp", "End"),
    ):
        root.locator(slider).focus()
        root.locator(slider).press(key)
        check_sampling_distribution(root, checked)
    p.screenshot("sampling_widget_shipped.png", ".gptlib-samp")
    # at temperature 0 every draw is the argmax, which the tree always stores: depth 3 steps
    # move through it, and the fourth token is drawn from a leaf, after which the page stops
    _set_temperature(root, 0.0)
    for step in range(4):
        check_sample_step(root, trees[0])
        assert root.get_attribute("data-stuck") == ("1" if step == 3 else "0")
    assert "so the text ends here" in root.locator(".gptlib-samp-msg").text_content()
    p.screenshot("sampling_widget_shipped_steps.png", ".gptlib-samp")
    root.locator(".gptlib-samp-undo").click()
    assert (
        len(json.loads(root.get_attribute("data-path"))) == 3
        and root.get_attribute("data-stuck") == "0"
    )
    assert root.locator(".gptlib-samp-step").is_enabled()
    root.locator(".gptlib-samp-reset").click()
    assert (
        json.loads(root.get_attribute("data-path")) == []
        and root.locator(".gptlib-samp-new").count() == 0
    )
    # at temperature 1 with top-p 0.9: seeded draws, each the inverse CDF of what is shown, until
    # a token outside the stored tree is drawn (then the page says so) or the tree ends
    _set_temperature(root, 1.0)
    root.locator(".gptlib-samp-topp").focus()
    root.locator(".gptlib-samp-topp").press("ArrowLeft")
    for _ in range(4):
        check_sample_step(root, trees[0])
        check_sampling_distribution(root, checked)
        if root.get_attribute("data-stuck") == "1":
            break
    # switching the prompt starts a new text
    select.select_option("2")
    assert (
        json.loads(root.get_attribute("data-path")) == []
        and root.get_attribute("data-stuck") == "0"
    )
    assert len(checked) >= 8
    p.check_offline()
