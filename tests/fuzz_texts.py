"""Fuzzed texts for the tokenizer peers (``tests/test_export.py``, ``tests/test_browser_live.py``):
strings made of pieces a split pattern and a byte-level BPE must handle, from letters and
contractions to digit runs, whitespace runs, accents, scripts other than Latin, emoji with
modifiers, and invisible or control characters."""

from __future__ import annotations

import random

PIECES = (
    *"abcdefghijklmnopqrstuvwxyz ABCXYZ.,;:!?'\"-()",
    " ", "  ", "   ", "    ", "\n", "\n\n", "\t", "\r\n",
    "0", "1", "7", "42", "1999", "2026", "3.14", "12345678",
    "'s", "'ll", "'re", "n't", " the", " of", "ing", "tion",
    "é", "è", "ü", "ñ", "ç", "ß", "Ω", "ж", "中", "文", "の", "한", "ع", "½", "١", "٣", "e\u0301",
    "😀", "👍🏽", "🇫🇷",
    "\u00a0", "\u2003", "\u200b", "\x85", "\ufeff", "\x04",
)  # fmt: skip


def fuzzed_texts(n: int, seed: int, extra: tuple[str, ...] = (), longest: int = 30) -> list[str]:
    """The empty text and ``n`` texts of 1 to ``longest`` pieces drawn from :data:`PIECES` and
    ``extra`` (a tokenizer's special tokens, say), seeded: the same texts on every run.

    >>> texts = fuzzed_texts(3, seed=0)
    >>> texts[0], len(texts), texts == fuzzed_texts(3, seed=0)
    ('', 4, True)
    """
    rng = random.Random(seed)
    pieces = PIECES + tuple(extra)
    return [""] + [
        "".join(rng.choice(pieces) for _ in range(rng.randint(1, longest))) for _ in range(n)
    ]
