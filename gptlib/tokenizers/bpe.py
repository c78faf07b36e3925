"""Byte-level BPE as in GPT-2: training, encoding by lowest-rank merges, files, and tiktoken as a peer.

A byte-level BPE is stored as its *ranks*: every token's byte string with its id. Encoding a
pre-tokenized chunk starts from its bytes and repeatedly merges the adjacent pair whose
concatenation has the lowest rank, until no adjacent pair is a token. This is exactly what
tiktoken does, so :meth:`BPETokenizer.to_tiktoken` gives a peer that must agree with us.

GPT-2's own ranks come from a registry package at install time (:mod:`gptlib.assets`).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import regex
import tiktoken

from ..assets import asset_path
from .base import _check_ids, _read_json, _write_json

__all__ = ["GPT2_SPLIT_PATTERN", "get_stats", "merge", "merge_steps", "BPETokenizer", "gpt2_tokenizer"]

#: GPT-2's pre-tokenizer: contractions, runs of letters, of digits, of other symbols (each with an
#: optional leading space), and whitespace. BPE merges never cross these chunk boundaries.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"


# --- the two small operations of BPE ----------------------------------------------------------
def get_stats(ids: Sequence[int], counts: dict | None = None) -> dict[tuple[int, int], int]:
    """Counts of adjacent pairs in ``ids`` (added into ``counts`` if given).

    >>> get_stats([1, 2, 3, 1, 2])
    {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    """
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids: Sequence[int], pair: tuple[int, int], idx: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``idx``, left to right, without overlaps.

    >>> merge([1, 2, 3, 1, 2], (1, 2), 4)
    [4, 3, 4]
    >>> merge([1, 1, 1], (1, 1), 9)
    [9, 1]
    """
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(idx)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_steps(parts: list[bytes], ranks: dict[bytes, int], limit: int | None = None) -> Iterator[tuple[int, int]]:
    """The lowest-rank merge loop of BPE encoding, one step at a time, editing ``parts`` in place.

    Each step finds the adjacent pair whose concatenation has the lowest rank below ``limit``
    (default: all ranks; ties: the leftmost), yields ``(rank, i)`` for the pair at ``parts[i]``,
    ``parts[i + 1]``, and merges it when resumed. It stops when no adjacent pair is a token.

    >>> parts = [b"a", b"b", b"b"]
    >>> list(merge_steps(parts, {b"a": 0, b"b": 1, b"ab": 2, b"abb": 3}))
    [(2, 0), (3, 0)]
    >>> parts
    [b'abb']
    """
    limit = len(ranks) if limit is None else limit
    rank_of = ranks.get  # bound once: this loop is the encoder's hot path
    while len(parts) > 1:
        best, best_i = limit, -1
        for i in range(len(parts) - 1):
            r = rank_of(parts[i] + parts[i + 1], limit)
            if r < best:
                best, best_i = r, i
        if best_i < 0:
            return
        yield best, best_i
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]


