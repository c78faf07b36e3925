"""Running the widgets' JavaScript under node for the tests that check its arithmetic against
PyTorch's (the same source modules esbuild bundles, imported as ES modules)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parents[1] / "gptlib" / "widgets" / "js"


def import_as(name: str, module: str | Path) -> str:
    """The line that imports a module's named exports as ``name``: ``module`` is a file of
    gptlib/widgets/js/ or a path.

    >>> import_as("m", "rows.js").startswith('import * as m from "file://')
    True
    """
    path = module if isinstance(module, Path) else JS / module
    return f"import * as {name} from {json.dumps(path.as_uri())};\n"


def run_node(script: str, timeout: int = 60) -> object:
    """Run ``script`` as an ES module with node and return the JSON it prints (None when it
    prints nothing); the test skips, saying why, where node is not installed, and fails with
    node's stderr where the script throws."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if out.stdout.strip() else None
