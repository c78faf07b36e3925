"""gptlib.runtime.atomic_write: what happens to links, write-protected files, modes, the folder, stale temporary files."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gptlib import runtime

ROOT = Path(__file__).resolve().parents[1]


# --- atomic writes (issue 24.15 and 24.16) --------------------------------------------------------
def test_atomic_write_keeps_a_symlink_and_writes_its_target(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert runtime.atomic_write(link, "new") == link
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "real.txt"]


def test_atomic_write_refuses_a_write_protected_file_and_keeps_modes(tmp_path):
    p = tmp_path / "ro.txt"
    p.write_text("keep")
    p.chmod(0o444)
    with pytest.raises(PermissionError, match="ro.txt is write-protected"):
        runtime.atomic_write(p, "lost")
    assert p.read_text() == "keep" and stat.S_IMODE(p.stat().st_mode) == 0o444
    q = tmp_path / "private.txt"
    q.write_text("a")
    q.chmod(0o600)
    runtime.atomic_write(q, "b")
    assert q.read_text() == "b" and stat.S_IMODE(q.stat().st_mode) == 0o600  # not reset to the umask's 0644
    with pytest.raises(ValueError, match="is not a regular file"):
        runtime.atomic_write(tmp_path, "x")
    with pytest.raises(ValueError, match="data must be bytes or str"):
        runtime.atomic_write(tmp_path / "n.txt", 3)


def test_atomic_write_syncs_the_directory_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    runtime.atomic_write(tmp_path / "f.txt", "x")
    assert synced == [False, True]  # the file's data, then the folder's entry


def test_stale_temp_files_of_a_killed_write_are_removed_on_the_next(tmp_path):
    p = tmp_path / "model.safetensors"
    killed = (  # a write killed after its temporary file was complete, before the rename
        "import os, sys; from gptlib import runtime; os.replace = lambda *a: os._exit(9); "
        "runtime.atomic_write(sys.argv[1], b'x' * 100000)"
    )
    r = subprocess.run([sys.executable, "-c", killed, str(p)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 9
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".tmp")]) == 1
    live = tmp_path / f".model.safetensors.{os.getppid()}-abcdefgh.tmp"  # a live process's write: kept
    live.write_bytes(b"")
    other = tmp_path / ".other.safetensors.999999999-abcdefgh.tmp"  # another file's: kept
    other.write_bytes(b"")
    runtime.atomic_write(p, b"new")
    assert sorted(os.listdir(tmp_path)) == sorted(["model.safetensors", live.name, other.name])
