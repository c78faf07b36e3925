"""Where the book runs: device choice, precision, seeding, atomic file writes and argument checks.

Every chapter asks this module, and only this module, which device to use, so the rule
"CUDA when present, CPU otherwise" lives in one place.
"""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

__all__ = ["device", "autocast_dtype", "autocast", "seed_everything", "atomic_write", "check_positive_int", "named_preset"]


def named_preset(presets: dict, name: str, **overrides):
    """``presets[name]`` (a frozen config) with ``overrides`` replaced; an unknown name is a ``ValueError``.

    >>> from gptlib.model import PRESETS
    >>> named_preset(PRESETS, "tiny", n_layers=3).n_layers
    3
    """
    if name not in presets:
        raise ValueError(f"name must be one of {sorted(presets)}, got {name!r}")
    return dataclasses.replace(presets[name], **overrides)


def check_positive_int(name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int >= 1 (``bool`` is not accepted).

    >>> check_positive_int("d_model", 8)
    >>> check_positive_int("d_model", 0)
    Traceback (most recent call last):
    ...
    ValueError: d_model must be a positive int, got 0
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def device(prefer: str | None = None) -> torch.device:
    """The device the book computes on: ``cuda`` when present, else ``cpu``.

    MPS is deliberately not chosen automatically: it is known to give different training
    results. ``prefer`` forces a device (``"cpu"``, ``"cuda"``); asking for CUDA where
    there is none raises ``ValueError``.

    >>> device("cpu")
    device(type='cpu')
    """
    if prefer is not None:
        if prefer not in ("cpu", "cuda", "mps"):
            raise ValueError(f"prefer must be 'cpu', 'cuda' or 'mps', got {prefer!r}")
        if prefer == "cuda" and not torch.cuda.is_available():
            raise ValueError("prefer='cuda' but torch.cuda.is_available() is False")
        if prefer == "mps" and not torch.backends.mps.is_available():
            raise ValueError("prefer='mps' but torch.backends.mps.is_available() is False")
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_dtype(dev: torch.device | str) -> torch.dtype | None:
    """The reduced precision to train in on ``dev``: bf16 where the GPU supports it, else None.

    >>> autocast_dtype("cpu") is None
    True
    """
    dev = torch.device(dev)
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


@contextmanager
def autocast(dev: torch.device | str) -> Iterator[None]:
    """``torch.autocast`` in bf16 where :func:`autocast_dtype` allows it; a no-op elsewhere."""
    dtype = autocast_dtype(dev)
    if dtype is None:
        yield
    else:
        with torch.autocast(device_type=torch.device(dev).type, dtype=dtype):
            yield


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, and torch's global RNGs; return a CPU ``torch.Generator`` seeded alike."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    return torch.Generator().manual_seed(seed)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then rename.

    A reader never sees a half-written file, and a crash leaves the old file intact. The file gets
    the permissions an ordinary ``open(path, "w")`` would give it (``mkstemp`` alone makes it 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
