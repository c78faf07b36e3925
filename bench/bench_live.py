"""The live models' budgets (issue 33): the step graph natively, and what a reader's browser
downloads, waits and holds.

    python bench/bench_live.py [--models english smollm2] [--repeats 15]
                               [--static _build/html/_static] [--context 200] [--no-browser]
                               [--no-native] [--threads 1 2] [--long 1000]

Natively (`bench`): the HTML book's playground runs gptlib.export's step graph in onnxruntime-web
(WebAssembly, one thread); Jupyter and Colab run gptlib.step.step in PyTorch. This measures,
back to back in one run on one thread, the time of one new token with a cache of P = 16 and
P = 200 positions: bare (no lens, no targets, no attention rows: what a token of "generate N"
costs), with the lens on n = L + 1 streams, and with every view (the lens, the new row of every
head and the direct contributions to the most probable token: a greedy click): the graph in
onnxruntime (its native CPU build: the same graph and kernels the page's WebAssembly build
compiles) and step() in PyTorch, their medians and ratio; and the session's creation time
(SmolLM2's float32 weights unpacked from its 4-bit blocks beforehand, as the page unpacks them)
and the process's peak memory after it. The
graphs are those `make book` wrote into book_static/live, or exported now.

In Debian's Chromium (`in_browser`; headless, Playwright), in a page that holds the model's
PlaygroundView and loads only the built book's own files (``--static``) from a local server: the
bytes downloaded when the reader starts the model (and none before), the time from the start (for
SmolLM2, from the reader's "download") to the first token drawn, the time of one step with the
cache at ``--context`` tokens (median of ``--repeats``), a greedy click with the panels as the
page opens them and with every panel open (the page's own time from the click to its script's
end, the text and views drawn, and to the frame that shows them: the browser's style, layout and
paint after the script), a token of "generate N" (drawing included; and, where the page reports
it, the mean of its steps' own time, what a token would cost bare), and the tab's memory: the
JavaScript heap (performance.memory) and the resident memory of the page's renderer process (ps),
which includes onnxruntime's WebAssembly memory, at the start's peak (sampled every 0.2 s) and
once loaded, and the worker's parts of the start. Then a greedy run of ``--long`` tokens (1,000
by default; 0: none; the chat switch off, so that no stop token ends it), every panel open: its
time a token and the renderer's resident memory before the start, once loaded, at its peak
during the run and after it. Last, the page reloaded and the model started again (its files from
the browser's Cache API): the renderer's peak over the reload and the start, the time to the
first result and the model's bytes downloaded again. With
``--threads 1 2`` all of it once with each number of onnxruntime-web threads (more than one: the
page served cross-origin isolated, as threads need). tests/test_browser_live.py prints the same
budgets. Nothing is asserted (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from gptlib.export import export, export_smollm2
from gptlib.step import INPUTS, OUTPUTS, head_input, step, step_inputs

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "book_static" / "live"
BUDGETS = {"download_mb": 120, "first_s": 10, "step_ms": 100}
RUN_N = 40  # the tokens of the "generate N" measured in the browser
LONG_N = 1000  # the tokens of the long run whose memory is measured (--long)
TEXT = (
    "The river rose through the night, and by morning the old mill stood in water to its "
    "second window. Nobody had seen it so high since 1962, when the bridge went. "
)


def _graph(name: str, folder: Path) -> tuple[Path, int]:
    """The graph written whole into ``folder`` (with its external weights, unpacked from the
    blocks as the page unpacks them); returns its path and the bytes the page downloads."""
    from gptlib.export.q4 import unpack_external

    if not (LIVE / f"{name}.json").is_file():
        print(f"{name}: no graph in {LIVE}; exporting it now")
        (export(ROOT / "models" / "english", LIVE) if name == "english" else export_smollm2(LIVE))
    info = json.loads((LIVE / f"{name}.json").read_text("utf-8"))
    join = lambda listed: b"".join((LIVE / p["file"]).read_bytes() for p in listed)  # noqa: E731
    (folder / "graph.onnx").write_bytes(join(info["onnx"]["pieces"]))
    if info.get("weights"):
        blocks = join(info["weights"]["blocks"]["pieces"])
        (folder / info["weights"]["file"]).write_bytes(
            unpack_external(blocks, info["weights"]["tensors"])
        )
    return folder / "graph.onnx", info["download_bytes"] - info["tokenizer"]["bytes"]


def _model(name: str):
    if name == "english":
        from gptlib.model import GPT

        return GPT.load(ROOT / "models" / "english").eval()
    from gptlib.gguf import load_smollm2

    return load_smollm2()[0]


def bench(name: str, repeats: int) -> None:
    import onnxruntime as ort

    folder = tempfile.TemporaryDirectory()
    model, (path, size) = _model(name), _graph(name, Path(folder.name))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - t0
    folder.cleanup()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{name}: graph {size / 1e6:.1f} MB downloaded, session created in {created:.2f} s, "
        f"peak RSS {rss:.0f} MB (the PyTorch model included)"
    )
    L, V = model.config.n_layers, model.config.d_vocab
    g = torch.Generator().manual_seed(0)
    print(f"{'P':>5} {'asked':>6} {'ONNX (ms)':>10} {'step (ms)':>10} {'ONNX/step':>10}")
    for P in (16, 200):
        if P + 1 > model.config.n_ctx:
            continue
        prefix = torch.randint(0, V, (1, P), generator=g)
        past = step(model, prefix, *step_inputs(model))["kv"]
        asked = {
            "bare": ((), (), ()),
            "lens": (range(L + 1), (), ()),
            "all": (range(L + 1), [-1], [0]),
        }
        for what, (lens_l, targets_l, queries_l) in asked.items():
            _, mask, lens, targets, queries = step_inputs(model, lens_l, targets_l, 0, queries_l)
            args = (torch.randint(0, V, (1, 1), generator=g), past, mask, lens, targets, queries)
            args += (head_input(model, [(L - 1, 0, 0, 0)] if what == "all" else []),)
            feed = {k: t.numpy() for k, t in zip(INPUTS, args)}
            runs = {
                "onnx": lambda: session.run(list(OUTPUTS), feed),
                "step": lambda: step(model, *args),
            }
            times = {k: [] for k in runs}
            for f in runs.values():  # warm up
                f()
            for r in range(repeats):
                for k in list(runs) if r % 2 == 0 else list(runs)[::-1]:  # alternate who goes first
                    t0 = time.perf_counter()
                    runs[k]()
                    times[k].append(time.perf_counter() - t0)
            med = {k: 1000 * statistics.median(v) for k, v in times.items()}
            print(
                f"{P:>5} {what:>6} {med['onnx']:>10.2f} {med['step']:>10.2f} "
                f"{med['onnx'] / med['step']:>9.2f}x"
            )


def load(name: str):
    if name == "english":
        from gptlib.model import GPT
        from gptlib.tokenizers import BPETokenizer

        path = ROOT / "models" / "english"
        return GPT.load(path).eval(), BPETokenizer.load(path / "tokenizer.json")
    from gptlib.gguf import load_smollm2

    model, tok = load_smollm2()
    return model.eval(), tok


def context_ids(model, tok, n: int) -> list[int]:
    encode = getattr(tok, "special_tokens", None) and (lambda t: tok.encode(t, "all"))
    ids = (encode or tok.encode)(TEXT * 40)
    return ids[: min(n, model.config.n_ctx - 1)]


def page_html(view) -> str:
    from ipywidgets.embed import embed_data

    data = embed_data(views=[view], drop_defaults=False)
    state = json.dumps(data["manager_state"]).replace("</", "<\\/")
    spec = json.dumps(data["view_specs"][0])
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        '<script src="_static/vendor/require.js"></script>'
        '<script src="_static/require-config.js"></script>'
        '<script src="_static/vendor/html-manager/embed-amd.js" '
        'data-jupyter-widgets-cdn="./no-cdn/"></script>'
        f'<script type="application/vnd.jupyter.widget-state+json">{state}</script></head>'
        '<body><div class="cell_output">'
        f'<script type="application/vnd.jupyter.widget-view+json">{spec}</script></div>'
        "</body></html>"
    )


def renderer_rss_mb(profile: str) -> float | None:
    """The largest resident memory of this browser's renderer processes (ps), in MB."""
    out = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True).stdout
    rss = [
        int(line.split(None, 1)[0]) / 1024
        for line in out.splitlines()
        if "--type=renderer" in line and profile in line
    ]
    return max(rss) if rss else None


