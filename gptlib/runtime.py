"""Where the book runs: device choice, precision, seeding, atomic file writes and argument checks.

Every chapter asks this module, and only this module, which device to use, so the rule
"CUDA when present, CPU otherwise" lives in one place.
"""

from __future__ import annotations

import math
import numbers
import os
import random
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping, Set
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "device",
    "autocast_dtype",
    "autocast",
    "seed_everything",
    "atomic_write",
    "check_positive_int",
    "check_not_meta",
    "check_int",
    "check_float",
    "check_ids",
    "check_targets",
    "check_mask",
    "check_finite",
    "check_finite_weights",
    "all_finite",
    "check_file",
]


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as a Python ``int`` if it is an int >= 1 (NumPy integers too; ``bool`` and
    NumPy bools are not); else ``ValueError`` naming ``name``.

    >>> check_positive_int("d_model", 8)
    8
    >>> check_positive_int("d_model", 0)
    Traceback (most recent call last):
    ...
    ValueError: d_model must be a positive int, got 0
    """
    if isinstance(value, torch.SymInt):
        return value  # a size traced symbolically (torch.export, torch.compile): no value to check
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_not_meta(weight: torch.Tensor, x: torch.Tensor) -> None:
    """Raise ``ValueError`` if ``weight`` is on the meta device (shapes without values) and the
    input ``x`` is not: a model built under ``torch.device("meta")`` propagates meta inputs'
    shapes, but gives no values for real ones. One device comparison: cheap enough for the
    forward pass of every decoded token.

    >>> check_not_meta(torch.empty(2, device="meta"), torch.empty(1, device="meta"))
    >>> check_not_meta(torch.empty(2, device="meta"), torch.zeros(1))
    Traceback (most recent call last):
    ...
    ValueError: model's weights are on the meta device (no values): load them first
    """
    if weight.device.type == "meta" and x.device.type != "meta":
        raise ValueError("model's weights are on the meta device (no values): load them first")


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` if it is an int (``bool`` is not) with ``lo <= value <= hi``; else
    ``ValueError`` naming ``name``.

    NumPy and torch integer scalars are accepted and returned as a Python ``int``.

    >>> check_int("top_k", 3, lo=1)
    3
    >>> check_int("top_k", 2.0, lo=1)
    Traceback (most recent call last):
    ...
    ValueError: top_k must be an int, got 2.0
    """
    if isinstance(value, torch.SymInt):
        return value  # a size traced symbolically (torch.export, torch.compile): no value to check
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        where = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {where}, got {value}")
    return value


