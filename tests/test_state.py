"""gptlib.state and gptlib.files (the one file format), atomic writes, and the import graph."""

import ast
import math
import os
import random
import stat
from pathlib import Path

import pytest
import torch

from gptlib import runtime
from gptlib.files import load_tree, read_fields, read_file, save_tree, write_file
from gptlib.state import check_optimizer_state, check_random_states, pack, unpack

ROOT = Path(__file__).resolve().parents[1]


# --- trees of values -----------------------------------------------------------------------------
def test_pack_unpack_round_trip_keeps_types_and_values():
    g = torch.Generator().manual_seed(0)
    tree = {
        "step": 5,
        "lr": 0.1,
        "betas": (0.9, 0.95),
        "flags": [True, None, "x"],
        "nan": math.nan,
        "inf": -math.inf,
        "by_int": {0: torch.randn(2, 3, generator=g), 1: {"step": torch.tensor(3.0)}},
        "$odd": 1,
        "big": 2**70,
        "bf16": torch.ones(2, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "rng": random.getstate(),
    }
    structure, tensors = pack(tree, "t")
    assert sorted(tensors) == ["t/bf16", "t/by_int/0", "t/by_int/1/step", "t/empty"]
    back = unpack(structure, tensors, prefix="t")
    assert (
        back.keys() == tree.keys() and back["betas"] == (0.9, 0.95) and back["rng"] == tree["rng"]
    )
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf and back["big"] == 2**70
    assert (
        torch.equal(back["by_int"][0], tree["by_int"][0]) and back["bf16"].dtype == torch.bfloat16
    )
    assert (
        isinstance(back["step"], int)
        and isinstance(back["lr"], float)
        and back["flags"] == [True, None, "x"]
    )


def test_pack_and_unpack_refuse_what_they_cannot_represent():
    for bad, match in [
        ({"a": object()}, "tree/a: a object cannot be stored"),
        ([1, {2.5j}], "tree/1: a set"),
        ({torch.zeros(1): 1}, "a dict key of type Tensor"),
    ]:
        with pytest.raises(ValueError, match=match):
            pack(bad)
    structure, tensors = pack({"w": torch.zeros(2)})
    with pytest.raises(
        ValueError, match="src: tensor\\(s\\) \\['tree/extra'\\] are not part of the stored tree"
    ):
        unpack(structure, {**tensors, "tree/extra": torch.zeros(1)}, "src")
    for s in [
        {"$tensor": "tree/missing"},
        {"$float": "1.5"},
        {"$what": 1},
        {"$tuple": 3},
        {"a": 1, "$b": 2},
    ]:
        with pytest.raises(ValueError, match="src: malformed entry"):
            unpack(s, tensors, "src")


def test_check_optimizer_and_random_states():
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    w.sum().backward()
    opt.step()
    sd = opt.state_dict()
    assert check_optimizer_state(opt, sd, "src") is sd
    bad = {
        "state": {0: {**sd["state"][0], "exp_avg": torch.zeros(4)}},
        "param_groups": sd["param_groups"],
    }
    with pytest.raises(
        ValueError, match=r"src: state\[0\]\['exp_avg'\] must be a float tensor of shape \(3,\)"
    ):
        check_optimizer_state(opt, bad, "src")
    with pytest.raises(ValueError, match="names parameters the optimiser does not have"):
        check_optimizer_state(opt, {"state": {5: {}}, "param_groups": sd["param_groups"]}, "src")
    rng = {"g": torch.Generator().get_state(), "python": list(random.getstate())}
    assert check_random_states(rng, "src")["python"] == random.getstate()
    with pytest.raises(ValueError, match="src: 'g' is not a valid random state"):
        check_random_states({"g": torch.zeros(3, dtype=torch.uint8)}, "src")


# --- the file format -----------------------------------------------------------------------------
def test_files_round_trip_are_deterministic_and_name_what_is_wrong(tmp_path):
    tree = {"loss": [2.5, 1.0], "w": torch.arange(6.0).reshape(2, 3)}
    a = save_tree(tmp_path / "a.safetensors", tree, note="x")
    b = save_tree(tmp_path / "b.safetensors", tree, note="x")
    assert a.read_bytes() == b.read_bytes()
    back = load_tree(a)
    assert back["loss"] == [2.5, 1.0] and torch.equal(back["w"], tree["w"])
    ordered = {
        "z": 1,
        "a": {"y": 2, "b": 3},
        "m": {2: "x", 1: "y"},
    }  # results come back in their order
    assert list(load_tree(save_tree(tmp_path / "o.safetensors", ordered)).items()) == list(
        ordered.items()
    )
    assert list(load_tree(tmp_path / "o.safetensors")["a"]) == ["y", "b"]
    fields = read_fields(a)
    assert fields["version"] == 1 and fields["note"] == "x" and len(fields["sha256"]) == 64
    tensors, _ = read_file(a)
    write_file(
        tmp_path / "v2.safetensors", tensors, {**fields, "version": 2}
    )  # write_file sets version 1 again
    assert read_fields(tmp_path / "v2.safetensors")["version"] == 1
    with pytest.raises(ValueError, match="fields must be JSON values with finite numbers"):
        write_file(tmp_path / "nan.safetensors", {}, {"x": math.nan})
    from safetensors.torch import save_file

    save_file(
        {"x": torch.zeros(1)},
        str(tmp_path / "v9.safetensors"),
        metadata={"gptlib": '{"version": 9}'},
    )
    with pytest.raises(ValueError, match="v9.safetensors: field 'version' is 9"):
        read_file(tmp_path / "v9.safetensors")
    save_file(
        {"x": torch.zeros(1)},
        str(tmp_path / "nanmeta.safetensors"),
        metadata={"gptlib": '{"version": 1, "x": NaN}'},
    )
    with pytest.raises(
        ValueError, match="nanmeta.safetensors: its 'gptlib' metadata is not valid JSON"
    ):
        read_file(tmp_path / "nanmeta.safetensors")
    with pytest.raises(ValueError, match="field 'tree' is missing"):
        load_tree(write_file(tmp_path / "notree.safetensors", {}, {}))


# --- atomic writes --------------------------------------------------------------------------------
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
    assert (
        q.read_text() == "b" and stat.S_IMODE(q.stat().st_mode) == 0o600
    )  # not reset to the umask's 0644
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
    # a write killed after its temporary file was complete, before the rename: in a child process
    # (forked, so that it need not import torch again), which then is gone, its pid with it
    pid = os.fork()
    if pid == 0:
        try:
            os.replace = lambda *a: os._exit(9)
            runtime.atomic_write(p, b"x" * 100000)
        finally:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 9
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".tmp")]) == 1
    live = (
        tmp_path / f".model.safetensors.{os.getppid()}-abcdefgh.tmp"
    )  # a live process's write: kept
    live.write_bytes(b"")
    other = tmp_path / ".other.safetensors.999999999-abcdefgh.tmp"  # another file's: kept
    other.write_bytes(b"")
    runtime.atomic_write(p, b"new")
    assert sorted(os.listdir(tmp_path)) == sorted(["model.safetensors", live.name, other.name])


