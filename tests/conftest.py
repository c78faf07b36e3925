"""Shared test set-up: a header saying what the run can use (torch, CUDA, Chromium, a built book)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_report_header(config):
    import torch

    html = Path(os.environ.get("GPTLIB_BOOK_HTML", ROOT / "_build" / "html"))
    chromium = "/usr/bin/chromium"
    return [
        f"gptlib book: torch {torch.__version__}, CUDA {'available' if torch.cuda.is_available() else 'not available'}",
        f"browser test: {chromium} {'present' if Path(chromium).exists() else 'missing'}, "
        f"built book {html} {'present' if (html / 'index.html').is_file() else 'missing (run `make book`)'}",
    ]
