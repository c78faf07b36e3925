"""Prepare the one call on a GPU machine that runs every chapter on CUDA and bench/bench_gpu.py.

    python scripts/gpu_prepare.py             # wheels into .whl/, assets into .gpu/, a report
    python scripts/gpu_prepare.py --detach    # also untrack the files that cannot travel
    python scripts/gpu_prepare.py --restore   # track them again (do this before any commit)
    python scripts/gpu_prepare.py --python 3.11 --wheels .whl311   # wheels for a local rehearsal

The GPU machine has its own Python (3.12) with torch, numpy, matplotlib, transformers, tiktoken,
onnx and onnxruntime, but no Jupyter, and no network. A call takes the working tree (tracked
files, and untracked files git does not ignore) plus up to 8 carried paths, 64 MiB in all. So:

* the packages the chapters and the kernel need beyond :data:`DEVICE_PACKAGES` travel as wheels
  for the device's Python in ``.whl/`` (pinned by requirements.txt, their dependencies followed
  through each wheel's metadata), installed there with ``pip --no-index --target``;
* the assets the chapters read (GPT-2's ranks, the Brown corpus) travel in ``.gpu/cache``, the
  ``GPTLIB_CACHE_DIR`` there; SmolLM2 (Chapters 12 and 13) is too large to travel;
* the tracked tree is itself over the limit (Chapter 9's four models are 65 MiB), so
  ``--detach`` takes the largest tracked files out of git's index until what travels fits, adds
  them to ``.git/info/exclude`` (they stay on disk) and installs a pre-commit hook that refuses
  to commit while they are out; ``--restore`` undoes all three. Chapters whose inputs stayed
  behind are reported as skipped by ``scripts/run_chapters_cuda.py``.

Then one call, with ``.whl`` and ``.gpu`` carried: ``bash scripts/gpu_check.sh`` (see there).
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20  # what one call may carry, working tree included
MARGIN = 4 * 2**20  # kept free under LIMIT
RUNNER = "run_chapters_cuda.py"  # its NEEDS: what each chapter reads

# The device image's Python packages (its documentation's list, read 2026-11-17): carried only
# when missing. Versions there differ from requirements.txt's (torch 2.11.0, numpy 2.5.2,
# transformers 5.17.0); the chapters run on those.
DEVICE_PACKAGES = frozenset(
    canonicalize_name(n)
    for n in """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript optax
    opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
    pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
    py-cpuinfo pygments pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)

# What the chapters import that the device lacks, and what runs them: nbclient starts an
# ipykernel, which nbformat's notebooks are read with.
ROOTS = ("nbclient", "nbformat", "ipykernel", "ipywidgets", "anywidget", "gguf")

# The assets Chapters 0-11 and 14 read (gptlib.assets names); SmolLM2's files stay behind.
CARRIED_ASSETS = ("gpt2-ranks", "brown")

PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
HOOK_MARK = "# gpu_prepare.py --detach"
EXCLUDE_BEGIN = "# gpu_prepare.py --detach: begin"
EXCLUDE_END = "# gpu_prepare.py --detach: end"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def git_path(name: str) -> Path:
    return ROOT / git("rev-parse", "--git-path", name).strip()


def pins() -> dict[str, str]:
    """requirements.txt's ``name==version`` lines, by canonical name."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, ver = line.split("==", 1)
            out[canonicalize_name(name)] = ver.strip()
    return out


def marker_env(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return env


def wheel_requires(path: Path, env: dict[str, str]) -> list[Requirement]:
    """The dependencies a wheel declares that apply to ``env`` (no extras)."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    reqs = []
    for text in msg.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            reqs.append(req)
    return reqs


def find_wheel(folder: Path, name: str) -> Path | None:
    for p in folder.glob("*.whl"):
        if parse_wheel_filename(p.name)[0] == name:
            return p
    return None


