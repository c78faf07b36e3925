"""gptlib.data: the embedded corpus."""

import pytest

from gptlib.data import load_corpus, train_val_split


def test_corpus_is_deterministic_english_and_large():
    a, b = load_corpus(), load_corpus()
    assert a == b
    assert len(a) > 400_000
    assert a.count(" the ") > 2000


def test_train_val_split():
    train, val = train_val_split("0123456789", 0.3)
    assert (train, val) == ("0123456", "789")
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split("abc", 1.0)
