"""gptlib.data: the pinned documentation corpus and the Brown corpus."""

import gzip
import hashlib
import sys

import pytest

import gptlib.data
from gptlib.data import (
    CORPUS_SHA256,
    book_tokenizer,
    corpus_from_topics,
    load_corpus,
    train_val_split,
)
from gptlib.tokenizers import BPETokenizer


def test_corpus_is_the_pinned_text():
    a = load_corpus()
    assert a == load_corpus()
    assert hashlib.sha256(a.encode("utf-8")).hexdigest() == CORPUS_SHA256
    assert len(a) == 465_048 and a.startswith('The "assert" statement\n') and a.endswith("\n")


@pytest.mark.skipif(
    sys.version_info[:3] != (3, 11, 7), reason="the pinned copy is CPython 3.11.7's help topics"
)
def test_corpus_equals_the_help_topics_of_python_3_11_7():
    from pydoc_data.topics import topics

    assert load_corpus() == corpus_from_topics(topics)


def test_corpus_file_altered_or_corrupt_fails_naming_the_file(tmp_path, monkeypatch):
    altered = tmp_path / "altered.txt.gz"
    altered.write_bytes(gzip.compress(load_corpus().replace("assert", "assort", 1).encode("utf-8")))
    corrupt = tmp_path / "corrupt.txt.gz"
    corrupt.write_bytes(b"not gzip")
    for path, match in ((altered, "sha256"), (corrupt, "gzip")):
        monkeypatch.setattr(gptlib.data, "CORPUS_FILE", path)
        gptlib.data._load_corpus.cache_clear()
        try:
            with pytest.raises(ValueError, match=match) as e:
                load_corpus()
            assert str(path) in str(e.value)
        finally:
            monkeypatch.undo()
            gptlib.data._load_corpus.cache_clear()
    assert hashlib.sha256(load_corpus().encode("utf-8")).hexdigest() == CORPUS_SHA256


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

needs_brown = pytest.mark.skipif(
    not (cache_dir() / ASSETS["brown"].filename).is_file(),
    reason="Brown corpus not fetched: run `python -m gptlib.assets fetch brown` (make does)",
)


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
    assert docs[0][0] == "ca01" and docs[0][1].startswith(
        "The Fulton County Grand Jury said Friday"
    )
    text = "\n\n".join(t for _, t in docs)
    assert len(text.encode()) == 5_965_976  # the untagged text of the pinned tarball
    assert text.isascii() and "``" not in text and "/at " not in text and "/nn" not in text


@needs_brown
def test_load_english_fixed_disjoint_split():
    train, val = load_english()
    assert (train, val) == load_english()
    docs = [t for _, t in brown_documents()]
    assert val == "\n\n".join(docs[19::20]) + "\n"  # samples 20, 40, ..., 500
    assert all(d not in train for d in docs[19::20])
    assert train == "\n\n".join(d for i, d in enumerate(docs) if i % 20 != 19) + "\n"
    assert (len(train), len(val)) == (5_665_736, 300_240)  # 5.0% of the characters held out
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
    assert (
        val == [docs[i][0] for i in range(19, 500, 20)]
        and len(train) == 475
        and not set(train) & set(val)
    )
    genres = {name[1] for name, _ in docs}
    assert len(genres) == 15 and {name[1] for name in val} == genres - {
        "m"
    }  # no science fiction held out
    assert load_english()[1] == "\n\n".join(dict(docs)[n] for n in val) + "\n"


@pytest.mark.slow
@needs_brown
def test_shipped_english_model_matches_its_log(one_thread):
    """models/english: the files agree with train_log.json, whose validation figure is the sum of
    the windows' losses that models/english_heldout.json stores for these weights (their sha256);
    the model's own loss is recomputed on every tenth window, spread over the whole held-out
    text, against the stored one."""
    import json
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    from gptlib.files import model_file, read_fields
    from gptlib.model import GPT
    from gptlib.training import make_windows, windows_loss

    directory = Path(__file__).resolve().parents[1] / "models" / "english"
    log = json.loads((directory / "train_log.json").read_text())
    model = GPT.load(directory).eval()
    tok = BPETokenizer.load(directory / "tokenizer.json")
    assert (
        model.config.to_dict() == log["run_config"]["model"]
        and tok.vocab_size == model.config.d_vocab
    )
    _, val = load_english()
    ids = tok.encode(val)
    assert len(ids) == log["corpus"]["val_tokens"] and tok.decode(ids) == val
    n_ctx = model.config.n_ctx
    x, y = make_windows(
        ids, n_ctx, n_ctx
    )  # every validation window, as the log's figure scores them
    # Chapter 8 reads every window's loss from models/english_heldout.json and recomputes 32
    held = json.loads((directory.parent / "english_heldout.json").read_text())
    assert held["model_sha256"] == read_fields(model_file(directory))["sha256"]  # these weights
    assert len(held["nats"]) == len(x)
    # the model's own loss on every tenth window (the whole set takes a minute of CPU)
    picked = torch.arange(0, len(x), 10)
    with torch.no_grad():
        first = float(F.cross_entropy(model(x[:8]).flatten(0, 1), y[:8].flatten()))
        nats = torch.cat(
            [
                F.cross_entropy(model(xb).flatten(0, 1), yb.flatten(), reduction="none")
                .view(len(xb), -1)
                .sum(dim=1)
                for xb, yb in zip(x[picked].split(32), y[picked].split(32))
            ]
        )  # (len(picked),): each window's summed loss, in nats
    assert first < math.log(model.config.d_vocab) - 3  # far below a uniform guess (8.3 nats)
    stored = torch.tensor(held["nats"], dtype=torch.float64)  # (n,)
    torch.testing.assert_close(nats.double(), stored[picked], rtol=1e-5, atol=0.0)
    lengths = token_byte_lengths(tok)
    assert held["window_bytes"] == lengths[y].sum(dim=1).tolist()
    # windows_loss on some windows is their summed loss over their tokens and bytes
    r8 = windows_loss(model, x[picked[:8]], y[picked[:8]], lengths)
    assert r8.nats_per_token * r8.tokens == pytest.approx(float(nats[:8].sum()), rel=1e-5)
    # the log's figure is the stored windows' summed loss over their tokens and bytes
    final = log["final_val"]
    n_bytes = int(lengths[y].sum())
    nats_per_token = float(stored.sum()) / y.numel()
    assert (y.numel(), n_bytes) == (final["tokens"], final["bytes"])
    # the log rounds to 4 decimals; the float32 sums agree far below that
    assert abs(nats_per_token - final["nats_per_token"]) <= 5e-5 + 1e-5
    bpb = nats_per_token * y.numel() / (math.log(2) * n_bytes)
    assert abs(bpb - final["bits_per_byte"]) <= 5e-5 + 1e-5
    assert final["bits_per_byte"] == pytest.approx(
        bits_per_byte(final["nats_per_token"], final["tokens"], final["bytes"]), abs=5e-5
    )


def test_token_byte_lengths_add_up_to_the_text(book_bpe):
    tok = book_bpe
    lengths = token_byte_lengths(tok)
    assert lengths.shape == (tok.vocab_size,) and lengths[:256].eq(1).all()
    text = "Assert statements: caf\u00e9 \u2014 \U0001f600 and <|endoftext|>"
    ids = tok.encode(text, allowed_special="all")
    assert tok.special_tokens["<|endoftext|>"] in ids and int(lengths[ids].sum()) == len(
        text.encode("utf-8")
    )
