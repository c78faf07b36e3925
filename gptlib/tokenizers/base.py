"""The tokenizer ladder's base: the :class:`Tokenizer` protocol and the JSON files all tokenizers share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

from ..runtime import atomic_write

__all__ = ["Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer of the book offers.

    ``decode(encode(text)) == text`` for :class:`CharTokenizer` (on texts over its alphabet) and
    :class:`BPETokenizer` (on every text); :class:`WordTokenizer` loses whitespace and unknown words.
    """

    @property
    def vocab_size(self) -> int: ...

    @classmethod
    def train(cls, text: str, *args, **kwargs) -> "Tokenizer": ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, path: str | os.PathLike) -> Path: ...

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer": ...


def _write_json(path: str | os.PathLike, fmt: str, fields: dict) -> Path:
    """Write ``fields`` tagged with ``format`` and ``version`` as JSON, atomically."""
    d = {"format": fmt, "version": 1, **fields}
    return atomic_write(path, json.dumps(d, indent=0, ensure_ascii=True) + "\n")


def _read_json(path: str | os.PathLike, fmt: str, fields: Sequence[str]) -> dict:
    """Read a file written by :func:`_write_json`; fail naming what is wrong with it."""
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise ValueError(f"{path} is not a {fmt} tokenizer file (format field missing or wrong)")
    if d.get("version") != 1:
        raise ValueError(f"{path} has unsupported version {d.get('version')!r}")
    for key in fields:
        if key not in d:
            raise ValueError(f"{path} lacks the field {key!r}")
    return d


def _check_ids(ids: Iterable[int], size: int) -> list[int]:
    ids = list(ids)
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < size:
            raise ValueError(f"ids must be ints in [0, {size}), got {i!r}")
    return ids
