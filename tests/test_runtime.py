"""gptlib.runtime: device choice, precision, seeding, atomic writes."""

import errno
import os

import pytest
import torch

from gptlib import runtime


def test_device_is_cuda_when_present_else_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert runtime.device().type == expected
    assert runtime.device("cpu") == torch.device("cpu")


def test_device_rejects_unknown_or_missing():
    with pytest.raises(ValueError, match="prefer"):
        runtime.device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            runtime.device("cuda")


def test_autocast_dtype_is_none_on_cpu_and_autocast_is_noop():
    assert runtime.autocast_dtype("cpu") is None
    with runtime.autocast("cpu"):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.float32


def test_seed_everything_reproduces_draws():
    g1 = runtime.seed_everything(7)
    a = torch.randn(3), torch.randn(3, generator=g1)
    g2 = runtime.seed_everything(7)
    b = torch.randn(3), torch.randn(3, generator=g2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="seed"):
        runtime.seed_everything(-1)


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    runtime.atomic_write(p, "first")
    runtime.atomic_write(p, b"second")
    assert p.read_bytes() == b"second"
    assert os.listdir(p.parent) == ["f.txt"]


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "f.txt"
    runtime.atomic_write(p, "old")

    class Boom:  # not bytes or str: refused before anything is written
        pass

    with pytest.raises(ValueError, match="data must be bytes or str"):
        runtime.atomic_write(p, Boom())  # type: ignore[arg-type]
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_atomic_write_keeps_old_file_when_the_disk_fails_mid_write(tmp_path, monkeypatch):
    """The temporary file is written, then flushing it fails (a full disk): the old file stays
    whole and the temporary file is removed."""
    p = tmp_path / "f.txt"
    runtime.atomic_write(p, "old")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runtime.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        runtime.atomic_write(p, "new " * 1000)
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_check_positive_int_names_the_parameter():
    runtime.check_positive_int("n_ctx", 1)
    for bad in (0, -3, 2.0, True, "4", None):
        with pytest.raises(ValueError, match="^n_ctx must be a positive int"):
            runtime.check_positive_int("n_ctx", bad)


def test_atomic_write_gives_ordinary_file_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        p = runtime.atomic_write(tmp_path / "perm.txt", "x")
        assert (
            stat.S_IMODE(p.stat().st_mode) == 0o644
        )  # what open(p, "w") gives under umask 022, not mkstemp's 0600
    finally:
        os.umask(umask)