def check_float(
    name: str,
    value: object,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Return ``value`` as a float if it is a finite real number in the range; else ``ValueError``
    naming ``name``.

    The range is [lo, hi], with ``lo_open``/``hi_open`` making an end open; ``None`` leaves a side
    unbounded. NaN and the infinities are refused whatever the range; so is ``bool``.

    >>> check_float("dropout", 0.1, 0.0, 1.0, hi_open=True)
    0.1
    >>> check_float("ln_eps", float("nan"), 0.0)
    Traceback (most recent call last):
    ...
    ValueError: ln_eps must be a finite number, got nan
    >>> check_float("max_lr", 0.0, 0.0, lo_open=True)
    Traceback (most recent call last):
    ...
    ValueError: max_lr must be > 0.0, got 0.0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    above = hi is not None and (value >= hi if hi_open else value > hi)
    if below or above:
        left = None if lo is None else ("(" if lo_open else "[") + f"{lo}"
        right = None if hi is None else f"{hi}" + (")" if hi_open else "]")
        if right is None:
            where = f"> {lo}" if lo_open else f">= {lo}"
        elif left is None:
            where = f"< {hi}" if hi_open else f"<= {hi}"
        else:
            where = f"in {left}, {right}"
        raise ValueError(f"{name} must be {where}, got {value!r}")
    return value


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_ids(ids: object, size: int, name: str = "ids") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``ids`` are integer token ids in [0, size).

    ``ids`` is an integer tensor (any shape) or a sequence of ints (``bool`` and floats refused).
    For a tensor the range check reads its data (a device synchronisation on a GPU): callers on a
    per-token path check once, before the loop.

    >>> check_ids([0, 2], 3)
    >>> check_ids(torch.tensor([[0, 3]]), 3)
    Traceback (most recent call last):
    ...
    ValueError: ids must lie in [0, 3), got values in [0, 3]
    >>> check_ids([1, True], 3)
    Traceback (most recent call last):
    ...
    ValueError: ids must be ints in [0, 3), got True at position 1
    """
    check_positive_int("size", size)
    if isinstance(ids, torch.Tensor):
        if ids.dtype not in _INT_DTYPES:
            raise ValueError(
                f"{name} must be an integer tensor ({', '.join(map(str, _INT_DTYPES))}), got "
                f"{ids.dtype}"
            )
        # A data-dependent check: skipped under torch.compile and on the meta device (no
        # data there).
        if ids.numel() and ids.device.type != "meta" and not torch.compiler.is_compiling():
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo < 0 or hi >= size:
                raise ValueError(f"{name} must lie in [0, {size}), got values in [{lo}, {hi}]")
        return
    if isinstance(ids, (str, bytes, Mapping, Set)):  # no ids, or no order
        raise ValueError(f"{name} must be a sequence of ints, got {type(ids).__name__}")
    try:
        items = list(ids)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(
            f"{name} must be a tensor or a sequence of ints, got {type(ids).__name__}"
        ) from None
    for k, i in enumerate(items):
        if type(i) is int and 0 <= i < size:  # the common case, without the ABC check below
            continue
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= int(i) < size:
            raise ValueError(f"{name} must be ints in [0, {size}), got {i!r} at position {k}")


def check_targets(targets: object, size: int, name: str = "targets") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``targets`` is a non-empty integer tensor of ids
    in [0, size).

    The book's losses score every target: there is no ``ignore_index``, so -100 (PyTorch's
    marker for a skipped position) is refused like any other id out of range.

    >>> check_targets(torch.tensor([[0, 4]]), 5)
    >>> check_targets(torch.tensor([3, -100]), 5)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: targets must lie in [0, 5), got values in [-100, 3] (-100 skips nothing here:
    the book's losses have no ignore_index)
    """
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"{name} must be an integer tensor, got {type(targets).__name__}")
    if targets.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(targets.shape)}): a mean over no target is undefined"
        )
    try:
        check_ids(targets, size, name)
    except ValueError as e:
        if targets.dtype in _INT_DTYPES and bool((targets == -100).any()):
            raise ValueError(
                f"{e} (-100 skips nothing here: the book's losses have no ignore_index)"
            ) from None
        raise


def check_mask(name: str, mask: object, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """``mask`` as a boolean tensor of ``shape``, or ``ValueError`` naming ``name``.

    A mask selects: a bool tensor, or numbers that are all 0 or 1 (read as False and True). Any
    other value (0.5, 7) would weigh what it is meant to select, so it is refused.

    >>> check_mask("mask", torch.tensor([1.0, 0.0]), (2,))
    tensor([ True, False])
    >>> check_mask("mask", torch.tensor([0.0, 0.5]), (2,))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: mask must be boolean (or 0/1), got values other than 0 and 1 in a tensor of
    torch.float32
    """
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a boolean tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{name} must be boolean (or 0/1), got values other than 0 and 1 in a tensor of "
            f"{mask.dtype}"
        )
    return mask != 0


