"""SmolLM2-135M-Instruct in a real browser: its playground in chat mode, started once in one
page served beside the built book's _static/ (the English page and the helpers are in
test_browser_live.py; a file of its own so that `make browser`'s two workers share the two pages).
The page must give PyTorch's numbers on the dequantized weights: GGUFTokenizer's ids on text not in
the book, the greedy continuation, the next-token probabilities within a measured bound, 40 draws
without a stop, head ablation equal to gptlib.circuits.ablate_heads, and the heads' direct
contributions; in its Web Worker, a step that fails in onnxruntime (an id outside the vocabulary,
after the cache would have been cut) leaves the cache as it was, and a reload starts from the
browser's Cache API (the 4-bit blocks and the graph are not downloaded again). The worker's test
comes last: its reload ends the started page the others share. No request may leave the local
server. Its budgets (issue 33) and the renderer's resident memory (Chromium's renderer processes,
/proc) go to the test log, never asserted.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from browser_support import evaluate_json, renderer_rss, widget_page
from page_twins import xorshift32
from test_browser_live import (
    ARTIFACTS,
    STATIC,
    Page,
    Served,
    _check_head,
    _head_shown,
    _settings,
    reference,
)

from gptlib.sampling import next_token_probs

pytestmark = pytest.mark.browser


# --- SmolLM2-135M-Instruct in the page ----------------------------------------------------------
# Text that is not in the book: unicode, digits, whitespace runs, and the chat template's tokens.
SMOL_TEXTS = [
    "Zoë's café: 7:45\u20149:30, 12 345 678 \U0001f600  two  spaces\n\n\tand a tab",
    "Ein Fluß, ein Haus, 东京 und 1999 Äpfel!   ",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
    "    def f(x):\n        return x ** 2  # 0.5e-3\r\n",
]
SMOL_QUESTION = "Name three colours of the rainbow."
SMOL_GREEDY = 16  # greedy tokens compared with PyTorch
# The long waits (a start, a run of tokens) look every POLL_MS rather than at every animation
# frame (Playwright's default), which would keep the renderer drawing while the worker computes.
POLL_MS = 200


@pytest.fixture(scope="module")
def smol_page(browser, smollm2, tmp_path_factory):
    """One page load of the SmolLM2 playground (chat mode), started: (page, served, facts)."""
    from gptlib.widgets import PlaygroundView

    if not (STATIC / "live" / "smollm2.json").is_file():
        pytest.skip(f"no SmolLM2 live model in {STATIC} (run `make book`)")
    model, tok = smollm2
    view = PlaygroundView(
        model, tok, SMOL_QUESTION, chat=True, source="live/smollm2.json", title="SmolLM2, live"
    )
    root = tmp_path_factory.mktemp("smol")
    widget_page(root, STATIC, [view])
    served = Served(root)
    page = Page(browser, served.url + "/index.html", width=1280)
    facts = {"before": served.bytes_since(0)}
    n = len(served.log)
    assert not [p for p, _ in served.log if "/live/" in p]  # nothing until the reader starts it
    facts["rss_before"] = renderer_rss()
    page.play.locator(".gptlib-play-start").click()
    confirm = page.play.locator(".gptlib-play-confirm-yes")
    confirm.wait_for(timeout=30_000)
    facts["announced"] = int(page.play.get_attribute("data-confirm"))
    assert not [p for p, _ in served.log[n:] if ".onnx" in p]  # asked before downloading
    t0 = time.perf_counter()
    confirm.click()
    page.page.wait_for_function(
        "() => document.querySelector('.gptlib-play').dataset.firstMs !== undefined ||"
        " document.querySelector('.gptlib-play').dataset.live === 'failed'",
        timeout=120_000,
        polling=POLL_MS,
    )
    facts["wall_first_s"] = time.perf_counter() - t0
    page.wait_idle(timeout=120_000)
    assert page.play.get_attribute("data-live") == "browser"
    facts["first_ms"] = float(page.play.get_attribute("data-first-ms"))
    facts["downloaded"] = served.bytes_since(n, "/_static/live/")
    facts["memory"] = page.play.get_attribute("data-memory")
    facts["rss_loaded"] = renderer_rss()
    try:
        yield page, served, facts
    finally:
        page.close()
        served.close()


def _page_run(page, ids, mask=None, lens=None, targets=None) -> dict:
    """backend.run in the page (the playground's own backend and cache)."""
    return evaluate_json(
        page.page,
        "async ([ids, mask, lens, targets]) => {"
        " const b = document.querySelector('.gptlib-play').__gptlib.backend;"
        " const r = await b.run(ids, {mask, lens, targets});"
        " return {logits: Array.from(r.logits), direct: r.direct && Array.from(r.direct),"
        " lens: r.lens, ms: r.ms}; }",
        [ids, mask, lens, targets],
    )


def test_smollm2_starts_on_demand_within_its_budgets(smol_page, smollm2, summary):
    page, _, facts = smol_page
    manifest = json.loads((STATIC / "live" / "smollm2.json").read_text(encoding="utf-8"))
    assert facts["announced"] == manifest["download_bytes"]
    assert all(p["bytes"] <= 95_000_000 for p in manifest["onnx"]["pieces"])
    summary(
        "SmolLM2 in the page",
        f"\n[smollm2 budget] download on start: {facts['downloaded'] / 1e6:.1f} MB (the page "
        "announced the model and tokenizer's "
        f"{facts['announced'] / 1e6:.1f} MB; budget 120 MB; the page before it: "
        f"{facts['before'] / 1e6:.2f} MB); start (after the reader agrees) to the first token: "
        f"{facts['first_ms']:.0f} ms in the page, {facts['wall_first_s']:.1f} s seen by the test "
        f"(budget 10 s); the tab's JavaScript heap once loaded: "
        + (
            f"{int(facts['memory']) / 1e6:.0f} MB (performance.memory; onnxruntime's WebAssembly "
            "memory is outside it)"
            if facts["memory"] not in (None, "unknown")
            else "not given by the browser"
        ),
    )
    status = page.play.locator(".gptlib-play-status").text_content()
    assert "live" in status
    page.check_offline()


def test_smollm2_page_tokenizer_gives_gguf_ids(smol_page, smollm2):
    page, _, _ = smol_page
    _, tok = smollm2
    got = evaluate_json(
        page.page,
        "async (texts) => { const g = document.querySelector('.gptlib-play').__gptlib;"
        " const out = []; for (const t of texts) out.push(await g.encode(t)); return out; }",
        SMOL_TEXTS,
    )
    for text, ids in zip(SMOL_TEXTS, got):
        assert ids == tok.encode(text, allowed_special="all"), text
    # the chat switch: the page's prompt is the template around the question
    frame = page.js("root.__gptlib.backend.chat")
    wrapped = frame["prefix"] + SMOL_QUESTION + frame["suffix"]
    assert wrapped == tok.apply_chat_template([{"role": "user", "content": SMOL_QUESTION}])
    assert json.loads(page.play.get_attribute("data-ids")) == tok.encode(
        wrapped, allowed_special="all"
    )


def test_smollm2_greedy_answer_and_probabilities_equal_pytorch(smol_page, smollm2, summary):
    """The page's greedy run equals PyTorch's greedy decoding on the dequantized weights, and at
    every step its next-token probabilities are PyTorch's within the bound printed."""
    page, _, _ = smol_page
    model, tok = smollm2
    page.play.locator(".gptlib-play-run-n").fill(str(SMOL_GREEDY))
    page.play.locator(".gptlib-play-run-greedy").check()
    page.play.locator(".gptlib-play-run").click()
    page.page.wait_for_function(
        "() => document.querySelector('.gptlib-play').dataset.runSteps !== undefined",
        timeout=120_000,
        polling=POLL_MS,
    )
    page.wait_idle()
    ids = json.loads(page.play.get_attribute("data-ids"))
    path = json.loads(page.play.get_attribute("data-path"))
    prompt = ids[: len(ids) - len(path)]
    stop = tok.special_tokens["<|im_end|>"]
    # PyTorch's logits after every prefix of the page's text, in one forward pass (a cached step
    # per token would read the weights once per token): greedy decoding gives the page's path
    # exactly when each of its tokens is the argmax after the tokens before it
    with torch.no_grad():
        ys = model(torch.tensor([ids]))[0, len(prompt) - 1 :].double()  # (len(path) + 1, V)
    want = ys[: len(path)].argmax(-1).tolist()
    assert path == want, (tok.decode(path), tok.decode(want))
    # greedy decoding stops at the end-of-turn token, and only there, or after SMOL_GREEDY
    assert stop not in path[:-1] and (len(path) == SMOL_GREEDY or path[-1] == stop)
    worst_p, worst_y = 0.0, 0.0
    # probabilities at the last position, and along the way through the page's own backend
    for k in (0, len(path) // 2, len(path)):
        got = torch.tensor(_page_run(page, prompt + path[:k])["logits"], dtype=torch.float64)
        y = ys[k]
        worst_y = max(worst_y, float((got - y).abs().max()))
        worst_p = max(worst_p, float((got.softmax(-1) - y.softmax(-1)).abs().max()))
    summary(
        "SmolLM2 in the page",
        f"\n[smollm2] greedy answer ({len(path)} tokens) equals PyTorch's: {tok.decode(path)!r}; "
        f"max |page - PyTorch|: logits {worst_y:.1e}, probabilities {worst_p:.1e}",
    )
    # the page and PyTorch sum in different orders over 30 layers (measured here: logits within
    # 6.9e-5, probabilities within 3.0e-6); the bounds leave an order of magnitude
    assert worst_y <= 1e-3 and worst_p <= 1e-4, (worst_y, worst_p)


def test_smollm2_forty_draws_and_ms_per_token_at_200(smol_page, smollm2, summary):
    """A run of 40 seeded draws: each drawn token is the inverse CDF, at the page's u, of
    PyTorch's next_token_probs for the same prefix under the page's settings (most probable
    first); the page's and PyTorch's logits differ by up to about 1e-4, so a draw may differ only
    where u lies within 1e-4 of a boundary of PyTorch's cumulative mass."""
    page, _, _ = smol_page
    model, tok = smollm2
    page.play.locator(".gptlib-play-chat").uncheck()  # no stop token: 40 draws
    page.wait_idle()
    page.play.locator(".gptlib-play-run-n").fill("40")
    page.play.locator(".gptlib-play-run-greedy").uncheck()
    page.page.evaluate("() => { delete document.querySelector('.gptlib-play').dataset.runSteps; }")
    page.play.locator(".gptlib-play-run").click()
    page.page.wait_for_function(
        "() => document.querySelector('.gptlib-play').dataset.runSteps !== undefined",
        timeout=300_000,
        polling=POLL_MS,
    )
    page.wait_idle()
    assert int(page.play.get_attribute("data-run-steps")) == 40
    assert page.play.get_attribute("data-error") is None
    forty = float(page.play.get_attribute("data-run-ms"))
    ids, path = (json.loads(page.play.get_attribute(a)) for a in ("data-ids", "data-path"))
    draws = int(page.play.get_attribute("data-draws"))  # since the seed (0) was set
    us = [u for _, u in zip(range(draws), xorshift32(0))][-40:]
    s = _settings(page)
    assert len(path) == 40 and draws >= 40
    with torch.no_grad():  # PyTorch's logits after each prefix, in one forward pass
        ys = model(torch.tensor([ids]))[0, len(ids) - 41 : -1].double()  # (40, V)
    near = 0
    for k, (u, drawn, y) in enumerate(zip(us, path, ys)):
        p = next_token_probs(
            y,
            temperature=s["temperature"],
            top_k=s["top_k"] or None,
            top_p=s["top_p"] if s["top_p"] < 1 else None,
        )
        order = torch.sort(y, descending=True, stable=True).indices
        cum = torch.cumsum(p[order], 0)
        want = int(order[min(int((cum <= u).sum()), len(order) - 1)])
        if drawn != want:  # only where u is on a boundary, within the logits' difference
            assert float((cum - u).abs().min()) < 1e-4, (k, u, drawn, want)
            near += 1
        assert p[drawn] > 0, (k, drawn)
    assert near <= 2, near
    # 200 tokens of context, then one token at a time through the cache
    text = " ".join(SMOL_TEXTS[:2] + SMOL_TEXTS[3:]) * 3
    ids = tok.encode(text, allowed_special="all")[:200]
    _page_run(page, ids)
    times = []
    for k in range(5):
        ids = ids + [
            int(torch.randint(100, 40000, (1,), generator=torch.Generator().manual_seed(k)))
        ]
        times.append(_page_run(page, ids)["ms"])
    summary(
        "SmolLM2 in the page",
        f"\n[smollm2 budget] 40 seeded draws without a stop: {forty:.0f} ms a token (drawing "
        f"included); one step at {len(ids)} tokens of context with the cache: "
        f"{sorted(times)[2]:.0f} ms (median of 5; budget 100 ms)",
    )
    page.check_offline()


def test_smollm2_ablation_and_direct_contributions_equal_pytorch(smol_page, smollm2, summary):
    from gptlib.circuits import ablate_heads

    page, _, _ = smol_page
    model, tok = smollm2
    L, H = model.config.n_layers, model.config.n_heads
    ids = tok.encode("The capital of France is the city of", allowed_special="all")
    heads = [(0, 3), (5, 1), (17, 8)]
    mask = torch.ones(L, H)
    for l, h in heads:
        mask[l, h] = 0
    got = _page_run(page, ids, mask.flatten().tolist(), [0, L], [12])
    with torch.no_grad(), ablate_heads(model, heads):
        y = model(torch.tensor([ids]))[0, -1]
    dy = float((torch.tensor(got["logits"]) - y).abs().max())
    want = reference(model, ids, lens=[0, L], targets=[12], mask=mask)
    dd = float((torch.tensor(got["direct"]) - want["direct"].flatten()).abs().max())
    summary(
        "SmolLM2 in the page",
        f"\n[smollm2] ablating {heads}: max |page - ablate_heads| logits {dy:.1e}; "
        f"direct contributions {dd:.1e}",
    )
    assert dy <= 1e-3 and dd <= 1e-3, (dy, dd)  # measured: 3.9e-5 and 1.8e-6
    # a click on a head of the overview in ablation mode ablates that head in the view
    page.play.locator(".gptlib-play-ablate-mode").check()
    page.play.locator('.gptlib-attn-thumb[data-layer="2"][data-head="4"]').click()
    page.wait_idle()
    assert json.loads(page.play.get_attribute("data-ablated")) == [[2, 4]]
    assert page.play.locator(".gptlib-attn-thumb.ablated").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "smollm2_live.png"), full_page=True)
    page.play.locator(".gptlib-play-restore").click()
    page.wait_idle()
    assert json.loads(page.play.get_attribute("data-ablated")) == []
    page.check_offline()


