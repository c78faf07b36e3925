"""chapters/conftest.py: `make nbval` starts the kernels of the chapters named by
``--scalar-kernels`` with PyTorch's scalar kernels, and only those."""

from __future__ import annotations

import doctest
import importlib.util
import os
from types import SimpleNamespace

import pytest
from browser_support import ROOT


@pytest.fixture(scope="module")
def plugin():
    # imported under its own name: pytest already holds tests/conftest.py as "conftest"
    path = ROOT / "chapters" / "conftest.py"
    spec = importlib.util.spec_from_file_location("chapters_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_doctests_pass(plugin):
    assert doctest.testmod(plugin).failed == 0


def _setup_env(plugin, notebook: str, option: str) -> str | None:
    """ATEN_CPU_CAPABILITY as a kernel started during the setup of a cell of ``notebook``
    would see it, with ``--scalar-kernels option``."""
    item = SimpleNamespace(
        fspath=ROOT / "chapters" / notebook,
        config=SimpleNamespace(getoption=lambda name: option),
    )
    hook = plugin.pytest_runtest_setup(item)
    next(hook)  # pytest sets up the item (nbval starts the kernel) here
    seen = os.environ.get("ATEN_CPU_CAPABILITY")
    with pytest.raises(StopIteration):
        hook.send(None)
    return seen


def test_only_the_named_chapters_get_the_scalar_kernels(plugin, monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert _setup_env(plugin, "09_rlhf.ipynb", "13,9") == "default"
    assert "ATEN_CPU_CAPABILITY" not in os.environ  # restored after the setup
    assert _setup_env(plugin, "08_training.ipynb", "13,9") is None
    assert _setup_env(plugin, "09_rlhf.ipynb", "") is None
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert _setup_env(plugin, "13_inference.ipynb", "13") == "default"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"


def test_a_bad_chapter_number_is_refused(plugin):
    with pytest.raises(ValueError, match="--scalar-kernels"):
        plugin.scalar_chapters("13,x")
