"""The tokenizer ladder's base: the :class:`Tokenizer` protocol, the checks of texts and ids, the
split
of a text into pieces by a pattern, and the JSON files all tokenizers share."""

from __future__ import annotations

import codecs
import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import regex
import torch

from ..runtime import atomic_write, check_file, check_ids, check_int

__all__ = ["Tokenizer", "token_text", "token_label", "text_bytes"]


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer of the book offers.

    ``decode(encode(text)) == text`` for :class:`CharTokenizer` (on texts over its alphabet) and
    :class:`BPETokenizer` (on every text that UTF-8 can write, i.e. without lone surrogates);
    :class:`WordTokenizer` loses whitespace and unknown words. Every id ``0 <= i < vocab_size``
    is a token, and ``decode`` refuses anything else (bools, floats, ids out of range).
    """

    @property
    def vocab_size(self) -> int: ...

    @classmethod
    def train(cls, text: str, *args, **kwargs) -> Tokenizer: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, path: str | os.PathLike) -> Path: ...

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer: ...


def check_text(text: object, name: str = "text", utf8: bool = False) -> str:
    """Return ``text`` if it is a ``str`` (with ``utf8``: one UTF-8 can write); else ``ValueError``.

    A Python ``str`` may hold lone surrogates (U+D800 to U+DFFF), which have no UTF-8 bytes, so a
    byte-level tokenizer cannot encode them. tiktoken replaces them by U+FFFD, which breaks
    ``decode(encode(text)) == text``; the book's byte-level BPE refuses them instead.

    >>> check_text("a\\ud800b", utf8=True)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: text must be valid Unicode: the lone surrogate '\\ud800' at position 1 has no
    UTF-8 bytes
    """
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, got {type(text).__name__}")
    if utf8:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{name} must be valid Unicode: the lone surrogate {text[e.start]!r} at position "
                f"{e.start} has no UTF-8 bytes"
            ) from None
    return text


# --- how a token is shown: the book's one rule (gptlib/widgets/js/dom.js has its twin) ---------
# A token is a string of bytes, and a byte-level tokenizer's tokens need not be whole UTF-8
# characters: 128 of GPT-2's 256 byte tokens are not text on their own. ``token_text`` decodes a
# token's bytes and writes each byte that is not part of a valid UTF-8 character as ``<0xNN>``
# (Python's "maximal subpart" rule: the same bytes a U+FFFD would replace); ``token_label`` then
# makes the invisible visible: a space as "␣", a newline as "↵", a tab as "⇥", any other
# control character as the ``<0xNN>`` of its UTF-8 bytes. dom.js's ``bytesText`` and ``show`` are
# the same two functions (a node test compares them on every byte and on random strings).
def _byte_labels(err: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end


codecs.register_error("gptlib.byte_labels", _byte_labels)
_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5"}
_BYTE_LABEL = regex.compile(r"<0x([0-9A-F]{2})>")


def token_text(token: bytes) -> str:
    r"""A token's bytes as text: UTF-8, each byte outside a valid character written ``<0xNN>``.

    >>> token_text(b" caf\xc3\xa9"), token_text(b"\xe2\x80"), token_text(b"\xa9 ok")
    (' café', '<0xE2><0x80>', '<0xA9> ok')
    """
    return bytes(token).decode("utf-8", errors="gptlib.byte_labels")


def token_label(text: str) -> str:
    r"""``text`` (a token's :func:`token_text`) made visible: spaces "␣", newlines "↵", tabs
    "⇥", other control characters as the ``<0xNN>`` of their UTF-8 bytes.

    >>> token_label(" the\n\t\x00\x85")
    '␣the↵⇥<0x00><0xC2><0x85>'
    """
    return "".join(
        _VISIBLE.get(c)
        or (
            "".join(f"<0x{b:02X}>" for b in c.encode("utf-8"))
            if unicodedata.category(c) == "Cc"
            else c
        )
        for c in text
    )


def text_bytes(text: str) -> bytes:
    """The bytes a :func:`token_text` stands for (``<0xNN>`` read back as the byte).

    >>> text_bytes("<0xC3>" + "<0xA9>") == "é".encode()
    True
    """
    return b"".join(
        bytes([int(m, 16)]) if k % 2 else m.encode("utf-8")
        for k, m in enumerate(_BYTE_LABEL.split(text))
    )


def as_ids(ids: object, size: int, name: str = "ids") -> list[int]:
    """``ids`` (a sequence or iterator of ints, or a 1-D integer tensor) as a list of Python ints in
    [0, size); bools, floats and ids out of range are a ``ValueError`` naming ``name``.

    >>> as_ids(torch.tensor([2, 0]), 3)
    [2, 0]
    >>> as_ids([1.0], 3)
    Traceback (most recent call last):
    ...
    ValueError: ids must be ints in [0, 3), got 1.0 at position 0
    """
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(
                f"{name} must be one sequence of ids (a 1-D tensor), got shape {tuple(ids.shape)}"
            )
        check_ids(ids, size, name)
        return ids.tolist()
    if isinstance(ids, dict) or (
        not isinstance(ids, (str, bytes)) and not hasattr(ids, "__iter__")
    ):
        raise ValueError(
            f"{name} must be a sequence of ints or a 1-D tensor, got {type(ids).__name__}"
        )
    if not isinstance(ids, (str, bytes)):
        try:
            ids = list(ids)  # an iterator is read once, here
        except TypeError:  # (a 0-d numpy array)
            raise ValueError(
                f"{name} must be a sequence of ints or a 1-D tensor, got {ids!r}"
            ) from None
    check_ids(ids, size, name)  # (str and bytes are refused here)
    return [int(i) for i in ids]  # type: ignore[union-attr]


# --- pre-tokenization: the split of a text into pieces ---------------------------------------
# Which characters are letters (\p{L}) or numbers (\p{N}) depends on the Unicode version. The
# regex module knows Unicode 18.0; tiktoken's tables are Unicode 16.0 (Python 3.11's own
# unicodedata is 14.0). To split as tiktoken does, a pattern reads every code point assigned
# after 16.0 (the ranges below: what the regex module assigns and tiktoken does not; a test
# compares the two on every code point) as U+FDD0, a code point unassigned in every version. So
# "\U00032628're" is a symbol run then "re" for both, not a letter then the contraction "'re".
_AFTER_UNICODE_16 = """
    558 58B-58C 5C8-5C9 88F B53-B54 C5C CDC 1ACF-1AF0 208F 209D-209F 20C1-20C4 2B96
    2E60-2E63 A7CE-A7CF A7D2 A7D4 A7DD A7E2 A7F1 AB6C-AB6D FBC3-FBD2 FD90-FD91
    FDC8-FDCE 107BB-107BF 10940-10959 10EC5-10EC7 10EC9-10EEE 10EF0-10EFB 11B0A
    11B60-11B67 11DB0-11DDB 11DE0-11DE9 11DF0-11DF1 1246F 12475-1247F 12550-12686
    16EA0-16EB8 16EBB-16ED3 16FF2-16FF6 187F8-187FF 18CD6-18CDA 18D09-18D20
    18D80-18DF2 18E00-19191 191A0-191D2 1B123-1B128 1B168 1CCFA-1CCFC 1CEBA-1CED0
    1CED2-1CED4 1CEDD-1CEFD 1D127-1D128 1D1EB-1D1FF 1D250-1D281 1D6A6 1DB00-1DB1C
    1DF1F-1DF24 1DF2B-1DF81 1DF90-1DF96 1DFCD-1DFFF 1E6C0-1E6DE 1E6E0-1E6F5
    1E6FE-1E6FF 1F1AE 1F6D8-1F6D9 1F777-1F77A 1F7DA-1F7DB 1F7F1-1F7FF 1F8D0-1F8D8
    1FA54-1FA57 1FA8A-1FA8E 1FAC8 1FACC-1FACD 1FADD 1FAEA-1FAEB 1FAEF 1FAF9-1FAFA
    1FBFA 2B73A-2B73F 2B81E 2CEA2-2CEAD 323B0-33479 3D000-3FC3F
"""
_NEWER = frozenset(
    chr(c)
    for r in _AFTER_UNICODE_16.split()
    for c in range(int(r.split("-")[0], 16), int(r.split("-")[-1], 16) + 1)
)
_AS_UNASSIGNED = dict.fromkeys(
    map(ord, _NEWER), 0xFDD0
)  # (a set test is 50x faster than a regex class)
# A text with a character of every kind a split pattern must put in some piece.
_PROBE = (
    "It's 3.14, naïve 日本語 🙂👩\u200d👧!\t \n  \r\n\x00\x7f\xa0\u2028e\u0301 "
    "\ufdd0\U000f0000 <|x|>  "
)


def compile_pattern(pattern: object) -> regex.Pattern:
    if not isinstance(pattern, str):
        raise ValueError(
            f"pattern must be a str (a regular expression), got {type(pattern).__name__}"
        )
    try:
        return regex.compile(pattern)
    except regex.error as e:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {e}") from None


def split_pieces(split: regex.Pattern, text: str) -> list[str]:
    """The pieces ``split`` cuts ``text`` into, read in Unicode 16.0; a ``ValueError`` unless they
    tile it.

    >>> split_pieces(regex.compile("[a-z]+| "), "a b")
    ['a', ' ', 'b']
    >>> split_pieces(regex.compile("[a-z]+| "), "a b!")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: pattern '[a-z]+| ' does not cover its input: '!' at position 3 is in no piece, ...
    """
    view = text if _NEWER.isdisjoint(set(text)) else text.translate(_AS_UNASSIGNED)
    if view is text and not split.groups:
        pieces = split.findall(text)
    else:  # (with groups, findall would return the groups: take the whole matches)
        pieces = [text[m.start() : m.end()] for m in split.finditer(view)]
    if sum(map(len, pieces)) != len(text):
        at = 0
        for m in split.finditer(view):
            if m.start() != at:
                break
            at = m.end()
        raise ValueError(
            f"pattern {split.pattern!r} does not cover its input: {text[at]!r} at position {at} "
            "is in no piece, so decode(encode(text)) would lose it"
        )
    return pieces


def _write_json(path: str | os.PathLike, fmt: str, fields: dict) -> Path:
    """Write ``fields`` tagged with ``format`` and ``version`` as JSON, atomically."""
    d = {"format": fmt, "version": 1, **fields}
    return atomic_write(path, json.dumps(d, indent=0, ensure_ascii=True) + "\n")


def _read_json(path: str | os.PathLike, fmt: str, fields: dict[str, type]) -> dict:
    """Read a file written by :func:`_write_json`; fail naming the file and what is wrong with it.

    ``fields`` maps each required field to the JSON type it must have (``list``, ``dict``, ``str``).
    """
    path = check_file(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise ValueError(f"{path} is not a {fmt} tokenizer file (format field missing or wrong)")
    version = d.get("version")
    if type(version) is not int or version != 1:  # (True == 1 and 1.0 == 1 in Python)
        raise ValueError(
            f"{path} has unsupported version {version!r} (this gptlib reads version 1)"
        )
    for key, kind in fields.items():
        if key not in d:
            raise ValueError(f"{path} lacks the field {key!r}")
        if not isinstance(d[key], kind):
            raise ValueError(
                f"{path}: field {key!r} must be a JSON {_JSON_NAMES[kind]}, got {d[key]!r:.60}"
            )
    return d


_JSON_NAMES = {list: "list", dict: "object", str: "string"}


def _check_strings(name: str, items: Sequence) -> None:
    """Every item must be a non-empty ``str`` that UTF-8 can write; ``ValueError`` naming
    ``name``."""
    for s in items:
        if not isinstance(s, str) or not s:
            raise ValueError(f"{name} must be non-empty strings, got {s!r}")
        check_text(s, name, utf8=True)


# --- the vocabulary of a byte-level BPE -------------------------------------------------------
def _check_ranks(ranks: object) -> dict[bytes, int]:
    if not isinstance(ranks, dict):
        raise ValueError(f"ranks must be a dict of token bytes -> id, got {type(ranks).__name__}")
    for b, i in ranks.items():
        if not isinstance(b, bytes) or not b:
            raise ValueError(f"ranks must map non-empty bytes to ids, got the key {b!r}")
        if type(i) is not int:
            check_int(
                f"ranks[{b!r}]", i
            )  # (numpy ints pass, converted below; bools and floats do not)
    ranks = {b: int(i) for b, i in ranks.items()}
    n = len(ranks)
    if sorted(ranks.values()) != list(range(n)):
        raise ValueError("ranks must map token bytes to the ids 0..len(ranks)-1, each once")
    if n < 256 or sorted(ranks.get(bytes([b]), n) for b in range(256)) != list(range(256)):
        raise ValueError("ranks must give the 256 single bytes the ids 0..255 (in any order)")
    return ranks


def _check_special_tokens(special_tokens: object, n: int) -> dict[str, int]:
    """Special tokens are non-empty strings with the ids n, n + 1, … right after the n ordinary
    tokens."""
    if not isinstance(special_tokens, dict):
        raise ValueError(
            f"special_tokens must be a dict of str -> id, got {type(special_tokens).__name__}"
        )
    _check_strings("special_tokens", list(special_tokens))
    ids = {s: check_int(f"special_tokens[{s!r}]", i) for s, i in special_tokens.items()}
    if sorted(ids.values()) != list(range(n, n + len(ids))):
        raise ValueError(
            f"special_tokens must have the ids right after the {n} ordinary tokens, "
            f"{n}..{n + len(ids) - 1} each once, got {sorted(ids.values())}"
        )
    return ids
