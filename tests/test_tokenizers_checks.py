"""gptlib.tokenizers as a hostile user would call it: every defect found, each with its test.

Items 4, 9, 10 and 11 of issue 24 (split patterns that lose text, quadratic encoding, ids that
differed from tiktoken, special tokens and vocabularies), then an audit of every public entry point:
ids are ints in range, texts are ``str``, files are validated, errors name the parameter or the
file.
"""

import base64
import json
import random
import warnings

import numpy as np
import pytest
import regex
import tiktoken
import tiktoken.load
import torch

from gptlib.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    encode_piece,
    get_stats,
    merge,
    merge_steps,
)

TEXT = "the cat sat on the mat. the dog sat on the log, it's 3.14 🙂\n" * 3


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train(TEXT, 280)


def _edited(tmp_path, tok, **fields):
    """Save ``tok``, change some JSON fields (None deletes one), return the file's path."""
    p = tok.save(tmp_path / "original.json")
    d = json.loads(p.read_text())
    for k, v in fields.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(d))
    return out


# --- item 4: the split pattern must cover its input
# ------------------------------------------------
def test_train_refuses_a_pattern_that_drops_text():
    # Before: train with r"\w+" dropped spaces and marks, and decode(encode("a b!")) was "ab".
    with pytest.raises(ValueError, match="pattern"):
        BPETokenizer.train("a b a b", 260, pattern=r"\w+", special_tokens=())


def test_constructor_and_load_refuse_a_pattern_that_drops_text(tok, tmp_path):
    with pytest.raises(ValueError, match="pattern"):
        BPETokenizer(tok.ranks, r"\w+")
    # Before: a file with "pattern": "" loaded, and encoded every text to [].
    p = _edited(tmp_path, tok, pattern="")
    with pytest.raises(ValueError, match="edited.json.*pattern"):
        BPETokenizer.load(p)


def test_encode_refuses_text_the_pattern_does_not_cover(tok):
    # This pattern covers the constructor's probe text but not the snowman.
    snowless = BPETokenizer(tok.ranks, r"[^\s☃]+|\s+")
    assert snowless.decode(snowless.encode("a cat, 🙂")) == "a cat, 🙂"
    with pytest.raises(ValueError, match=r"pattern.*'☃'.*position 1"):
        snowless.encode("a☃b")
    with pytest.raises(ValueError, match="pattern"):
        BPETokenizer.train("a☃b a☃b", 258, pattern=r"[^\s☃]+|\s+", special_tokens=())
    with pytest.raises(ValueError, match="pattern"):
        snowless.merge_trace("a☃b")


def test_any_covering_pattern_round_trips(tok):
    for pattern in [
        r"\S+|\s+",
        r"(?s).",
        r"(\w+)|(\W+)",
    ]:  # the last with groups: whole matches count
        t = BPETokenizer(tok.ranks, pattern)
        for text in ["", "a b!", " it's  3.14\n🙂 x", "the cat sat"]:
            assert t.decode(t.encode(text)) == text
            assert t.encode(text) == t.to_tiktoken().encode_ordinary(text)


# --- item 9: encoding is near-linear in the length of a piece
# --------------------------------------
class _CountingRanks(dict):
    """A ranks dict that counts the lookups the encoder makes."""

    lookups = 0

    def get(self, *args):
        type(self).lookups += 1
        return super().get(*args)


def test_encoding_a_long_piece_costs_linear_many_rank_lookups(tok):
    # Before: every merge rescanned every pair of the piece, about n**2 / 2 lookups for n bytes.
    rng = random.Random(0)
    word = "".join(rng.choice("thecasomdglipr") for _ in range(3000))
    fresh = BPETokenizer(tok.ranks, tok.pattern, tok.special_tokens)
    fresh.ranks = _CountingRanks(tok.ranks)
    _CountingRanks.lookups = 0
    ids = fresh.encode(word)
    assert fresh.decode(ids) == word and ids == tok.to_tiktoken().encode_ordinary(word)
    assert _CountingRanks.lookups <= 4 * len(word)


