"""gptlib.data: the embedded corpus."""

import pytest

from gptlib.data import book_tokenizer, load_corpus, train_val_split
from gptlib.tokenizers import BPETokenizer


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


def test_book_tokenizer_is_the_trained_bpe_and_is_cached():
    train, _ = train_val_split(load_corpus())
    tok = book_tokenizer()
    assert tok.ranks == BPETokenizer.train(train, 1024).ranks
    assert tok.special_tokens == {"<|endoftext|>": 1023}
    assert book_tokenizer(1024) is tok
    small = book_tokenizer(300)
    assert small.vocab_size == 300 and small is not tok
    with pytest.raises(ValueError, match="vocab_size"):
        book_tokenizer(10)