def _browser_support():
    """tests/browser_support.py (Chromium's path and flags, the page server), loaded from its file:
    the tests are not a package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "browser_support", ROOT / "tests" / "browser_support.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_browser(
    static: Path,
    name: str,
    model,
    tok,
    ids: list[int],
    steps: int,
    threads: int = 1,
    long_n: int = LONG_N,
) -> dict:
    """The model in Chromium with onnxruntime-web on ``threads`` threads (more than one: the page
    served cross-origin isolated, page.js's liveThreads asked through window.__gptlibThreads)."""
    from playwright.sync_api import sync_playwright

    from gptlib.widgets import PlaygroundView

    support = _browser_support()
    CHROMIUM, CHROMIUM_ARGS = support.CHROMIUM, support.CHROMIUM_ARGS

    view = PlaygroundView(
        model, tok, "Why is the sky blue?", chat=name != "english", source=f"live/{name}.json"
    )
    with tempfile.TemporaryDirectory() as d, sync_playwright() as pw:
        root = Path(d)
        (root / "_static").symlink_to(static.resolve(), target_is_directory=True)
        (root / "index.html").write_text(page_html(view), encoding="utf-8")
        profile = str(root / "profile")
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        ctx.add_init_script("window.__gptlibTest = true;")  # the views report what they draw
        ctx.add_init_script(f"window.__gptlibThreads = {int(threads)};")
        sizes: list[tuple[str, int]] = []
        with support.serve(root, isolated=threads > 1) as url:
            page = ctx.new_page()
            page.on(
                "response",
                lambda r: sizes.append((r.url, int(r.headers.get("content-length", 0)))),
            )
            page.goto(url + "/index.html", wait_until="networkidle")
            play = page.locator(".gptlib-play")
            play.wait_for(timeout=60_000)
            before = sum(n for _, n in sizes)
            n = len(sizes)
            rss_page = renderer_rss_mb(profile)
            with RendererPeak(profile) as start_peak:
                wall = start_model(page, play)
            error = play.get_attribute("data-error")
            if error:
                raise SystemExit(f"{name}: the page could not start the model: {error}")
            first = float(play.get_attribute("data-first-ms"))
            rss_loaded = renderer_rss_mb(profile)
            started = page.evaluate(
                "() => document.querySelector('.gptlib-play').__gptlib.backend.started || {}"
            )
            downloaded = sum(k for u, k in sizes[n:] if "/live/" in u)
            times = page.evaluate(
                "async ([ids, steps]) => {"
                " const b = document.querySelector('.gptlib-play').__gptlib.backend;"
                " await b.run(ids.slice(0, -1)); const out = [];"
                " for (let k = 0; k < steps; k++) {"
                "   await b.run(ids.slice(0, -1));"  # back to the context less one: a crop
                "   out.push((await b.run(ids)).ms); }"
                " return out; }",
                [ids, steps],
            )
            # a greedy click's work, back to back on the same cache: one step with everything (the
            # lens, the most probable token's contributions, the new rows) against the two steps
            # a click ran before issue 44 (a step for the argmax, then the last position again
            # with the lens and the target); and a token of a run: a bare step against one
            # that also keeps its attention rows (as a run's tokens do while the heads' panel
            # is open; the panel's patterns built once, at the run's end)
            pair = page.evaluate(
                "async ([ids, steps]) => {"
                " const b = document.querySelector('.gptlib-play').__gptlib.backend;"
                " const lens = [...Array(b.config.n_layers + 1).keys()];"
                " const all = { lens, targets: [-1], rows: true }, now = () => performance.now();"
                " const out = { one: [], two: [], bare: [], rows: [] };"
                " for (let k = 0; k < steps; k++) {"
                "   await b.run(ids.slice(0, -1), { rows: true }); let t = now();"
                "   await b.run(ids, all); out.one.push(now() - t);"
                "   await b.run(ids.slice(0, -1), { rows: true }); t = now();"
                "   await b.run(ids, { rows: true }); await b.run(ids, all);"
                "   out.two.push(now() - t);"
                "   await b.run(ids.slice(0, -1)); t = now();"
                "   await b.run(ids); out.bare.push(now() - t);"
                "   await b.run(ids.slice(0, -1), { rows: true }); t = now();"
                "   await b.run(ids, { rows: true, patterns: false }); out.rows.push(now() - t); }"
                " return out; }",
                [ids, steps],
            )

            # the reader's view: greedy clicks with the panels as the page opens them (SmolLM2's
            # lens closed: playground_draw.js's lensIsCheap), then with every panel open (the
            # heads' panel and the lens; one head's panel stays closed), then a run of N tokens
            # (the page's script, to the frame drawn that shows its result) for each click
            as_opened = greedy_clicks(page, play, steps)
            lens_was_open = page.evaluate(
                "() => { const d = document.querySelector('.gptlib-play-lens-panel');"
                " const was = d.open; d.open = true; return was; }"
            )
            page.wait_for_function(
                "() => { const r = document.querySelector('.gptlib-play');"
                " return r.__gptlib && r.__gptlib.lens && r.dataset.busy === '0'; }",
                timeout=120_000,
            )
            clicks = greedy_clicks(page, play, steps)
            greedy_run(page, play, RUN_N)
            run_ms = float(play.get_attribute("data-run-ms"))
            run_steps = int(play.get_attribute("data-run-steps"))
            run_step_ms = play.get_attribute("data-run-step-ms")  # None where not reported
            heap = page.evaluate(
                "() => performance.memory ? performance.memory.usedJSHeapSize : null"
            )
            rss = renderer_rss_mb(profile)
            long = long_run(page, play, profile, long_n) if long_n else None
            again = second_start(page, play, profile, sizes)
        ctx.close()
    return {
        "before_mb": before / 1e6,
        "download_mb": downloaded / 1e6,
        "first_s": first / 1000,
        "wall_first_s": wall,
        "step_ms": statistics.median(times),
        "click_ms": statistics.median(c[0] for c in clicks),
        "click_as_opened_ms": statistics.median(c[0] for c in as_opened),
        "click_shown_ms": statistics.median(c[1] for c in clicks),
        "click_as_opened_shown_ms": statistics.median(c[1] for c in as_opened),
        "lens_opened": bool(lens_was_open),
        "pair": {k: statistics.median(v) for k, v in pair.items()},
        "run_ms": run_ms,
        "run_steps": run_steps,
        "run_step_ms": float(run_step_ms) if run_step_ms else None,
        "rss_page_mb": rss_page,
        "rss_loaded_mb": rss_loaded,
        "rss_start_peak_mb": start_peak.mb,
        "again": again,
        "long": long,
        "heap_mb": heap / 1e6 if heap else None,
        "rss_mb": rss,
        "threads": started.get("threads"),
        "phases": started.get("phases", {}),
    }


class RendererPeak:
    """The largest resident memory of this browser's renderer (renderer_rss_mb, in MB) while the
    with-block runs, sampled every 0.2 s and once at its end: ``mb`` after the block."""

    def __init__(self, profile: str):
        import threading

        self.profile, self.mb = profile, renderer_rss_mb(profile) or 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._done.wait(0.2):
            self.mb = max(self.mb, renderer_rss_mb(self.profile) or 0.0)

    def __enter__(self) -> RendererPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.mb = max(self.mb, renderer_rss_mb(self.profile) or 0.0)


def start_model(page, play) -> float:
    """Start the page's model (its download agreed to) and wait for the first result: the time
    from the agreement (or the start, where none is asked) to it, seen here, in s."""
    play.locator(".gptlib-play-start").click()
    yes = play.locator(".gptlib-play-confirm-yes")
    t0 = time.perf_counter()
    try:
        yes.wait_for(timeout=10_000)
        t0 = time.perf_counter()
        yes.click()
    except Exception:  # a small model starts without asking
        pass
    page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.firstMs !== undefined || r.dataset.live === 'failed'; }",
        timeout=300_000,
    )
    return time.perf_counter() - t0


