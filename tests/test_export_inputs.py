"""scripts/export_inputs.py, what decides whether `make book` exports a live model again: the
export's import closure (every gptlib module that importing the export loads, found from the source
alone, and followed when modules move into packages), and a stamp rewritten only on a change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from browser_support import ROOT, load_module

inputs = load_module(ROOT / "scripts" / "export_inputs.py")


@pytest.mark.slow
def test_the_closure_holds_every_gptlib_module_the_export_loads():
    code = (
        "import sys, gptlib.export\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if m.__name__.startswith('gptlib') and f: print(f)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    loaded = {os.path.realpath(p) for p in out.stdout.split()}
    closure = {os.path.realpath(p) for p in inputs.import_closure()}
    assert loaded and loaded <= closure, sorted(loaded - closure)


def test_the_closure_follows_relative_and_function_level_imports(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/export/__init__.py": "from ..a import f\n",
        "pkg/export/__main__.py": "from . import cli\n",
        "pkg/export/cli.py": "import pkg.c.d\n",
        "pkg/a.py": "def f():\n    from .b import g\n    return g\n",
        "pkg/b.py": "import os\ng = 1\n",
        "pkg/c/__init__.py": "",
        "pkg/c/d.py": "from pkg.c import e\n",
        "pkg/c/e.py": "",
        "pkg/unused.py": "import pkg.a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    closure = inputs.import_closure("pkg.export", tmp_path)
    got = {p.relative_to(tmp_path).as_posix() for p in closure}
    assert got == set(files) - {"pkg/unused.py"}


def test_the_stamp_is_rewritten_only_when_the_inputs_change(tmp_path):
    stamp = tmp_path / "deep" / "english.sha256"
    assert inputs.update_stamp(stamp, "a\n") and stamp.read_text() == "a\n"
    os.utime(stamp, ns=(1, 1))
    assert not inputs.update_stamp(stamp, "a\n") and stamp.stat().st_mtime_ns == 1
    assert inputs.update_stamp(stamp, "b\n") and stamp.stat().st_mtime_ns > 1


def test_an_unknown_model_is_a_value_error():
    with pytest.raises(ValueError, match="model must be 'english' or 'smollm2'"):
        inputs.model_files("gpt2")


def test_the_english_inputs_name_the_model_the_code_and_the_libraries():
    text = inputs.inputs_text("english")
    names = [line.split("  ", 1)[1] for line in text.splitlines()]
    assert {"model.safetensors", "tokenizer.json", "gptlib/model.py", "torch"} <= set(names)
    assert any(n.startswith("gptlib/export") for n in names)
