"""Byte-level BPE as in GPT-2: training, encoding by lowest-rank merges, files, and tiktoken as a
peer.

A byte-level BPE is stored as its *ranks*: every token's byte string with its id. Encoding a
pre-tokenized piece starts from its bytes and repeatedly merges the adjacent pair whose
concatenation has the lowest rank, until no adjacent pair is a token. This is exactly what
tiktoken does, so :meth:`BPETokenizer.to_tiktoken` gives a peer that must agree with us.

The merge loop itself, readable (:func:`~gptlib.tokenizers.merges.merge_steps`) and fast
(:func:`~gptlib.tokenizers.merges.encode_piece`), is in :mod:`gptlib.tokenizers.merges`.

GPT-2's own ranks come from a registry package at install time (:mod:`gptlib.assets`).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import regex
import tiktoken

from ..assets import asset_path
from ..runtime import check_int
from .base import (
    _PROBE,
    _check_ranks,
    _check_special_tokens,
    _check_strings,
    _read_json,
    _write_json,
    as_ids,
    check_text,
    compile_pattern,
    split_pieces,
    token_text,
)
from .merges import encode_piece, merge, merge_steps

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "BPETokenizer",
    "gpt2_tokenizer",
    "bytes_to_unicode",
]

#: GPT-2's pre-tokenizer: contractions, runs of letters, of digits, of other symbols (each with an
#: optional leading space), and whitespace. BPE merges never cross these chunk boundaries.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet of byte-level token strings (GGUF
    files, Hugging Face's tokenizer.json): printable Latin-1 bytes stand for themselves, the others
    for U+0100, U+0101, ... in byte order (so " " is "Ġ", "\\n" is "Ċ").

    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], table[ord("\\n")], table[0], len(set(table.values()))
    ('a', 'Ġ', 'Ċ', 'Ā', 256)
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 256
    for b in range(256):
        if b not in table:
            table[b] = chr(extra)
            extra += 1
    return table


# --- byte-level BPE ---------------------------------------------------------------------------
class BPETokenizer:
    """Byte-level BPE given by its ranks (token bytes -> id), a split pattern and special tokens.

    Ids 0..255 are the single bytes (trained tokenizers: id b is byte b; GPT-2 orders them
    differently); each merge adds one id; the special tokens take the ids after the ordinary ones,
    so every id below ``vocab_size`` is a token. ``merges[k]`` is the pair of ids whose
    concatenation became token ``256 + k`` (for GPT-2's ranks the pairs are recovered).

    ``decode(encode(text)) == text`` for every ``str`` without lone surrogates (which UTF-8
    cannot write; they are refused). The split pattern must cover its input: a pattern that leaves
    a character in no piece is refused when the tokenizer is made (on a probe text) and when a
    text is encoded, instead of silently dropping the character.
    """

    FORMAT = "gptlib-bpe"

    def __init__(
        self,
        ranks: dict[bytes, int],
        pattern: str = GPT2_SPLIT_PATTERN,
        special_tokens: dict[str, int] | None = None,
        name: str = "gptlib-bpe",
    ):
        self.ranks = _check_ranks(ranks)
        self.special_tokens = _check_special_tokens(
            {} if special_tokens is None else special_tokens, len(self.ranks)
        )
        self._split = compile_pattern(pattern)
        split_pieces(
            self._split, _PROBE
        )  # a pattern that loses text fails now, not on some later text
        if not isinstance(name, str):
            raise ValueError(f"name must be a str, got {name!r}")
        self.pattern, self.name = pattern, name
        self.vocab: dict[int, bytes] = {i: b for b, i in self.ranks.items()}
        self.vocab.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
        longest_first = sorted(self.special_tokens, key=len, reverse=True)
        self._special_split = regex.compile("(" + "|".join(map(regex.escape, longest_first)) + ")")
        self._cache: dict[str, tuple[int, ...]] = {}  # piece -> its ids (short pieces only)
        self._merges: list[tuple[int, int]] | None = None
        self._bpe: tiktoken.Encoding | None = None  # the merges in compiled code, made when used

    # -- sizes and views --
    @property
    def vocab_size(self) -> int:
        """Ordinary tokens plus special tokens (the ids are 0 .. ``vocab_size - 1``)."""
        return len(self.vocab)

    @property
    def merges(self) -> list[tuple[int, int]]:
        """For each merged token 256, 257, …: the pair of earlier tokens it is the merge of."""
        if self._merges is None:
            self._merges = [
                self._split_token(self.vocab[i], i) for i in range(256, len(self.ranks))
            ]
        return self._merges

    def _split_token(self, token: bytes, rank: int) -> tuple[int, int]:
        # Encoding the token's bytes with the ranks below its own stops one merge short: two parts.
        parts = encode_piece(token, self.ranks, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (id {rank}) is not the merge of two earlier tokens")
        return parts[0], parts[1]

    def token_bytes(self, i: int) -> bytes:
        return self.vocab[check_int("i", i, 0, self.vocab_size - 1)]

    def token_str(self, i: int) -> str:
        """A token as text: bytes that are not valid UTF-8 on their own show as ``<0xNN>``
        (:func:`gptlib.tokenizers.base.token_text`, the rule every widget follows)."""
        return token_text(self.token_bytes(i))

    # -- encoding --
    def split(self, text: str) -> list[str]:
        """The pieces the split pattern cuts ``text`` into (merges never cross them); they
        concatenate to ``text``.

        >>> BPETokenizer.train("aaabdaaabac", 259, special_tokens=()).split("It's 3 cats")
        ['It', "'s", ' 3', ' cats']
        """
        return split_pieces(self._split, check_text(text, utf8=True))

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        """The ids of one piece of the split, kept in the cache if it is short.

        The merges of :func:`~gptlib.tokenizers.merges.encode_piece` (lowest rank first, the
        leftmost among equals) are run by tiktoken's compiled code on the same ranks, which picks
        the same pair at every step: the same ids, several times faster on a piece met for the
        first time (``tests/test_tokenizers_fuzz.py`` compares the two on fuzzed texts).
        """
        chunk = piece.encode("utf-8")
        ids = self.ranks.get(chunk)
        if ids is not None:
            ids = (ids,)
        else:
            if self._bpe is None:  # its pattern takes the whole piece: no second split
                self._bpe = tiktoken.Encoding(
                    name=self.name,
                    pat_str=r"(?s).+",
                    mergeable_ranks=self.ranks,
                    special_tokens={},
                )
            ids = tuple(self._bpe.encode_ordinary(piece))  # the whole piece, one match
        if len(chunk) <= 64 and len(self._cache) < 500_000:  # (long pieces are rare: not kept)
            self._cache[piece] = ids
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        # Most pieces of a long text recur: the cache is read by the piece itself (its UTF-8
        # bytes are made only for a piece met for the first time).
        out: list[int] = []
        extend, cached, encode = out.extend, self._cache.get, self._encode_piece
        for piece in split_pieces(self._split, text):
            ids = cached(piece)
            extend(encode(piece) if ids is None else ids)
        return out

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` treating special-token strings as ordinary text."""
        return self._encode_ordinary(check_text(text, utf8=True))

    def encode(self, text: str, allowed_special: str | set[str] = frozenset()) -> list[int]:
        """Text -> token ids. Special tokens are recognised only if listed in ``allowed_special``
        (or ``"all"``); otherwise their text is encoded like any other text.

        >>> tok = BPETokenizer.train("aaabdaaabac", 259, special_tokens=())
        >>> tok.encode("aaabdaaabac")
        [258, 100, 258, 97, 99]
        """
        check_text(text, utf8=True)
        allowed = self._allowed(allowed_special)
        if not allowed:
            return self._encode_ordinary(text)
        out: list[int] = []
        for part in self._special_split.split(text):
            if part in allowed:
                out.append(self.special_tokens[part])
            elif part:
                out.extend(self._encode_ordinary(part))
        return out

    def _allowed(self, allowed_special: object) -> set[str]:
        if allowed_special == "all":
            return set(self.special_tokens)
        if isinstance(allowed_special, str) or not hasattr(allowed_special, "__iter__"):
            raise ValueError(
                f'allowed_special must be "all" or a set of special tokens, got {allowed_special!r}'
            )
        allowed = set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(
                f"allowed_special names unknown special tokens {sorted(map(repr, unknown))}"
            )
        return allowed

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Token ids (ints in [0, vocab_size): a list, an iterator or a 1-D tensor) -> their
        bytes."""
        return b"".join(map(self.vocab.__getitem__, as_ids(ids, self.vocab_size)))

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text. Byte sequences that are not valid UTF-8 become U+FFFD, never an
        error."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def merge_trace(self, text: str) -> tuple[list[list[str]], list[str]]:
        """How ``text`` is split after each merge that fires on it, for the BPE widget.

        Returns ``(steps, labels)``: ``steps[0]`` is one piece per byte, ``steps[k]`` the pieces
        after k merges (the lowest-ranked available merge first), ``labels[k-1]`` names merge k.
        The last step equals :meth:`encode_ordinary`. It runs the readable :func:`merge_steps`,
        O(n²) per piece of n bytes: meant for a sentence.
        """
        chunks = [[bytes([b]) for b in c.encode("utf-8")] for c in self.split(text)]
        show = token_text  # a byte outside a whole character as <0xNN>
        steps = [[show(p) for c in chunks for p in c]]
        labels = []
        # Each chunk merges on its own; across chunks, the pending merge of lowest rank goes first.
        walkers = [merge_steps(c, self.ranks) for c in chunks]
        pending = [
            next(w, None) for w in walkers
        ]  # per chunk: (rank, i) of its next merge, or None
        while any(pending):
            r, ci, i = min((p[0], ci, p[1]) for ci, p in enumerate(pending) if p is not None)
            c = chunks[ci]
            labels.append(
                f"{show(c[i])!r} + {show(c[i + 1])!r} -> {show(c[i] + c[i + 1])!r}  (token {r})"
            )
            pending[ci] = next(
                walkers[ci], None
            )  # merges the pair, then finds the chunk's next one
            steps.append([show(p) for c in chunks for p in c])
        return steps, labels

    # -- training --
    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str = GPT2_SPLIT_PATTERN,
        special_tokens: Sequence[str] = (ENDOFTEXT,),
    ) -> BPETokenizer:
        """Learn ``vocab_size - len(special_tokens) - 256`` merges from ``text``.

        Each step merges the most frequent adjacent pair (ties: the smallest pair of ids), counted
        over the distinct pre-tokenized chunks weighted by their frequency. Pair counts are updated
        incrementally: a merge touches only the chunks that contain the merged pair. A text too
        short for that many merges (every chunk already one token) gives a smaller vocabulary, with
        a ``UserWarning`` that says so: ``vocab_size`` is then less than asked for.
        """
        check_text(text, utf8=True)
        if isinstance(special_tokens, str):
            raise ValueError(
                f"special_tokens must be a list of strings, got the str {special_tokens!r}"
            )
        special_tokens = list(special_tokens)
        _check_strings("special_tokens", special_tokens)
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"special_tokens must be distinct, got {special_tokens}")
        vocab_size = check_int("vocab_size", vocab_size, lo=256 + len(special_tokens))
        n_merges = vocab_size - 256 - len(special_tokens)
        split = compile_pattern(pattern)
        split_pieces(split, _PROBE)
        freq = Counter(split_pieces(split, text))
        words = [list(w.encode("utf-8")) for w in freq]
        counts = list(freq.values())
        pair_count: dict[tuple[int, int], int] = defaultdict(int)
        where: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi, w in enumerate(words):
            for pair in zip(w, w[1:]):
                pair_count[pair] += counts[wi]
                where[pair].add(wi)
        heap = [(-c, p) for p, c in pair_count.items()]
        heapq.heapify(heap)
        vocab = {i: bytes([i]) for i in range(256)}
        ranks = {bytes([i]): i for i in range(256)}
        while len(ranks) < 256 + n_merges and heap:
            neg, pair = heapq.heappop(heap)
            if pair_count.get(pair, 0) != -neg or neg == 0:
                continue  # stale heap entry
            merged = vocab[pair[0]] + vocab[pair[1]]
            new_id = ranks.get(merged)
            if new_id is None:  # a new token (the same bytes may already exist via another pair)
                new_id = len(ranks)
                ranks[merged], vocab[new_id] = new_id, merged
            changed: dict[tuple[int, int], int] = defaultdict(int)
            for wi in list(where[pair]):
                w, c = words[wi], counts[wi]
                for p in zip(w, w[1:]):
                    changed[p] -= c
                    where[p].discard(wi)
                w = words[wi] = merge(w, pair, new_id)
                for p in zip(w, w[1:]):
                    changed[p] += c
                    where[p].add(wi)
            for p, d in changed.items():
                if d:
                    pair_count[p] += d
                    if pair_count[p] > 0:
                        heapq.heappush(heap, (-pair_count[p], p))
                    else:
                        del pair_count[p]
        if len(ranks) < 256 + n_merges:
            warnings.warn(
                f"vocab_size={vocab_size} asked for, but the text allows only {len(ranks) - 256} "
                "merges: "
                f"the tokenizer has {len(ranks) + len(special_tokens)} tokens",
                UserWarning,
                stacklevel=2,
            )
        specials = {s: len(ranks) + k for k, s in enumerate(special_tokens)}
        return cls(ranks, pattern, specials)

    # -- files --
    def to_dict(self) -> dict:
        return {
            "format": self.FORMAT,
            "version": 1,
            "name": self.name,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            # ranks in id order, each token's bytes in base64 (the tiktoken file format, as JSON)
            "tokens": [
                base64.b64encode(self.vocab[i]).decode("ascii") for i in range(len(self.ranks))
            ],
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as JSON (atomically)."""
        return _write_json(path, self.FORMAT, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`; a corrupt file fails naming the file and the
        field.

        Beyond the types of the fields: the tokens are distinct, the 256 bytes come first, every
        later token is the merge of two earlier ones, the special tokens take the ids after them,
        and the pattern is a regular expression that covers its input.
        """
        d = _read_json(path, cls.FORMAT, {"pattern": str, "tokens": list, "special_tokens": dict})
        name = d.get("name", "gptlib-bpe")
        try:
            ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(d["tokens"])}
        except (binascii.Error, TypeError, ValueError):
            raise ValueError(f"{path}: field 'tokens' holds an entry that is not base64") from None
        if len(ranks) != len(d["tokens"]):
            raise ValueError(f"{path}: field 'tokens' lists the same bytes twice")
        if not isinstance(name, str):
            raise ValueError(f"{path}: field 'name' must be a JSON string, got {name!r}")
        for field, check in [
            ("tokens", lambda: _check_ranks(ranks)),
            ("pattern", lambda: split_pieces(compile_pattern(d["pattern"]), _PROBE)),
            ("special_tokens", lambda: _check_special_tokens(d["special_tokens"], len(ranks))),
        ]:
            try:
                check()
            except ValueError as e:
                raise ValueError(f"{path}: field {field!r}: {e}") from None
        tok = cls(ranks, d["pattern"], d["special_tokens"], name)
        try:
            tok.merges  # noqa: B018 (a token no merge makes can never be produced by encoding)
        except ValueError as e:
            raise ValueError(f"{path}: field 'tokens': {e}") from None
        return tok

    # -- tiktoken, the peer --
    def to_tiktoken(self) -> tiktoken.Encoding:
        """A ``tiktoken.Encoding`` with the same ranks, pattern and special tokens."""
        return tiktoken.Encoding(
            name=self.name,
            pat_str=self.pattern,
            mergeable_ranks=dict(self.ranks),
            special_tokens=dict(self.special_tokens),
        )


# --- GPT-2's tokenizer, offline ----------------------------------------------------------------
def gpt2_tokenizer() -> BPETokenizer:
    """The real GPT-2 tokenizer: 50,257 tokens, ``<|endoftext|>`` = 50256, GPT-2's split pattern.

    Reads the ranks fetched by ``python -m gptlib.assets fetch gpt2-ranks`` (``make`` runs it);
    :func:`gptlib.assets.asset_path` checks their sha256 every time.
    """
    data = asset_path("gpt2-ranks").read_bytes()

    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return BPETokenizer(ranks, GPT2_SPLIT_PATTERN, {ENDOFTEXT: 50256}, name="gpt2")