def greedy_clicks(page, play, n: int) -> list[tuple[float, float, float]]:
    """n clicks of the started playground's "greedy": for each, the page's times in ms (the
    click's script, to the frame that shows it, and the backend's step)."""
    out = []
    for _ in range(n):
        n_ids = len(json.loads(play.get_attribute("data-ids")))
        page.evaluate("() => { delete document.querySelector('.gptlib-play').dataset.shownMs; }")
        play.locator(".gptlib-play-greedy").click()
        page.wait_for_function(
            "(n) => { const r = document.querySelector('.gptlib-play');"
            " return JSON.parse(r.dataset.ids).length !== n"
            " && r.dataset.busy === '0' && r.dataset.shownMs !== undefined; }",
            arg=n_ids,
            timeout=120_000,
        )
        out.append(
            tuple(float(play.get_attribute(f"data-{k}")) for k in ("act-ms", "shown-ms", "ms"))
        )
    return out


def greedy_run(page, play, n: int) -> None:
    """A greedy run of n tokens (the playground's "generate"), waited for to its end; the page
    reports its times (data-run-*)."""
    page.evaluate("() => { delete document.querySelector('.gptlib-play').dataset.runSteps; }")
    play.locator(".gptlib-play-run-n").fill(str(n))
    play.locator(".gptlib-play-run-greedy").check()
    play.locator(".gptlib-play-run").click()
    page.wait_for_function(
        "() => { const r = document.querySelector('.gptlib-play');"
        " return r.dataset.runSteps !== undefined && r.dataset.busy === '0'; }",
        timeout=max(300_000, n * 2_000),
    )


