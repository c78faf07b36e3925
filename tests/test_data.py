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


@pytest.mark.slow
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


# --- the Brown corpus (load_english) ----------------------------------------------------------

import math  # noqa: E402

from gptlib.assets import ASSETS, cache_dir  # noqa: E402
from gptlib.data import (  # noqa: E402
    bits_per_byte,
    brown_documents,
    detokenize,
    english_split,
    held_out_indices,
    load_english,
    token_byte_lengths,
    untag_brown,
)

needs_brown = pytest.mark.skipif(not (cache_dir() / ASSETS["brown"].filename).is_file(),
                                 reason="Brown corpus not fetched: run `python -m gptlib.assets fetch brown` (make does)")


def test_detokenize_punctuation_and_quotes():
    assert detokenize(["``", "Yes", "''", ",", "she", "said", "."]) == '"Yes", she said.'
    assert detokenize(["a", "--", "b", ";", "c", "?", "!"]) == "a -- b; c?!"
    assert detokenize(["(", "see", "[", "1", "]", ")", "."]) == "(see [1])."
    assert detokenize(["U.S.", "."]) == "U.S."
    assert detokenize([]) == ""


def test_untag_brown_strips_tags_and_keeps_paragraphs():
    raw = "\n\n\tHe/pps saw/vbd 3/cd dogs/nns ./.\n\tThey/ppss ran/vbd ./.\n\n\n\tEnd/nn ./.\n"
    assert untag_brown(raw) == "He saw 3 dogs. They ran.\nEnd."
    assert untag_brown("\r\n\r\n\tand/or/cc ./.\r\n") == "and/or."
    assert untag_brown("") == ""


def test_bits_per_byte():
    assert bits_per_byte(math.log(2), 4, 4) == pytest.approx(1.0)
    assert bits_per_byte(2.0, 300, 1200) == pytest.approx(2.0 * 300 / (math.log(2) * 1200))
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 10, 0)


@pytest.mark.slow
@needs_brown
def test_brown_documents_are_clean_english():
    docs = brown_documents()
    assert len(docs) == 500 and [n for n, _ in docs] == sorted(n for n, _ in docs)
    assert docs[0][0] == "ca01" and docs[0][1].startswith("The Fulton County Grand Jury said Friday")
    text = "\n\n".join(t for _, t in docs)
    assert 5_500_000 < len(text.encode()) < 6_500_000
    assert text.isascii() and "``" not in text and "/at " not in text and "/nn" not in text


@needs_brown
def test_load_english_fixed_disjoint_split():
    train, val = load_english()
    assert (train, val) == load_english()
    docs = [t for _, t in brown_documents()]
    assert val == "\n\n".join(docs[19::20]) + "\n"  # samples 20, 40, ..., 500
    assert all(d not in train for d in docs[19::20])
    assert 0.04 < len(val) / (len(train) + len(val)) < 0.06
    with pytest.raises(ValueError, match="val_every"):
        load_english(1)


def test_held_out_indices():
    assert held_out_indices(500) == list(range(19, 500, 20))
    assert held_out_indices(3, 5) == []
    for bad in ({"n_docs": 0}, {"n_docs": 10, "val_every": 1}, {"n_docs": 10, "val_every": 2.0}):
        with pytest.raises(ValueError, match=next(reversed(bad))):
            held_out_indices(**bad)


@needs_brown
def test_english_split_names_the_held_out_samples_and_genres():
    train, val = english_split()
    docs = brown_documents()
    assert val == [docs[i][0] for i in range(19, 500, 20)] and len(train) == 475 and not set(train) & set(val)
    genres = {name[1] for name, _ in docs}
    assert len(genres) == 15 and {name[1] for name in val} == genres - {"m"}  # no science fiction held out
    assert load_english()[1] == "\n\n".join(dict(docs)[n] for n in val) + "\n"


@pytest.mark.slow
@needs_brown
def test_shipped_english_model_matches_its_log():
    """models/english: the files agree with train_log.json and the model has learned the text."""
    import json
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    from gptlib.model import GPT
    from gptlib.training import make_windows

    directory = Path(__file__).resolve().parents[1] / "models" / "english"
    log = json.loads((directory / "train_log.json").read_text())
    model = GPT.load(directory).eval()
    tok = BPETokenizer.load(directory / "tokenizer.json")
    assert model.config.to_dict() == log["run_config"]["model"] and tok.vocab_size == model.config.d_vocab
    _, val = load_english()
    ids = tok.encode(val)
    assert len(ids) == log["corpus"]["val_tokens"] and tok.decode(ids) == val
    n_ctx = model.config.n_ctx
    x, y = make_windows(ids[: 8 * n_ctx + 1], n_ctx, n_ctx)  # the first 8 windows that the log's figure scores
    with torch.no_grad():
        loss = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    assert loss < math.log(model.config.d_vocab) - 3  # far below a uniform guess (8.3 nats)
    assert abs(loss - log["final_val"]["nats_per_token"]) < 0.5
    assert log["final_val"]["bits_per_byte"] == pytest.approx(
        bits_per_byte(log["final_val"]["nats_per_token"], log["final_val"]["tokens"], log["final_val"]["bytes"]), abs=1e-3)


def test_token_byte_lengths_add_up_to_the_text(book_bpe):
    tok = book_bpe
    lengths = token_byte_lengths(tok)
    assert lengths.shape == (tok.vocab_size,) and lengths[:256].eq(1).all()
    text = "Assert statements: caf\u00e9 \u2014 \U0001F600 and <|endoftext|>"
    ids = tok.encode(text, allowed_special="all")
    assert tok.special_tokens["<|endoftext|>"] in ids and int(lengths[ids].sum()) == len(text.encode("utf-8"))