# --- dependencies run one way ---------------------------------------------------------------------
def _gptlib_imports() -> dict[str, set[str]]:
    """module -> the gptlib modules it imports anywhere in its source (lazy imports included)."""
    modules = {}
    for path in sorted((ROOT / "gptlib").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = (path, parts[-1] == "__init__")
    graph = {}
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        edges.add(f"{target}.{alias.name}")
                    elif target in modules:
                        edges.add(target)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
        graph[name] = edges - {name}
    return graph


def test_gptlib_has_no_import_cycle_and_the_models_import_no_io():
    graph = _gptlib_imports()
    assert graph["gptlib.model"] >= {
        "gptlib.files",
        "gptlib.state",
    }  # the parser sees relative imports
    state, on_path = {}, []

    def visit(m):  # depth-first search; a grey node met again closes a cycle
        state[m] = "grey"
        on_path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "grey":
                raise AssertionError(
                    "import cycle: " + " -> ".join(on_path[on_path.index(n) :] + [n])
                )
            if n not in state:
                visit(n)
        on_path.pop()
        state[m] = "black"

    for m in sorted(graph):
        if m not in state:
            visit(m)

    def reach(m, seen=None):
        seen = set() if seen is None else seen
        for n in graph[m]:
            if n not in seen:
                seen.add(n)
                reach(n, seen)
        return seen

    io = {"gptlib.hf", "gptlib.gguf", "gptlib.training", "gptlib.parallel.launch"}
    for m in ("gptlib.model", "gptlib.modern", "gptlib.training"):
        assert not reach(m) & (io - {m}), f"{m} imports {sorted(reach(m) & io)}"
    for generic in ("gptlib.state", "gptlib.files"):
        assert not reach(generic) & {"gptlib.model", "gptlib.modern", *io}, generic