def second_start(page, play, profile: str, sizes: list) -> dict:
    """The page reloaded and its model started again, its files from the browser's Cache API:
    the renderer's peak over the reload and the start (MB), the time to the first result (the
    page's, in s) and the model's bytes downloaded again (MB)."""
    n = len(sizes)
    with RendererPeak(profile) as peak:
        page.reload(wait_until="networkidle")
        play.wait_for(timeout=60_000)
        start_model(page, play)
    error = play.get_attribute("data-error")
    if error:
        raise SystemExit(f"the page could not start the model again: {error}")
    return {
        "peak_mb": peak.mb,
        "first_s": float(play.get_attribute("data-first-ms")) / 1000,
        "download_mb": sum(k for u, k in sizes[n:] if "/live/" in u) / 1e6,
    }


def long_run(page, play, profile: str, n: int) -> dict:
    """A greedy run of ``n`` tokens in the started page (the chat switch off: no stop token), every
    panel open: its time a token, the run's own mean step where reported, and the renderer's
    resident memory before it, at its peak (every 0.2 s) and after it, with the JavaScript heap."""
    chat = play.locator(".gptlib-play-chat")
    if chat.is_visible() and chat.is_checked():
        chat.uncheck()
        page.wait_for_function(
            "() => document.querySelector('.gptlib-play').dataset.busy === '0'", timeout=120_000
        )
    before = renderer_rss_mb(profile) or 0.0
    t0 = time.perf_counter()
    with RendererPeak(profile) as peak:
        greedy_run(page, play, n)
    wall = time.perf_counter() - t0
    after = renderer_rss_mb(profile) or 0.0
    step_ms = play.get_attribute("data-run-step-ms")
    heap = page.evaluate("() => performance.memory ? performance.memory.usedJSHeapSize : null")
    return {
        "n": int(play.get_attribute("data-run-steps")),
        "ms": float(play.get_attribute("data-run-ms")),
        "step_ms": float(step_ms) if step_ms else None,
        "wall_s": wall,
        "before_mb": before,
        "peak_mb": max(peak.mb, before),
        "after_mb": after,
        "heap_mb": heap / 1e6 if heap else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["english", "smollm2"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--static", type=Path, default=ROOT / "_build" / "html" / "_static")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--no-native", action="store_true", help="Chromium's measurements only")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1],
        help="onnxruntime-web's threads in Chromium, each measured in turn (e.g. 1 2); more than "
        "one needs the page cross-origin isolated, which this bench's server makes it",
    )
    ap.add_argument(
        "--long",
        type=int,
        default=LONG_N,
        help="the tokens of the greedy run whose time and memory are measured last (0: none)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        if not args.no_native:
            bench(name, args.repeats)
        if args.no_browser:
            continue
        if not (args.static / "live" / f"{name}.json").is_file():
            print(f"{name} in Chromium: no {args.static / 'live' / (name + '.json')} (make book)")
            continue
        model, tok = load(name)
        ids = context_ids(model, tok, args.context + 1)
        for threads in args.threads:
            report(
                name,
                in_browser(args.static, name, model, tok, ids, args.repeats, threads, args.long),
                ids,
                args,
            )


def report(name: str, b: dict, ids: list[int], args) -> None:
    """Print what in_browser measured."""
    heap = f"{b['heap_mb']:.0f} MB" if b["heap_mb"] else "not given"
    rss = f"{b['rss_mb']:.0f} MB" if b["rss_mb"] else "not found"
    print(
        f"{name} in Chromium: page {b['before_mb']:.2f} MB before starting; download on "
        f"start {b['download_mb']:.1f} MB (budget {BUDGETS['download_mb']} MB); start to "
        f"first token {b['first_s']:.1f} s in the page, {b['wall_first_s']:.1f} s seen here "
        f"(budget {BUDGETS['first_s']} s); one step at {len(ids)} tokens with the cache "
        f"{b['step_ms']:.0f} ms, bare (budget {BUDGETS['step_ms']} ms); a greedy click "
        f"with the panels as the page opens them {b['click_as_opened_ms']:.0f} ms, "
        f"{b['click_as_opened_shown_ms']:.0f} ms to the frame that shows it (the lens "
        f"{'open' if b['lens_opened'] else 'closed'}), with every panel open "
        f"{b['click_ms']:.0f} ms, {b['click_shown_ms']:.0f} ms to the frame (medians of "
        f"{args.repeats}); generate "
        f"{b['run_steps']} tokens: {b['run_ms']:.0f} ms a token, drawing included "
        f"({1000 / b['run_ms']:.1f} tokens/s); the tab's JavaScript heap {heap}, its "
        f"renderer's resident memory {rss}"
    )
    q = b["pair"]
    print(
        f"{name} in Chromium, back to back at {len(ids)} tokens (medians): a click's work in "
        f"one step {q['one']:.0f} ms, in the two steps of before {q['two']:.0f} ms "
        f"({q['two'] / q['one']:.2f}x); a run's token bare {q['bare']:.0f} ms, keeping its rows "
        f"{q['rows']:.0f} ms ({q['rows'] / q['bare']:.2f}x)"
    )
    own = (
        f"; its steps' own time {b['run_step_ms']:.0f} ms a token "
        f"({b['run_ms'] / b['run_step_ms']:.2f}x)"
        if b["run_step_ms"]
        else ""
    )
    mb = lambda x: f"{x:.0f} MB" if x else "not found"  # noqa: E731
    print(
        f"{name} in Chromium, generate {b['run_steps']}: {b['run_ms']:.0f} ms a token against a "
        f"bare step's {q['bare']:.0f} ms ({b['run_ms'] / q['bare']:.2f}x){own}; the renderer "
        f"{mb(b['rss_page_mb'])} before the start, {mb(b['rss_start_peak_mb'])} at the start's "
        f"peak, {mb(b['rss_loaded_mb'])} once loaded"
    )
    a = b["again"]
    print(
        f"{name} in Chromium, the page reloaded and the model started again: the renderer's "
        f"peak {mb(a['peak_mb'])} over the reload and the start; {a['first_s']:.1f} s to the "
        f"first result; {a['download_mb']:.1f} MB of the model's files downloaded again"
    )
    g = b["long"]
    if g:
        own = f" (its steps' own {g['step_ms']:.0f} ms)" if g["step_ms"] else ""
        heap = f"{g['heap_mb']:.0f} MB" if g["heap_mb"] else "not given"
        print(
            f"{name} in Chromium, a greedy run of {g['n']} tokens, every panel open: "
            f"{g['ms']:.0f} ms a token{own}, {1000 / g['ms']:.1f} tokens/s, {g['wall_s']:.0f} s "
            f"in all; the renderer {g['before_mb']:.0f} MB before it, {g['peak_mb']:.0f} MB at "
            f"its peak, {g['after_mb']:.0f} MB after it (above the page before the start: "
            f"{g['peak_mb'] - b['rss_page_mb']:+.0f} MB at the peak, "
            f"{g['after_mb'] - b['rss_page_mb']:+.0f} MB after); the JavaScript heap {heap}"
            if b["rss_page_mb"]
            else f"{name}: a run of {g['n']} tokens: {g['ms']:.0f} ms a token"
        )
    phases = ", ".join(f"{k} {v}" for k, v in b["phases"].items())
    print(
        f"{name} in Chromium: onnxruntime-web ran {b['threads']} thread(s); the worker's "
        f"start (ms): {phases}"
    )


if __name__ == "__main__":
    main()
