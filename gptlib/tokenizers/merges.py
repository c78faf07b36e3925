"""Chapter 1: the merge loop of byte-pair encoding, on ids and on bytes.

Training repeats two small operations: count the adjacent pairs (:func:`get_stats`) and replace
the most frequent pair by a new id (:func:`merge`). Encoding a pre-tokenized piece starts from its
bytes and repeatedly merges the adjacent pair whose concatenation has the lowest rank, until no
adjacent pair is a token. That loop is written twice, side by side: :func:`merge_steps` is the
readable one (scan every pair, merge the best: O(n²) for a piece of n bytes), :func:`encode_piece`
the fast one (a heap of candidate merges over a linked list of parts: O(n log n)); the tests check
that they agree. :class:`~gptlib.tokenizers.bpe.BPETokenizer` is built on them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from ..runtime import check_int

__all__ = ["get_stats", "merge", "merge_steps", "encode_piece"]


# --- the two small operations of BPE ----------------------------------------------------------
def get_stats(ids: Sequence[int], counts: dict | None = None) -> dict[tuple[int, int], int]:
    """Counts of adjacent pairs in ``ids`` (added into ``counts`` if given).

    >>> get_stats([1, 2, 3, 1, 2])
    {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    """
    if counts is not None and not isinstance(counts, dict):
        raise ValueError(f"counts must be a dict (or None), got {type(counts).__name__}")
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
    if len(pair) != 2:
        raise ValueError(f"pair must be two ids, got {pair!r}")
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(idx)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_steps(
    parts: list[bytes], ranks: dict[bytes, int], limit: int | None = None
) -> Iterator[tuple[int, int]]:
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
    if not isinstance(parts, list):
        raise ValueError(
            f"parts must be a list of bytes (merged in place), got {type(parts).__name__}"
        )
    limit = len(ranks) if limit is None else check_int("limit", limit, lo=0)
    rank_of = ranks.get
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


def encode_piece(piece: bytes, ranks: dict[bytes, int], limit: int | None = None) -> list[int]:
    """The ids of ``piece`` after the merges of :func:`merge_steps`, found in O(n log n) for n
    bytes.

    The parts form a linked list: a part is named by its first byte ``i`` and ends where the next
    one starts, ``nxt[i]``. A heap holds every adjacent pair that is a token (rank below ``limit``),
    keyed by rank and then position, so the pair it pops is the one :func:`merge_steps` picks: the
    lowest rank, the leftmost among equals. A merge changes only the pairs with the two neighbours;
    heap entries it makes stale are recognised (``pair[i]`` no longer holds their rank) and skipped.

    >>> encode_piece(b"abb", {b"a": 0, b"b": 1, b"ab": 2, b"bb": 3, b"abb": 4})
    [4]
    >>> encode_piece(b"abb", {b"a": 0, b"b": 1, b"ab": 2, b"bb": 3, b"abb": 4}, limit=4)
    [2, 1]
    """
    if not isinstance(piece, bytes):
        raise ValueError(f"piece must be bytes, got {type(piece).__name__}")
    n = len(piece)
    limit = len(ranks) if limit is None else check_int("limit", limit, lo=0)
    if n < 2:
        return [ranks[piece]] if n else []
    get = ranks.get
    nxt = list(range(1, n + 1))  # nxt[i]: where the part after the part at i starts (n: none)
    prv = list(range(-1, n - 1))  # prv[i]: where the part before it starts (-1: none)
    # pair[i]: the rank of the part at i joined with the next part (>= limit: no token; -1: no
    # part at i)
    pair = [get(piece[i : i + 2], limit) for i in range(n - 1)] + [limit]
    shift = n.bit_length()
    heap = [r << shift | i for i, r in enumerate(pair) if r < limit]  # (rank, position) in one int
    heapq.heapify(heap)
    mask, pop, push = (1 << shift) - 1, heapq.heappop, heapq.heappush
    while heap:
        key = pop(heap)
        i = key & mask
        if pair[i] != key >> shift:
            continue  # stale: the part at i changed since this entry was pushed
        j = nxt[i]  # merge the part at i with the part at j, which ends at k
        k = nxt[i] = nxt[j]
        pair[j] = -1
        if k < n:
            prv[k] = i
            r = pair[i] = get(piece[i : nxt[k]], limit)
            if r < limit:
                push(heap, r << shift | i)
        else:
            pair[i] = limit
        h = prv[i]
        if h >= 0:
            r = pair[h] = get(piece[h:k], limit)
            if r < limit:
                push(heap, r << shift | h)
    out, i = [], 0
    while i < n:
        out.append(ranks[piece[i : nxt[i]]])
        i = nxt[i]
    return out
