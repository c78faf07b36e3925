"""Python twins of what the page and the widgets' tests share: the page's seeded generator and a
tokenizer stub for the widgets' argument checks (``tests/test_widgets.py``,
``tests/test_browser_live.py``, ``tests/test_nothing_silent*.py``)."""

from __future__ import annotations

from collections.abc import Iterator


def xorshift32(seed: int) -> Iterator[float]:
    """The page's seeded generator (``distribution.js``), in Python: Marsaglia's xorshift32 with
    shifts 13, 17, 5, the seed mixed with 0x9E3779B9 (never 0); u in [0, 1), one per draw.

    >>> u = xorshift32(0)
    >>> 0 <= next(u) < 1 and next(xorshift32(0)) == next(xorshift32(0))
    True
    """
    s = ((seed & 0xFFFFFFFF) ^ 0x9E3779B9) or 1
    while True:
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        yield s / 2**32


class TokenizerStub:
    """The least a live view asks of a tokenizer: 64 tokens, each its own index as text."""

    vocab_size = 64

    def encode(self, text):
        return [0, 1]

    def token_str(self, i):
        return str(i)

    def token_bytes(self, i):
        return str(i).encode()
