"""Shared test set-up: a header saying what the run can use (torch, CUDA, Chromium, a built book),
the browser tests' fixtures (the built book served locally, one headless Chromium), and a place
where a test leaves a table for the end of the test log."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser_support import CHROMIUM, CHROMIUM_ARGS, HTML, serve

_SUMMARIES = pytest.StashKey[list]()


def pytest_report_header(config):
    import torch

    return [
        f"gptlib book: torch {torch.__version__}, CUDA {'available' if torch.cuda.is_available() else 'not available'}",
        f"browser test: {CHROMIUM} {'present' if Path(CHROMIUM).exists() else 'missing'}, "
        f"built book {HTML} {'present' if (HTML / 'index.html').is_file() else 'missing (run `make book`)'}",
    ]


@pytest.fixture(scope="session")
def site():
    """The built book (``make book``), served on a local port; skips when it is missing."""
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    with serve(HTML) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, driven by Playwright; skips when it is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def summary(request):
    """``summary(title, text)`` prints ``text`` at the end of the run, passed or not, even under -q."""
    items = request.config.stash.setdefault(_SUMMARIES, [])
    return lambda title, text: items.append((title, text))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for title, text in config.stash.get(_SUMMARIES, []):
        terminalreporter.write_sep("-", title)
        terminalreporter.write_line(text)
