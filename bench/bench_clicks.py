"""Greedy clicks of SmolLM2's live playground in Chromium, two or more widget bundles compared in
one run: each round loads each bundle in turn into a fresh browser (the page and the model's files
are the built book's), starts the model, clicks "greedy" at a short context, runs 150 tokens, and
clicks again past the heads panel's window. Printed for each bundle: medians of the click's script
(``actMs``), of the time to the frame that shows it (``shownMs``), of the backend's step
(``ms``), and of the two after the step.

    python bench/bench_clicks.py --rounds 2 OLD/playground.js gptlib/widgets/static/playground.js

A bundle is a file that ``scripts/build_widgets.py`` wrote (another checkout's
``gptlib/widgets/static/playground.js``, or this one's); needs ``make book`` (the model's files).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_live import (
    ROOT,
    _browser_support,
    greedy_clicks,
    greedy_run,
    load,
    page_html,
    start_model,
)

CLICKS = {"short": 10, "long": 12}  # the clicks at each context
SKIP = 2  # the first of each set, not counted (the page's first draws of a new length)
RUN_N = 150  # the tokens run between the two sets of clicks


def one_bundle(pw, support, static: Path, model, tok, bundle: Path) -> dict[str, list]:
    """The clicks of one fresh browser on a page whose playground runs ``bundle``."""
    from gptlib.widgets import PlaygroundView

    view = PlaygroundView(model, tok, "Why is the sky blue?", chat=True, source="live/smollm2.json")
    view._esm = bundle.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "_static").symlink_to(static.resolve(), target_is_directory=True)
        (root / "index.html").write_text(page_html(view), encoding="utf-8")
        ctx = pw.chromium.launch_persistent_context(
            str(root / "profile"),
            executable_path=support.CHROMIUM,
            args=support.CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        ctx.add_init_script("window.__gptlibTest = true;")  # the views report what they draw
        try:
            with support.serve(root) as url:
                page = ctx.new_page()
                page.goto(url + "/index.html", wait_until="networkidle")
                play = page.locator(".gptlib-play")
                play.wait_for(timeout=60_000)
                start_model(page, play)
                got = {"short": greedy_clicks(page, play, CLICKS["short"])[SKIP:]}
                greedy_run(page, play, RUN_N)
                got["long"] = greedy_clicks(page, play, CLICKS["long"])[SKIP:]
        finally:
            ctx.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--static", type=Path, default=ROOT / "_build" / "html" / "_static")
    args = ap.parse_args()
    if not (args.static / "live" / "smollm2.json").is_file():
        raise SystemExit(f"no {args.static / 'live' / 'smollm2.json'} (make book)")
    from playwright.sync_api import sync_playwright

    support = _browser_support()
    model, tok = load("smollm2")
    res = {(b, w): [] for b in args.bundles for w in CLICKS}
    with sync_playwright() as pw:
        for _ in range(args.rounds):
            for b in args.bundles:
                got = one_bundle(pw, support, args.static, model, tok, b)
                for w in CLICKS:
                    res[(b, w)] += got[w]
    for (b, w), out in res.items():
        act, shown, step = (statistics.median(x[i] for x in out) for i in range(3))
        act_after, shown_after = (statistics.median(x[i] - x[2] for x in out) for i in range(2))
        print(
            f"{b} ({w} context, {len(out)} clicks): script {act:.1f} ms, to the frame "
            f"{shown:.1f} ms, step {step:.1f} ms; after the step: script {act_after:.1f} ms, "
            f"frame {shown_after:.1f} ms"
        )


if __name__ == "__main__":
    main()
