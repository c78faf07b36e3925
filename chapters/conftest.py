"""Strict nbval on other kernels: ``--scalar-kernels 05,06`` starts the kernels of
Chapters 5 and 6 with ``ATEN_CPU_CAPABILITY=default``: PyTorch's scalar kernels.

A chapter's committed outputs are written with the vector kernels of the machine that
executed it (AVX2 or AVX-512). Kernels of another vector width add in another order,
and floating-point addition is not associative, so a printed digit that depends on that
order differs between machines. Checking the committed outputs under the scalar kernels
finds such a digit on any machine, in the same run as the other chapters.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--scalar-kernels",
        default="",
        metavar="NN,NN",
        help="numbers of the chapters nbval runs with ATEN_CPU_CAPABILITY=default",
    )


def scalar_chapters(option: str) -> set[str]:
    """The two-digit chapter numbers named in ``option``.

    >>> sorted(scalar_chapters("13, 5,09"))
    ['05', '09', '13']
    >>> scalar_chapters("")
    set()
    >>> scalar_chapters("5a")
    Traceback (most recent call last):
    ValueError: --scalar-kernels: '5a' is not a chapter number
    """
    out = set()
    for part in filter(None, (p.strip() for p in option.split(","))):
        if not part.isdigit():
            raise ValueError(f"--scalar-kernels: {part!r} is not a chapter number")
        out.add(f"{int(part):02d}")
    return out


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel while it sets up the first cell, with this
    process's environment: ``ATEN_CPU_CAPABILITY`` is set for that moment only."""
    chapters = scalar_chapters(item.config.getoption("--scalar-kernels"))
    if Path(str(item.fspath)).name[:2] not in chapters:
        yield
        return
    before = os.environ.get("ATEN_CPU_CAPABILITY")
    os.environ["ATEN_CPU_CAPABILITY"] = "default"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ATEN_CPU_CAPABILITY"]
        else:
            os.environ["ATEN_CPU_CAPABILITY"] = before