def test_smollm2_one_head_step_by_step(smol_page, smollm2, summary):
    """The head panel on SmolLM2, chat off, on eight words typed twice (Chapter 12's text): the
    induction head 18.6 at the last token, then RoPE's pair 5, then the query moved by a click;
    every stage, RoPE's included, equals head_trace's, the softmax row is the heads panel's row
    and the contribution the step's direct attribution."""
    page, _, _ = smol_page
    model, tok = smollm2
    H = model.config.n_heads
    words = "orbit tulip seven lantern copper violin marsh pepper"
    page.play.locator(".gptlib-play-chat").uncheck()
    page.type(f"{words} {words}")
    window = tok.encode(f"{words} {words}")
    T = len(window)
    page.page.wait_for_function(
        "(ids) => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.ids === JSON.stringify(ids) && r.dataset.busy === '0'; }",
        arg=window,
        timeout=60_000,
    )
    # the panel's answers so far, read before it opens: its first answer may come before a read
    # made after it (a loaded machine's round trips)
    before = page.play.get_attribute("data-head-n")
    page.js("(root.querySelector('.gptlib-play-head-panel').open = true)")
    shown = _head_shown(page, before)
    page.play.locator(".gptlib-head-pick-layer").select_option("18")
    shown = _head_shown(page, shown["key"])
    page.play.locator(".gptlib-head-pick-head").select_option("6")
    shown = _head_shown(page, shown["key"])
    a = shown["asked"]
    assert (a["layer"], a["head"], a["position"]) == (18, 6, T - 1)
    row = page.js(f"Array.from(root.__gptlib.patterns[18][6][{T - 1}])")
    assert (
        float((torch.tensor(shown["trace"]["pattern"]) - torch.tensor(row[:T])).abs().max()) <= 1e-5
    )
    direct = page.js(f"root.__gptlib.direct[{18 * H + 6}]")
    assert shown["trace"]["contribution"] == pytest.approx(direct, abs=1e-4, rel=1e-3)
    worst = _check_head(model, window, shown, tol=1e-3)
    assert int(torch.tensor(shown["trace"]["pattern"]).argmax()) == T // 2  # ' orbit', copied
    page.play.locator(".gptlib-head-pick-pair").fill("5")
    page.play.locator(".gptlib-head-pick-pair").dispatch_event("change")
    shown = _head_shown(page, shown["key"])
    assert shown["asked"]["pair"] == 5
    _check_head(model, window, shown, tol=1e-3)
    page.play.locator(".gptlib-play-tok").nth(T - 3).click()
    shown = _head_shown(page, shown["key"])
    assert shown["asked"]["position"] == T - 3 and shown["asked"]["target"] == window[T - 2]
    _check_head(model, window, shown, tol=1e-3)
    summary(
        "SmolLM2 in the page",
        "\n[smollm2] one head step by step (18.6), max |page - head_trace| / max(1, |stage|): "
        + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()),
    )
    page.check_offline()


