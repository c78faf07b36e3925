"""The book's corpus, shipped with every CPython: the text of Python's help topics.

``pydoc_data.topics`` holds about 465 KB of English technical prose, the pages that ``help()``
shows. No download is needed, so every chapter can train on it offline.
"""

from __future__ import annotations

__all__ = ["load_corpus", "train_val_split"]


def load_corpus() -> str:
    """All help topics, in sorted order of their names, separated by blank lines.

    >>> text = load_corpus()
    >>> len(text) > 400_000 and "Assert statements are a convenient way" in text
    True
    """
    from pydoc_data.topics import topics

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
