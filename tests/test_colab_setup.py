"""The Colab set-up cell: in step with _config.yml, a no-op locally, and working in a simulated
Colab.

The simulated Colab is a clean virtual environment holding what Colab ships (pip, torch, numpy,
tqdm, ipywidgets, and what they require), a fake ``google.colab`` module, and the book's own
repository cloned from this checkout instead of GitHub. What Colab ships is this environment's own
copy of those distributions, linked into a folder that the clean environment has on its path (as
Colab's are preinstalled outside the user's site-packages), so that torch is not unpacked again;
the packages the set-up cell installs come from the wheelhouse that ``make`` fills at install time,
so the test needs no network.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    """A module of scripts/ imported from its file (scripts/ is not a package and not on
    sys.path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


colab = _load_script("colab")

WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
COLAB_PREINSTALLED = ["torch==2.13.0", "numpy", "tqdm", "ipywidgets"]
CELL_INSTALLS = {"tiktoken", "anywidget", "safetensors"}  # what the set-up cell installs


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def _preinstalled(folder: Path) -> set[str]:
    """Link pip and :data:`COLAB_PREINSTALLED`, with every distribution they require (extras left
    out), from this environment into ``folder``: their packages and their ``.dist-info``, so that
    pip in the simulated Colab sees them installed. Returns their names."""
    from packaging.requirements import Requirement

    for pin in COLAB_PREINSTALLED:  # the versions Colab ships are the ones linked
        req = Requirement(pin)
        version = importlib.metadata.version(req.name).split("+")[0]
        assert req.specifier.contains(version), (pin, version)
    names, todo = set(), ["pip", *(_name(r) for r in COLAB_PREINSTALLED)]
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        dist = importlib.metadata.distribution(name)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(r))
        site = Path(dist.locate_file(""))
        tops = {f.parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__"}):
            if not top.endswith(".pth") and not (folder / top).exists():
                (folder / top).symlink_to(site / top)
    return names


def test_notebooks_and_readme_are_in_step_with_config():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "colab.py"), "check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_chapter_starts_with_the_setup_cell():
    repo, ref = colab.read_repository()
    source = colab.setup_source(repo, ref)
    for path in colab.chapters():
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = next(c for c in nb["cells"] if c["cell_type"] == "code")
        assert "".join(first["source"]) == source, path.name
        assert "colab-setup" in first["metadata"]["tags"], path.name


def test_repository_url_is_in_one_place():
    repo, _ = colab.read_repository()
    hits = subprocess.run(
        ["git", "grep", "-l", "--untracked", repo], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    # _config.yml holds it; the notebooks and the README are generated from it.
    assert "_config.yml" in hits
    others = [
        h for h in hits if h != "_config.yml" and not h.endswith(".ipynb") and h != "README.md"
    ]
    assert others == [], f"the repository URL is written by hand in {others}"


def test_setup_cell_does_nothing_outside_colab(monkeypatch):
    assert "google.colab" not in sys.modules
    repo, ref = colab.read_repository()
    cwd, path = os.getcwd(), list(sys.path)
    exec(compile(colab.setup_source(repo, ref), "setup-cell", "exec"), {})
    assert os.getcwd() == cwd and sys.path == path


def test_read_repository_rejects_a_missing_section(tmp_path, monkeypatch):
    (tmp_path / "_config.yml").write_text("title: x\n")
    monkeypatch.setattr(colab, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="repository"):
        colab.read_repository()


SIMULATION = textwrap.dedent(
    """
    import json, os, sys, types

    calls = []
    google = types.ModuleType("google")
    google.colab = types.ModuleType("google.colab")
    google.colab.output = types.SimpleNamespace(
        enable_custom_widget_manager=lambda: calls.append("widgets")
    )
    sys.modules["google"], sys.modules["google.colab"] = google, google.colab

    exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {})

    import gptlib
    from gptlib.widgets import BPEMergeView

    view = BPEMergeView([["a", "b", "c"], ["ab", "c"]], ["a + b"])
    bundle = view._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    print(json.dumps({
        "gptlib_file": gptlib.__file__,
        "cwd": os.getcwd(),
        "calls": calls,
        "mime": sorted(bundle),
    }))
    """
)


@pytest.mark.slow
def test_setup_cell_in_a_simulated_colab(tmp_path):
    if not (WHEELHOUSE / ".done").exists():
        pytest.skip("no wheelhouse: `make test` fills .cache/wheelhouse at install time")
    ref = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if not ref or ref == "HEAD":
        pytest.skip(
            "the checkout is on no branch, so there is nothing for `git clone --branch` to fetch"
        )
    venv = tmp_path / "colab-venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    shipped = tmp_path / "colab-dist-packages"
    shipped.mkdir()
    names = _preinstalled(shipped)
    assert not names & CELL_INSTALLS, names & CELL_INSTALLS  # else the cell would install nothing
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "colab.pth").write_text(f"{shipped}\n")
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(WHEELHOUSE),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    missing = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in sys.argv[1:]))"
    subprocess.run([py, "-c", missing, "gptlib", *CELL_INSTALLS], check=True, env=env, cwd=tmp_path)

    repo, _ = colab.read_repository()
    cell = tmp_path / "setup_cell.py"
    cell.write_text(colab.setup_source(repo, ref))
    script = tmp_path / "simulate.py"
    script.write_text(SIMULATION)
    book = tmp_path / "book"
    env.update(GPTLIB_BOOK_REPO=ROOT.as_uri(), GPTLIB_BOOK_REF=ref, GPTLIB_BOOK_DIR=str(book))
    r = subprocess.run(
        [py, str(script), str(cell)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["gptlib_file"].startswith(str(book)), result
    assert result["cwd"] == str(book / "chapters")
    assert result["calls"] == ["widgets"]
    assert "application/vnd.jupyter.widget-view+json" in result["mime"]