# --- the page's Web Worker (last: its reload ends the shared page) -----------------------------


def _start(page, served) -> tuple[int, float]:
    """Start the model (the reader agrees); returns (live bytes downloaded, seconds)."""
    n, t0 = len(served.log), time.perf_counter()
    page.play.locator(".gptlib-play-start").click()
    page.play.locator(".gptlib-play-confirm-yes").click()
    page.page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.firstMs !== undefined || r.dataset.live === 'failed'; }",
        timeout=180_000,
        polling=POLL_MS,
    )
    page.wait_idle(timeout=180_000)
    assert page.play.get_attribute("data-live") == "browser"
    return served.bytes_since(n, "/_static/live/"), time.perf_counter() - t0


RUN = (
    "async ([ids]) => { const b = document.querySelector('.gptlib-play').__gptlib.backend;"
    " try { const r = await b.run(ids); return {logits: Array.from(r.logits)}; }"
    " catch (e) { return {error: e.message}; } }"
)


def test_a_failed_step_leaves_the_cache_and_a_reload_reads_the_cache(smol_page, smollm2, summary):
    page, served, facts = smol_page
    model, tok = smollm2
    ids = json.loads(page.play.get_attribute("data-ids"))
    assert evaluate_json(page.page, RUN, [ids]).get("logits")
    # a step whose last id is outside the vocabulary, on a window that cuts the cache by two
    bad = evaluate_json(page.page, RUN, [ids[:-2] + [10**9]])
    assert "error" in bad, bad
    # the next steps: greedy from the whole text through the page's cache, as PyTorch gives them
    # (PyTorch's greedy tokens are the page's when each is the argmax after those before it)
    ctx, got = list(ids), []
    for _ in range(6):
        got.append(int(torch.tensor(evaluate_json(page.page, RUN, [ctx])["logits"]).argmax()))
        ctx.append(got[-1])
    with torch.no_grad():
        want = model(torch.tensor([ctx[:-1]]))[0, len(ids) - 1 :].argmax(-1).tolist()
    assert got == want, (tok.decode(got), tok.decode(want))
    # a reload: the old page's session and worker go, the files come from the Cache API
    page.page.reload()
    page.page.locator(".gptlib-play").first.wait_for(timeout=30_000)
    again, seconds2 = _start(page, served)
    listed = json.loads((STATIC / "live" / "smollm2.json").read_text(encoding="utf-8"))
    assert facts["downloaded"] >= listed["download_bytes"]
    assert again <= 5_000_000, again  # the manifest and the tokenizer, not the model
    summary(
        "SmolLM2 in the page's worker",
        f"\n[smollm2 worker] after a failed step, 6 greedy tokens equal PyTorch's; renderer RSS "
        f"{facts['rss_before'] / 1e9:.2f} GB before the start, {facts['rss_loaded'] / 1e9:.2f} GB "
        f"once loaded, {renderer_rss() / 1e9:.2f} GB after a reload and a second start; start "
        f"{facts['wall_first_s']:.1f} s to the first token ({facts['downloaded'] / 1e6:.1f} MB "
        f"downloaded), again {seconds2:.1f} s ({again / 1e6:.1f} MB)",
    )
    page.check_offline()