def check_finite(name: str, t: object) -> torch.Tensor:
    """``t`` if it is a floating-point tensor without NaN or infinity; else ``ValueError`` naming
    ``name``.

    Reads the data (a device synchronisation on a GPU).

    >>> check_finite("rewards", torch.tensor([1.0, float("nan")]))
    Traceback (most recent call last):
    ...
    ValueError: rewards must be finite, got 1 NaN or infinite value(s) of 2
    """
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
        raise ValueError(
            f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}"
        )
    if t.device.type != "meta" and not torch.compiler.is_compiling():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ValueError(
                f"{name} must be finite, got {bad} NaN or infinite value(s) of {t.numel()}"
            )
    return t


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every entry of every tensor (floating point, not on the meta device) is finite: no
    NaN, no infinity. One device synchronisation.

    A sum is finite only if every term is (a NaN or an infinity makes every partial sum that holds
    it NaN or infinite, whatever the order of the additions), and a sum reads each number once and
    writes nothing: on a model's weights about ten times faster than ``isfinite(t).all()``, which
    writes a boolean per number. Only a sum that is not finite (a non-finite entry, or finite
    entries whose sum overflows) is settled entry by entry.

    >>> all_finite([torch.ones(3), torch.full((2,), 6e4, dtype=torch.float16)])  # the sum overflows
    True
    >>> all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    False
    """
    tensors = [t.detach() for t in tensors if t.numel()]
    if not tensors:
        return True
    dev = tensors[0].device
    sums = torch.stack([t.sum().to(dev, torch.float32) for t in tensors])
    if bool(torch.isfinite(sums).all()):
        return True
    return bool(torch.stack([torch.isfinite(t).all().to(dev) for t in tensors]).all())


def check_finite_weights(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming the first parameter or buffer of ``model`` that holds a NaN or an
    infinity.

    Its outputs would be meaningless; the error says where the fault is, before any is computed. A
    model on the meta device (shapes without values) is refused too. One sum per tensor
    (:func:`all_finite`) and one device synchronisation while the weights are finite.

    >>> m = torch.nn.Linear(2, 1)
    >>> _ = m.bias.data.fill_(float("inf"))
    >>> check_finite_weights(m)
    Traceback (most recent call last):
    ...
    ValueError: the model has non-finite weights: bias holds NaN or inf
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for n, t in tensors:
        if t.device.type == "meta":
            raise ValueError(
                f"the model's weights are on the meta device (shapes without values): {n}; "
                "load or initialise them first"
            )
    named = [(n, t) for n, t in tensors if t.is_floating_point() and t.numel()]
    if all_finite([t for _, t in named]):
        return
    name = next(n for n, t in named if not bool(torch.isfinite(t.detach()).all()))
    raise ValueError(f"the model has non-finite weights: {name} holds NaN or inf")


def check_file(
    path: object, name: str = "path", *, must_exist: bool = True, hint: str = ""
) -> Path:
    """``path`` as a ``Path`` to a readable regular file, or an error that says what it is instead.

    A missing file is ``FileNotFoundError`` ("does not exist"), a directory or another non-file
    ``ValueError``, a file this process may not read ``PermissionError``; a path that is neither a
    str nor an ``os.PathLike`` is ``ValueError`` naming ``name``. With ``must_exist=False`` a
    missing file is accepted (a file about to be written); what exists must still be a file.
    ``hint`` (how to make the file, say) ends the message of a missing file.

    >>> check_file(".")
    Traceback (most recent call last):
    ...
    ValueError: . is a directory, not a file
    """
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{name} must be a str or a path, got {type(path).__name__}")
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not must_exist:
            return path
        raise FileNotFoundError(f"{path} does not exist" + (f"; {hint}" if hint else "")) from None
    except NotADirectoryError:
        raise FileNotFoundError(
            f"{path} does not exist (a part of it is a file, not a folder)"
        ) from None
    except PermissionError:
        raise PermissionError(f"{path} cannot be read: no permission to reach it") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file")
    if must_exist and not os.access(path, os.R_OK):
        raise PermissionError(f"{path} cannot be read (mode {stat.S_IMODE(st.st_mode):o})")
    return path


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
    seed = check_int("seed", seed, lo=0)  # NumPy's ints too, as np.random.seed takes them
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    return torch.Generator().manual_seed(seed)


def _stale_temp_files(path: Path) -> list[Path]:
    """Temporary files of earlier :func:`atomic_write` calls for ``path`` whose process has died."""
    if os.name != "posix":  # liveness is asked with signal 0, which is POSIX only
        return []
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d+)-[a-z0-9_]{8}\.tmp")
    stale = []
    for entry in path.parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            stale.append(entry)
        except (PermissionError, OverflowError):
            pass  # another user's live process (or no such pid): leave it
    return stale


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then a rename.

    A reader never sees a half-written file, and a crash leaves the old file intact. Decisions:

    * the file is flushed to disk before the rename and the folder after it, so that once this
      returns the new contents survive a power failure;
    * a new file gets the permissions ``open(path, "w")`` would give it; a file that exists keeps
      its permission bits; a write-protected one (no write bit, or not writable by this process) is
      refused with ``PermissionError`` and left as it is, as ``open(path, "w")`` refuses it;
    * a symbolic link stays a link: its target is replaced (``open`` writes through links too);
    * temporary files that an earlier, killed write of the same file left behind (their process is
      gone) are removed.

    Returns ``path``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise ValueError(f"data must be bytes or str, got {type(data).__name__}")
    given = Path(path)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = os.stat(target)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    else:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{given} exists and is not a regular file")
        if not st.st_mode & 0o222 or not os.access(target, os.W_OK):
            raise PermissionError(
                f"{given} is write-protected (mode {stat.S_IMODE(st.st_mode):o}); not replaced"
            )
        mode = stat.S_IMODE(st.st_mode)
    for old in _stale_temp_files(target):
        old.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}-", suffix=".tmp", dir=target.parent
    )
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_directory(target.parent)
    return given


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; elsewhere a no-op)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