# --- byte-level BPE ---------------------------------------------------------------------------
class BPETokenizer:
    """Byte-level BPE given by its ranks (token bytes -> id), a split pattern and special tokens.

    Ids 0..255 are the single bytes (trained tokenizers: id b is byte b; GPT-2 orders them
    differently); each merge adds one id. ``merges[k]`` is the pair of ids
    whose concatenation became token ``256 + k`` (for GPT-2's ranks the pairs are recovered).
    """

    FORMAT = "gptlib-bpe"

    def __init__(
        self,
        ranks: dict[bytes, int],
        pattern: str = GPT2_SPLIT_PATTERN,
        special_tokens: dict[str, int] | None = None,
        name: str = "gptlib-bpe",
    ):
        n = len(ranks)
        if sorted(ranks.values()) != list(range(n)):
            raise ValueError("ranks must map token bytes to the ids 0..len(ranks)-1, each once")
        if n < 256 or sorted(ranks.get(bytes([b]), n) for b in range(256)) != list(range(256)):
            raise ValueError("ranks must give the 256 single bytes the ids 0..255 (in any order)")
        special_tokens = dict(special_tokens or {})
        for s, i in special_tokens.items():
            if i < n or i in ranks.values():
                raise ValueError(f"special token {s!r} has id {i}, which collides with an ordinary token")
        if len(set(special_tokens.values())) != len(special_tokens):
            raise ValueError("special_tokens must have distinct ids")
        self.ranks = dict(ranks)
        self.pattern = pattern
        self._split = regex.compile(pattern)
        self.special_tokens = special_tokens
        self.name = name
        self.vocab: dict[int, bytes] = {i: b for b, i in ranks.items()}
        self.vocab.update({i: s.encode("utf-8") for s, i in special_tokens.items()})
        self._special_split = (
            regex.compile("(" + "|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True)) + ")")
            if special_tokens else None
        )
        self._cache: dict[bytes, tuple[int, ...]] = {}
        self._merges: list[tuple[int, int]] | None = None

    # -- sizes and views --
    @property
    def vocab_size(self) -> int:
        """Ordinary tokens plus special tokens (ids run up to ``vocab_size - 1``)."""
        return max(self.vocab) + 1

    @property
    def merges(self) -> list[tuple[int, int]]:
        """For each merged token 256, 257, …: the pair of earlier tokens it is the merge of."""
        if self._merges is None:
            self._merges = [self._split_token(self.vocab[i], i) for i in range(256, len(self.ranks))]
        return self._merges

    def _split_token(self, token: bytes, rank: int) -> tuple[int, int]:
        # Encoding the token's bytes with the ranks below its own stops one merge short: two parts.
        parts = self._bpe(token, max_rank=rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (id {rank}) is not the merge of two earlier tokens")
        return parts[0], parts[1]

    def token_bytes(self, i: int) -> bytes:
        return self.vocab[_check_ids([i], self.vocab_size)[0]]

    def token_str(self, i: int) -> str:
        """A token as text (bytes that are not valid UTF-8 on their own show as U+FFFD)."""
        return self.token_bytes(i).decode("utf-8", errors="replace")

    # -- encoding --
    def _bpe(self, piece: bytes, max_rank: int | None = None) -> list[int]:
        """Merge the lowest-ranked adjacent pair until none is a token (ranks < max_rank only)."""
        parts = [bytes([b]) for b in piece]
        for _ in merge_steps(parts, self.ranks, max_rank):
            pass
        return [self.ranks[p] for p in parts]

    def _encode_chunk(self, chunk: bytes) -> tuple[int, ...]:
        ids = self._cache.get(chunk)
        if ids is None:
            ids = self.ranks.get(chunk)
            ids = (ids,) if ids is not None else tuple(self._bpe(chunk))
            if len(self._cache) < 500_000:
                self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` treating special-token strings as ordinary text."""
        out: list[int] = []
        for chunk in self._split.findall(text):
            out.extend(self._encode_chunk(chunk.encode("utf-8")))
        return out

    def encode(self, text: str, allowed_special: str | set[str] = frozenset()) -> list[int]:
        """Text -> token ids. Special tokens are recognised only if listed in ``allowed_special``
        (or ``"all"``); otherwise their text is encoded like any other text.

        >>> tok = BPETokenizer.train("aaabdaaabac", 259, special_tokens=())
        >>> tok.encode("aaabdaaabac")
        [258, 100, 258, 97, 99]
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(f"allowed_special names unknown special tokens {sorted(unknown)}")
        if not allowed or self._special_split is None:
            return self.encode_ordinary(text)
        out: list[int] = []
        for part in self._special_split.split(text):
            if part in allowed:
                out.append(self.special_tokens[part])
            elif part:
                out.extend(self.encode_ordinary(part))
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        try:
            return b"".join(self.vocab[i] for i in ids)
        except (KeyError, TypeError):
            _check_ids(ids, self.vocab_size)
            raise ValueError(f"ids contain an id that is not a token of this vocabulary: {ids}") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text. Byte sequences that are not valid UTF-8 become U+FFFD, never an error."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def merge_trace(self, text: str) -> tuple[list[list[str]], list[str]]:
        """How ``text`` is split after each merge that fires on it, for the BPE widget.

        Returns ``(steps, labels)``: ``steps[0]`` is one piece per byte, ``steps[k]`` the pieces
        after k merges (the lowest-ranked available merge first), ``labels[k-1]`` names merge k.
        The last step equals :meth:`encode_ordinary`.
        """
        chunks = [[bytes([b]) for b in c.encode("utf-8")] for c in self._split.findall(text)]
        show = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
        steps = [[show(p) for c in chunks for p in c]]
        labels = []
        # Each chunk merges on its own; across chunks, the pending merge of lowest rank goes first.
        walkers = [merge_steps(c, self.ranks) for c in chunks]
        pending = [next(w, None) for w in walkers]  # per chunk: (rank, i) of its next merge, or None
        while any(pending):
            r, ci, i = min((p[0], ci, p[1]) for ci, p in enumerate(pending) if p is not None)
            c = chunks[ci]
            labels.append(f"{show(c[i])!r} + {show(c[i + 1])!r} -> {show(c[i] + c[i + 1])!r}  (token {r})")
            pending[ci] = next(walkers[ci], None)  # merges the pair, then finds the chunk's next one
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
    ) -> "BPETokenizer":
        """Learn ``vocab_size - len(special_tokens) - 256`` merges from ``text``.

        Each step merges the most frequent adjacent pair (ties: the smallest pair of ids), counted
        over the distinct pre-tokenized chunks weighted by their frequency. Pair counts are updated
        incrementally: a merge touches only the chunks that contain the merged pair.
        """
        special_tokens = list(special_tokens)
        if not isinstance(vocab_size, int) or vocab_size < 256 + len(special_tokens):
            raise ValueError(f"vocab_size must be an int >= 256 + {len(special_tokens)} special tokens, got {vocab_size!r}")
        if len(set(special_tokens)) != len(special_tokens) or any(not s for s in special_tokens):
            raise ValueError("special_tokens must be distinct non-empty strings")
        n_merges = vocab_size - 256 - len(special_tokens)
        split = regex.compile(pattern)
        freq = Counter(split.findall(text))
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
        first_special = len(ranks)
        specials = {s: first_special + k for k, s in enumerate(special_tokens)}
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
            "tokens": [base64.b64encode(self.vocab[i]).decode("ascii") for i in range(len(self.ranks))],
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as JSON (atomically)."""
        return _write_json(path, self.FORMAT, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BPETokenizer":
        """Read a tokenizer written by :meth:`save`; a corrupt file fails naming what is wrong."""
        d = _read_json(path, cls.FORMAT, ["pattern", "tokens", "special_tokens"])
        try:
            ranks = {base64.b64decode(t, validate=True): i for i, t in enumerate(d["tokens"])}
        except (binascii.Error, TypeError, ValueError):
            raise ValueError(f"{path}: field 'tokens' holds an entry that is not base64") from None
        if len(ranks) != len(d["tokens"]):
            raise ValueError(f"{path}: field 'tokens' lists the same bytes twice")
        try:
            return cls(ranks, d["pattern"], d["special_tokens"], d.get("name", "gptlib-bpe"))
        except (ValueError, regex.error) as e:
            raise ValueError(f"{path}: {e}") from None

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
