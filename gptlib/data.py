"""The book's corpus, shipped with every CPython: the text of Python's help topics.

``pydoc_data.topics`` holds about 465 KB of English technical prose, the pages that ``help()``
shows. No download is needed, so every chapter can train on it offline. :func:`book_tokenizer`
is the 1024-token BPE that chapter 1 trains on it and later chapters reuse.
"""

from __future__ import annotations

from functools import lru_cache

from pydoc_data.topics import topics

from .tokenizers import BPETokenizer

__all__ = ["load_corpus", "train_val_split", "book_tokenizer"]


def load_corpus() -> str:
    """All help topics, in sorted order of their names, separated by blank lines.

    >>> text = load_corpus()
    >>> len(text) > 400_000 and "Assert statements are a convenient way" in text
    True
    """
    return "\n\n".join(topics[name].strip() for name in sorted(topics)) + "\n"


def train_val_split(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """The first ``1 - val_fraction`` of the text for training, the rest for validation.

    >>> train_val_split("abcdefghij", 0.2)
    ('abcdefgh', 'ij')
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(round(len(text) * (1 - val_fraction)))
    return text[:cut], text[cut:]


def book_tokenizer(vocab_size: int = 1024) -> BPETokenizer:
    """The book's BPE: ``BPETokenizer.train`` on the training split of the corpus, once per process.

    Chapter 1 trains it and checks the training; later chapters call this instead of retraining.
    The result is shared between callers: do not change it.

    >>> tok = book_tokenizer()
    >>> tok.vocab_size, tok.special_tokens, tok is book_tokenizer(vocab_size=1024)
    (1024, {'<|endoftext|>': 1023}, True)
    """
    return _book_bpe(vocab_size)  # one cache key per size, however the size was passed


@lru_cache(maxsize=None)
def _book_bpe(vocab_size: int) -> BPETokenizer:
    return BPETokenizer.train(train_val_split(load_corpus())[0], vocab_size)
