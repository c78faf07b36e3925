"""The GPU call's preparation (scripts/gpu_prepare.py) and its chapter runner
(scripts/run_chapters_cuda.py), on what a CPU can check: which dependencies a wheel declares for
the device's Python, which wheels install there, taking files out of git's index and putting them
back, and what a chapter's cell printed once sanitized as nbval sanitizes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
from browser_support import ROOT, load_module

prep = load_module(ROOT / "scripts" / "gpu_prepare.py")
runner = load_module(ROOT / "scripts" / "run_chapters_cuda.py")


def make_wheel(folder, name, requires):
    path = folder / f"{name}-1.0-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", meta)
    return path


def test_a_wheels_dependencies_are_those_of_the_devices_python_without_extras(tmp_path):
    wheel = make_wheel(
        tmp_path,
        "demo",
        ['old-only; python_version < "3.12"', 'tests-only; extra == "test"', "always>=1"],
    )

    def names(python):
        return [r.name for r in prep.wheel_requires(wheel, prep.marker_env(python))]

    assert names("3.12") == ["always"]
    assert names("3.11") == ["old-only", "always"]


def test_a_wheel_built_for_another_python_is_refused(tmp_path):
    fine = [
        tmp_path / "a-1.0-py3-none-any.whl",
        tmp_path / "b-1.0-cp312-cp312-manylinux_2_17_x86_64.whl",
        tmp_path / "c-1.0-cp311-abi3-manylinux_2_28_x86_64.whl",
    ]
    prep.check_tags(fine, "3.12")
    wrong = tmp_path / "d-1.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    with pytest.raises(SystemExit, match="d-1.0-cp311-cp311"):
        prep.check_tags([*fine, wrong], "3.12")


def git(repo, *args, check=True):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=check,
    )


def test_detach_takes_the_largest_files_out_of_the_index_and_restore_puts_them_back(
    tmp_path, monkeypatch
):
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "models" / "big.bin").write_bytes(b"x" * 3000)
    (repo / "models" / "mid.bin").write_bytes(b"y" * 1500)
    (repo / "small.txt").write_text("kept\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    monkeypatch.setattr(prep, "ROOT", repo)
    monkeypatch.setattr(prep, "LIMIT", 3500)
    monkeypatch.setattr(prep, "MARGIN", 500)

    names = prep.detach(carried=100)  # 4505 + 100 bytes: one file must go to fit in 3000
    assert names == ["models/big.bin"]
    assert "models/big.bin" not in git(repo, "ls-files").stdout
    assert (repo / "models" / "big.bin").exists()  # only out of the index
    assert [p.name for p in prep.travelling()] == ["mid.bin", "small.txt"]
    assert prep.detached() == ["models/big.bin"]
    refused = git(repo, "commit", "-q", "-m", "oops", check=False)
    assert refused.returncode != 0 and "--restore" in refused.stderr
    with pytest.raises(SystemExit, match="already detached"):
        prep.detach(carried=0)

    assert prep.restore() == ["models/big.bin"]
    assert git(repo, "status", "--porcelain").stdout == ""
    assert "models/big.bin" in git(repo, "ls-files").stdout
    assert prep.detached() == []
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert prep.restore() == []  # a second restore has nothing to do

    # a chapter that would lose one of its inputs loses them all
    monkeypatch.setattr(prep, "input_groups", lambda: [["models/big.bin", "models/mid.bin"]])
    assert prep.detach(carried=100) == ["models/big.bin", "models/mid.bin"]
    assert [p.name for p in prep.travelling()] == ["small.txt"]
    assert prep.restore() == ["models/big.bin", "models/mid.bin"]
    assert git(repo, "status", "--porcelain").stdout == ""


def test_the_groups_are_the_runners_inputs_in_the_repository():
    assert [f"models/rlhf/{k}.safetensors" for k in ("sft", "reward_model", "ppo", "dpo")] in (
        prep.input_groups()
    )


def test_detach_refuses_a_working_tree_with_changes(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    (repo / "a.txt").write_text("changed\n")
    monkeypatch.setattr(prep, "ROOT", repo)
    with pytest.raises(SystemExit, match="has changes"):
        prep.detach(carried=0)


def test_a_cells_text_is_what_nbval_compares_after_its_sanitizing():
    cell = {
        "outputs": [
            {"output_type": "stream", "text": ["step took ", "12.5"]},
            {"output_type": "stream", "text": " ms\n"},  # the kernel split one print
            {"output_type": "display_data", "data": {"image/png": "...", "text/plain": "<Fig>"}},
            {"output_type": "execute_result", "data": {"text/plain": "<object at 0x7f3a>"}},
            {"output_type": "error", "ename": "ValueError", "evalue": "n must be positive"},
        ]
    }
    assert runner.cell_text(cell) == (
        "step took <TIME>\n<object at 0x<ADDR>>\nValueError: n must be positive\n"
    )


def test_a_chapter_whose_inputs_stayed_behind_is_named_with_them(monkeypatch, tmp_path):
    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    assert runner.missing_inputs("13_inference") == [
        f"smollm2-gguf (gptlib.assets, in {tmp_path})",
        "smollm2-135m-instruct.safetensors (python -m gptlib.gguf export)",
        "smollm2-135m-instruct.tokenizer.json (python -m gptlib.gguf export)",
    ]
    assert runner.missing_inputs("05_block") == []
    assert runner.missing_inputs("09_rlhf") == []  # models/rlhf, in this checkout


def test_the_chapters_on_scalar_kernels_are_the_makefiles():
    assert runner.scalar_chapters() == {"13", "12", "11", "09", "07", "06", "05"}


@pytest.mark.slow
def test_the_gpu_benchmarks_smoke_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--smoke", "--json", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    figures = json.loads(out.read_text())
    assert set(figures["training"]) == {"eager", "eager, flash"}
    for run in figures["training"].values():
        assert 0 < run["mfu"] <= 1.5 and run["tokens_per_s"] > 0
    assert figures["decoding"]["same_tokens"] is True  # gptlib's cache and HF, greedy, float32