def download(name: str, spec: str, python: str, into: Path) -> Path:
    """One wheel for ``python`` on the device's platform, without its dependencies."""
    abi = "cp" + python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--only-binary=:all:", "--python-version", python]
    cmd += ["--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += ["-d", str(into), f"{name}{spec}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pip download {name}{spec} failed:\n{done.stderr[-2000:]}")
    path = find_wheel(into, canonicalize_name(name))
    if path is None:
        raise SystemExit(f"pip download {name}{spec}: no wheel arrived in {into}")
    return path


def build_wheelhouse(into: Path, python: str) -> list[Path]:
    """Wheels for ROOTS and everything they need that the device lacks, in ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    pinned, env = pins(), marker_env(python)
    todo, seen, wheels = [Requirement(r) for r in ROOTS], set(), []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in DEVICE_PACKAGES:
            continue
        seen.add(name)
        if name in pinned:
            spec = f"=={pinned[name]}"
        else:
            try:  # the version this checkout's environment was tested with
                spec = f"=={version(req.name)}"
            except PackageNotFoundError:
                spec = str(req.specifier)
        path = find_wheel(into, name) or download(req.name, spec, python, into)
        if spec.startswith("==") and parse_wheel_filename(path.name)[1] != Version(spec[2:]):
            path.unlink()  # a stale version from an earlier run
            path = download(req.name, spec, python, into)
        wheels.append(path)
        todo += wheel_requires(path, env)
    stray = sorted(p.name for p in into.glob("*.whl") if p not in wheels)
    for name in stray:  # two versions of one package would stop the install there
        (into / name).unlink()
    return sorted(wheels)


def check_tags(wheels: list[Path], python: str) -> None:
    """Every wheel installs on CPython ``python`` on the device's platform."""
    ver = tuple(int(x) for x in python.split("."))
    ok = set(cpython_tags(ver, platforms=PLATFORMS)) | set(
        compatible_tags(ver, "cp" + python.replace(".", ""), platforms=PLATFORMS)
    )
    bad = [p.name for p in wheels if not (parse_wheel_filename(p.name)[3] & ok)]
    if bad:
        raise SystemExit(f"wheels that do not install on CPython {python}: {bad}")


def gather_assets(into: Path) -> list[Path]:
    from gptlib.assets import asset_path

    into.mkdir(parents=True, exist_ok=True)
    out = []
    for name in CARRIED_ASSETS:
        src = asset_path(name)  # raises, naming the make target, when it was never fetched
        dst = into / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copyfile(src, dst)
        out.append(dst)
    return out


def size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def travelling() -> list[Path]:
    """What a call takes of the working tree: tracked files present, and untracked ones git
    does not ignore."""
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted({ROOT / n for n in names if n and (ROOT / n).is_file()})


def detached() -> list[str]:
    exclude = git_path("info/exclude")
    if not exclude.exists():
        return []
    text = exclude.read_text()
    if EXCLUDE_BEGIN not in text:
        return []
    block = text.split(EXCLUDE_BEGIN, 1)[1].split(EXCLUDE_END, 1)[0]
    return [line.lstrip("/") for line in block.split() if line.strip()]


def input_groups() -> list[list[str]]:
    """The files in the repository that each chapter needs (scripts/run_chapters_cuda.py)."""
    spec = importlib.util.spec_from_file_location("runner", Path(__file__).with_name(RUNNER))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return [
        [n for n in needs if not n.startswith("asset:") and n != "smollm2"]
        for needs in runner.NEEDS.values()
    ]


def detach(carried: int) -> list[str]:
    """Untrack the largest tracked files until the tree and ``carried`` fit under LIMIT."""
    if detached():
        raise SystemExit("files are already detached: run with --restore first")
    if git("status", "--porcelain", "--untracked-files=no").strip():
        raise SystemExit("the working tree has changes: commit or stash them before --detach")
    tracked = [ROOT / n for n in git("ls-files", "-z").split("\0") if n]
    total = size(travelling()) + carried
    names = []
    for p in sorted(tracked, key=lambda p: p.stat().st_size, reverse=True):
        if total <= LIMIT - MARGIN:
            break
        names.append(p.relative_to(ROOT).as_posix())
        total -= p.stat().st_size
    if not names:
        return []
    # a chapter that loses one input loses them all: take the rest of each such group too
    for group in input_groups():
        if set(group) & set(names):
            names += [n for n in group if n not in names and (ROOT / n).is_file()]
    hook = git_path("hooks/pre-commit")
    if hook.exists():
        raise SystemExit(f"{hook} exists: remove it or detach by hand")
    git("rm", "--cached", "-q", "--", *names)
    exclude = git_path("info/exclude")
    exclude.parent.mkdir(parents=True, exist_ok=True)
    old = exclude.read_text() if exclude.exists() else ""
    block = "\n".join([EXCLUDE_BEGIN, *("/" + n for n in names), EXCLUDE_END])
    write(exclude, old + ("" if old.endswith("\n") or not old else "\n") + block + "\n")
    hook.parent.mkdir(parents=True, exist_ok=True)
    write(
        hook,
        f"#!/bin/sh\n{HOOK_MARK}\necho 'files are detached for the GPU call: run "
        "python scripts/gpu_prepare.py --restore before committing' >&2\nexit 1\n",
    )
    hook.chmod(0o755)
    return names


def restore() -> list[str]:
    names = detached()
    if names:
        git("reset", "-q", "--", *names)
        exclude = git_path("info/exclude")
        text = exclude.read_text()
        head, rest = text.split(EXCLUDE_BEGIN, 1)
        write(exclude, head + rest.split(EXCLUDE_END, 1)[1].lstrip("\n"))
    hook = git_path("hooks/pre-commit")
    if hook.exists() and HOOK_MARK in hook.read_text():
        hook.unlink()
    left = git("status", "--porcelain", "--", *names).strip() if names else ""
    if left:
        raise SystemExit(f"not restored cleanly:\n{left}")
    return names


def write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a file beside it, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="3.12", help="the device's Python (3.12)")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    ap.add_argument("--assets", type=Path, default=ROOT / ".gpu" / "cache")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--detach", action="store_true")
    mode.add_argument("--restore", action="store_true")
    args = ap.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python):
        raise SystemExit(f"--python must look like 3.12, got {args.python!r}")

    if args.restore:
        names = restore()
        print(f"restored {len(names)} files to git's index" if names else "nothing was detached")
        return 0

    for folder in (args.wheels, args.assets.parent):
        rel = folder.resolve().relative_to(ROOT).as_posix() + "/"
        if subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT).returncode:
            raise SystemExit(f"{rel} is not ignored by git, so it would travel twice")
    wheels = build_wheelhouse(args.wheels, args.python)
    check_tags(wheels, args.python)
    assets = gather_assets(args.assets)
    carried = size(wheels) + size(assets)
    names = detach(carried) if args.detach else []
    tree = size(travelling())
    print(f"wheels ({len(wheels)}, CPython {args.python}): {mib(size(wheels))} in {args.wheels}")
    print(f"assets: {mib(size(assets))} in {args.assets}")
    if names:
        print(f"detached from git's index (on disk still): {', '.join(names)}")
        print("  run `python scripts/gpu_prepare.py --restore` after the call, before any commit")
    total = tree + carried
    print(f"a call carries {mib(tree)} of working tree + {mib(carried)} = {mib(total)}")
    if total > LIMIT:
        print(f"over the {mib(LIMIT)} a call takes: run with --detach", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