# --- item 10: the same ids as tiktoken, letters of any Unicode version included
# --------------------
NEWER_THAN_PYTHON = [
    # CJK Extension J (Unicode 17.0): a letter to the regex module, not to tiktoken
    "\U00032628're",
    "\u0558's",  # Armenian (17.0)
    "\U00011de0'll",  # a Tolong Siki digit (17.0)
    "x\U00032628've \U00032628'd",
    # CJK Extension H (15.0): a letter to both, unknown to Python 3.11's unicodedata
    "\U00031350're",
    "\U0001e5d0'm \U00011f50't",  # Ol Onal letter (16.0), Kawi digit (15.0)
    " \U000323b0\U000323b1's",
]


@pytest.mark.parametrize("text", NEWER_THAN_PYTHON)
def test_gpt2_equals_tiktoken_on_letters_newer_than_python(gpt2, r50k, text):
    assert gpt2.encode(text) == r50k.encode_ordinary(text)
    assert gpt2.decode(gpt2.encode(text)) == text


@pytest.mark.slow
def test_split_classes_match_tiktoken_on_every_code_point():
    """Letters, numbers, whitespace and unassigned code points as tiktoken's tables have them."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    bytes_only = {bytes([b]): b for b in range(256)}
    for cls, other in [
        (r"\p{L}", r"\P{L}"),
        (r"\p{N}", r"\P{N}"),
        (r"\s", r"\S"),
        (r"\p{Cn}", r"\P{Cn}"),
    ]:
        pieces = BPETokenizer(bytes_only, f"{cls}+|{other}+").split(every)
        assert "".join(pieces) == every and not regex.fullmatch(cls, every[0])
        ours = "".join(pieces[1::2])  # every[0] (U+0000) is in no class: the runs alternate
        theirs = tiktoken.Encoding(
            "probe", pat_str=cls, mergeable_ranks=bytes_only, special_tokens={}
        )
        in_class = theirs.decode(
            theirs.encode_ordinary(every)
        )  # tiktoken keeps only what it matches
        assert ours == in_class, (
            f"{cls}: {len(ours)} characters in ours, {len(in_class)} in tiktoken's"
        )


# --- item 11: special tokens and vocabulary sizes ------------------------------------------------
def test_special_token_ids_are_ints_right_after_the_ordinary_tokens(tok):
    n = len(tok.ranks)
    for bad in [n + 0.5, float(n), True, 10**9, n + 1, -1, "300"]:
        with pytest.raises(ValueError, match="special_tokens"):
            BPETokenizer(tok.ranks, special_tokens={"<|x|>": bad})
    assert BPETokenizer(tok.ranks, special_tokens={"<|x|>": np.int64(n)}).vocab_size == n + 1
    both = BPETokenizer(tok.ranks, special_tokens={"<|b|>": n + 1, "<|a|>": n})
    assert both.vocab_size == n + 2 and both.decode([n, n + 1]) == "<|a|><|b|>"


def test_special_token_strings_are_non_empty_valid_text(tok):
    n = len(tok.ranks)
    for bad in ["", 5, b"<|x|>", "\ud800"]:
        with pytest.raises(ValueError, match="special_tokens"):
            BPETokenizer(tok.ranks, special_tokens={bad: n})
        with pytest.raises(ValueError, match="special_tokens"):
            BPETokenizer.train(TEXT, 280, special_tokens=[bad])
    with pytest.raises(ValueError, match="special_tokens"):
        BPETokenizer.train(TEXT, 280, special_tokens="<|endoftext|>")  # a str, not a list of them


def test_train_says_when_the_text_allows_fewer_merges():
    with pytest.warns(UserWarning, match=r"vocab_size.*1000.*259"):
        small = BPETokenizer.train("ab ab ab", 1000)
    assert small.vocab_size == 259 and small.special_tokens == {"<|endoftext|>": 258}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert BPETokenizer.train("ab ab ab", 259).vocab_size == 259  # exactly what the text allows


def test_train_vocab_size_is_an_int():
    assert BPETokenizer.train("ab ab", np.int64(258)).vocab_size == 258
    for bad in [258.0, True, "258", None]:
        with pytest.raises(ValueError, match="vocab_size"):
            BPETokenizer.train("ab ab", bad)


# --- audit: ids --------------------------------------------------------------------------------
def test_decode_refuses_ids_that_are_not_ints_in_range(tok):
    # Before: True, 1.0 and numpy floats decoded as byte 1 (a dict lookup 1.0 == 1).
    for bad in [
        [True],
        [1.0],
        [np.float64(1.0)],
        [-1],
        [tok.vocab_size],
        [None],
        ["a"],
        "ab",
        5,
        {1: 2},
        torch.tensor([1.0]),
        torch.tensor([[1, 2]]),
        torch.tensor(1),
        torch.tensor([True]),
        np.array(1),
        np.array([[1, 2]]),
    ]:
        with pytest.raises(ValueError, match="ids"):
            tok.decode(bad)
        with pytest.raises(ValueError, match="ids"):
            tok.decode_bytes(bad)


def test_decode_takes_int_tensors_numpy_ints_and_iterators(tok):
    ids = tok.encode("the cat")
    text = "the cat"
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.decode(np.array(ids)) == text
    assert tok.decode(iter(ids)) == text
    assert tok.decode(i for i in ids) == text


def test_token_bytes_and_token_str_check_their_id(tok):
    assert tok.token_bytes(np.int64(97)) == b"a" and tok.token_str(97) == "a"
    for bad in [True, 97.0, -1, tok.vocab_size, "97"]:
        with pytest.raises(ValueError, match=r"\bi\b"):
            tok.token_bytes(bad)
        with pytest.raises(ValueError, match=r"\bi\b"):
            tok.token_str(bad)


def test_char_and_word_decode_check_ids():
    c, w = CharTokenizer.train("abc"), WordTokenizer.train("a b c")
    for t in (c, w):
        assert t.decode(torch.tensor([0, 1])) == t.decode([0, 1])
        for bad in [[True], [0.0], [np.float32(1)], [-1], [t.vocab_size]]:
            with pytest.raises(ValueError, match="ids"):
                t.decode(bad)


# --- audit: texts ------------------------------------------------------------------------------
def test_texts_must_be_str(tok):
    c, w = CharTokenizer.train("abc"), WordTokenizer.train("a b c")
    for bad in [b"abc", None, 5, ["a"]]:
        for call in (
            tok.encode,
            tok.encode_ordinary,
            tok.merge_trace,
            c.encode,
            w.encode,
            CharTokenizer.train,
            WordTokenizer.train,
            lambda t: BPETokenizer.train(t, 260),
        ):
            with pytest.raises(ValueError, match="text"):
                call(bad)


def test_lone_surrogates_are_refused_naming_the_position(tok):
    # UTF-8 cannot write a lone surrogate; tiktoken replaces it by U+FFFD, which would break the
    # round trip, so encoding refuses it (before: a UnicodeEncodeError that did not name the text).
    with pytest.raises(ValueError, match=r"text.*surrogate.*position 3"):
        tok.encode("abc\ud800def")
    with pytest.raises(ValueError, match=r"text.*surrogate"):
        BPETokenizer.train("abc\udfff", 260)
    c = CharTokenizer.train("a\ud800")  # str-level tokenizers keep surrogates like any character
    assert c.decode(c.encode("\ud800a")) == "\ud800a"


def test_allowed_special_is_all_or_a_set_of_special_tokens(tok):
    eot = tok.special_tokens["<|endoftext|>"]
    assert tok.encode("<|endoftext|>", allowed_special={"<|endoftext|>"}) == [eot]
    assert tok.encode("<|endoftext|>", allowed_special=["<|endoftext|>"]) == [eot]
    for bad in [None, 5, "<|endoftext|>", {"<|nope|>"}, {5}]:
        with pytest.raises(ValueError, match="allowed_special"):
            tok.encode("x", allowed_special=bad)


# --- audit: parameters of the constructors and helpers ------------------------------------------
def test_bpe_constructor_checks_ranks_pattern_and_name(tok):
    ranks = tok.ranks
    for bad in [
        list(ranks),
        {k: float(v) for k, v in ranks.items()},
        {**ranks, "zz": len(ranks)},
        {**ranks, b"": len(ranks)},
        {**ranks, b"zz": True},
        {k: v for k, v in ranks.items() if v != 5},
    ]:
        with pytest.raises(ValueError, match="ranks"):
            BPETokenizer(bad)
    for bad in [123, None, "(", b"\\w+"]:
        with pytest.raises(ValueError, match="pattern"):
            BPETokenizer(ranks, bad)
        with pytest.raises(ValueError, match="pattern"):
            BPETokenizer.train(TEXT, 280, pattern=bad)
    with pytest.raises(ValueError, match="name"):
        BPETokenizer(ranks, name=5)


def test_word_and_char_vocabularies_are_checked():
    with pytest.raises(ValueError, match="vocab"):
        WordTokenizer("hello")  # a str, not a list of words
    with pytest.raises(ValueError, match="vocab.*'the cat'"):
        WordTokenizer(["the cat", "dog"])  # no split ever produces it
    with pytest.raises(ValueError, match="vocab"):
        CharTokenizer([b"a"])


def test_merge_helpers_check_their_parameters(tok):
    with pytest.raises(ValueError, match="pair"):
        merge([1, 2], (1,), 3)
    with pytest.raises(ValueError, match="counts"):
        get_stats([1, 2], counts=[])
    with pytest.raises(ValueError, match="parts"):
        list(merge_steps((b"a", b"b"), tok.ranks))
    with pytest.raises(ValueError, match="piece"):
        encode_piece("ab", tok.ranks)
    for bad in [1.5, True, -1]:
        with pytest.raises(ValueError, match="limit"):
            list(merge_steps([b"a", b"b"], tok.ranks, limit=bad))
        with pytest.raises(ValueError, match="limit"):
            encode_piece(b"ab", tok.ranks, limit=bad)


# --- audit: files --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, match",
    [
        ("version", True, "version"),
        ("version", 1.0, "version"),
        ("tokens", 5, "'tokens'"),
        ("tokens", {"a": 1}, "'tokens'"),
        ("pattern", 5, "'pattern'"),
        ("pattern", "(", "'pattern'"),
        ("special_tokens", [["<|endoftext|>", 279]], "'special_tokens'"),
        ("special_tokens", {"<|endoftext|>": "279"}, "'special_tokens'"),
        ("special_tokens", {"<|endoftext|>": 5}, "'special_tokens'"),
        ("special_tokens", {"<|endoftext|>": 280}, "'special_tokens'"),
        ("name", 5, "'name'"),
    ],
)
def test_bpe_load_refuses_corrupt_fields_naming_file_and_field(tok, tmp_path, field, value, match):
    p = _edited(tmp_path, tok, **{field: value})
    with pytest.raises(ValueError, match=rf"edited\.json.*{match}"):
        BPETokenizer.load(p)


def test_bpe_load_refuses_tokens_that_no_merge_makes(tok, tmp_path):
    # Token 260 becomes "zzz": not the merge of two earlier tokens, so no encoding can produce it.
    tokens = list(tok.to_dict()["tokens"])
    tokens[260] = base64.b64encode(b"zzz").decode()
    p = _edited(tmp_path, tok, tokens=tokens)
    with pytest.raises(ValueError, match=r"edited\.json.*260"):
        BPETokenizer.load(p)


def test_word_load_refuses_a_vocabulary_without_its_unknown_token(tmp_path):
    w = WordTokenizer.train("the cat sat")
    p = w.save(tmp_path / "w.json")
    d = json.loads(p.read_text())
    d["vocab"] = [v for v in d["vocab"] if v != WordTokenizer.UNK]
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"w\.json.*<\|unk\|>"):
        WordTokenizer.load(p)
