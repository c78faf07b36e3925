"""gptlib.tokenizers: worked examples, round trips, and equality with tiktoken."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlib.data import load_corpus, train_val_split
from gptlib.tokenizers import (
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    get_stats,
    merge,
    merge_steps,
)

VARIED = [
    "",
    "Hello, world!",
    "Not all heroes wear capes",
    "It's, we're, they'll, I'd, you've, she'll've",
    "tabs\tand   runs of     spaces\n\n\nand newlines  ",
    "emoji: 🙂🚀👩‍👩‍👧 and flags 🇩🇪",
    "mixed scripts: Ελληνικά, русский, 日本語, العربية, हिन्दी",
    "numbers 3.14159 and 1,000,000 and 2026-11-22",
    "code: def f(x):\n    return x**2  # square",
    "<|endoftext|> is text here unless allowed",
    "letters newer than Python's tables: \U00032628're \u0558's \U00031350'll \U0001e5d0'd",
]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def trained(book_bpe):
    """The book's 1024-token BPE, trained on the corpus's training split (once per session)."""
    return book_bpe


def test_get_stats_and_merge_worked_examples():
    assert get_stats([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert merge([1, 2, 3, 1, 2], (1, 2), 4) == [4, 3, 4]
    assert merge([1, 1, 1, 1], (1, 1), 7) == [7, 7]
    assert merge([], (1, 2), 3) == []


def test_merge_steps_worked_example():
    # Ranks below: "ab" (2) beats "bb" (3); then "ab" + "b" is "abb" (4).
    ranks = {b"a": 0, b"b": 1, b"ab": 2, b"bb": 3, b"abb": 4}
    parts = [b"a", b"b", b"b"]
    assert list(merge_steps(parts, ranks)) == [(2, 0), (4, 0)]
    assert parts == [b"abb"]
    parts = [b"a", b"b", b"b"]
    assert list(merge_steps(parts, ranks, limit=3)) == [(2, 0)]  # "abb" is not below the limit
    assert parts == [b"ab", b"b"]
    parts = [b"b", b"b", b"b"]
    assert list(merge_steps(parts, ranks)) == [
        (3, 0)
    ]  # leftmost of two equal pairs; "bbb" is no token
    assert parts == [b"bb", b"b"]


def test_aaabdaaabac_worked_example():
    # Wikipedia's example: aa -> Z, ab -> Y, ZY -> X gives "XdXac".
    tok = BPETokenizer.train("aaabdaaabac", 259, special_tokens=())
    assert [tok.token_bytes(i) for i in (256, 257, 258)] == [b"aa", b"ab", b"aaab"]
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    ids = tok.encode("aaabdaaabac")
    assert ids == [258, ord("d"), 258, ord("a"), ord("c")]
    assert tok.decode(ids) == "aaabdaaabac"


def test_train_is_deterministic_and_sized(corpus):
    a = BPETokenizer.train(corpus[:50_000], 400)
    b = BPETokenizer.train(corpus[:50_000], 400)
    assert a.ranks == b.ranks and a.vocab_size == 400
    assert a.special_tokens == {"<|endoftext|>": 399}


@pytest.mark.parametrize("text", VARIED)
def test_round_trip_trained(trained, text):
    assert trained.decode(trained.encode(text)) == text


def test_trained_equals_its_own_tiktoken_on_held_out_text(trained, corpus):
    _, held_out = train_val_split(corpus)
    enc = trained.to_tiktoken()
    for i in range(0, len(held_out), 5000):
        piece = held_out[i : i + 5000]
        assert trained.encode(piece) == enc.encode_ordinary(piece)
    for text in VARIED:
        assert trained.encode(text) == enc.encode_ordinary(text)


def test_trained_tokenizer_compresses(trained, corpus):
    # The corpus is pinned (gptlib.data.load_corpus), so the counts are known values (Chapter 1
    # prints them): 46,591 bytes in 15,983 tokens, and every token's bytes add up to the text's.
    _, held_out = train_val_split(corpus)
    ids = trained.encode(held_out)
    assert (len(held_out.encode("utf-8")), len(ids)) == (46_591, 15_983)
    assert sum(len(trained.token_bytes(i)) for i in ids) == len(held_out.encode("utf-8"))


def test_rank_rule_and_learned_order_part_where_a_pair_spells_a_token_another_way():
    # Merges (a, b), (b, c), (a, bc): on "abc" the learned order stops at ab|c, since (ab, c) is no
    # rule, while the rank rule merges ab|c because its bytes spell the token abc.
    ranks = {bytes([i]): i for i in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}
    tok = BPETokenizer(ranks)
    assert tok.encode("abc") == [258]
    rules = {(97, 98): 256, (98, 99): 257, (97, 257): 258}
    ids = [97, 98, 99]
    while present := [p for p in zip(ids, ids[1:]) if p in rules]:
        pair = min(present, key=rules.get)
        ids = merge(ids, pair, rules[pair])
    assert ids == [256, 99]
    assert tok.merges[2] == (256, 99)  # the merge the ranks imply for abc is (ab, c), not (a, bc)


def test_special_tokens_only_when_allowed(trained):
    eot = trained.special_tokens["<|endoftext|>"]
    assert eot not in trained.encode("a<|endoftext|>b")
    assert trained.encode("a<|endoftext|>b", allowed_special="all") == trained.encode("a") + [
        eot
    ] + trained.encode("b")
    assert trained.decode([eot]) == "<|endoftext|>"
    with pytest.raises(ValueError, match="allowed_special"):
        trained.encode("x", allowed_special={"<|nope|>"})


def test_decode_invalid_utf8_gives_replacement_characters(trained):
    e_acute = trained.encode("é")  # two bytes, each a base token in a small vocabulary
    first_byte = [trained.ranks[bytes([0xC3])]]
    assert trained.decode(first_byte) == "\ufffd"
    assert trained.decode(e_acute) == "é"


def test_save_load_round_trip_and_corrupt_files(trained, tmp_path):
    p = tmp_path / "tok.json"
    trained.save(p)
    loaded = BPETokenizer.load(p)
    assert loaded.ranks == trained.ranks and loaded.special_tokens == trained.special_tokens
    assert loaded.pattern == GPT2_SPLIT_PATTERN
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BPETokenizer.load(tmp_path / "bad.json")
    d = json.loads(p.read_text())
    d["format"] = "other"
    (tmp_path / "fmt.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="format"):
        BPETokenizer.load(tmp_path / "fmt.json")
    d = json.loads(p.read_text())
    d["tokens"][300] = "%%%"
    (tmp_path / "b64.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="base64"):
        BPETokenizer.load(tmp_path / "b64.json")
    d = json.loads(p.read_text())
    del d["tokens"][5]
    (tmp_path / "gap.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="single bytes|ranks"):
        BPETokenizer.load(tmp_path / "gap.json")


def test_bad_parameters_raise_value_errors():
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train("abc", 100)
    with pytest.raises(ValueError, match="special_tokens"):
        BPETokenizer.train("abc", 300, special_tokens=("x", "x"))
    with pytest.raises(ValueError, match="ids"):
        BPETokenizer.train("abc", 259).decode([10_000])
    with pytest.raises(ValueError, match="text"):
        BPETokenizer.train("abc", 259).encode(b"abc")  # type: ignore[arg-type]


def test_merge_trace_ends_at_the_encoding(trained):
    text = "The import statement binds names."
    steps, labels = trained.merge_trace(text)
    assert len(steps) == len(labels) + 1
    assert "".join(steps[0]) == text and len(steps[0]) == len(text.encode())
    assert steps[-1] == [trained.token_str(i) for i in trained.encode(text)]
    assert all(len(b) == len(a) - 1 for a, b in zip(steps, steps[1:]))


def test_byte_tokens_are_labelled_by_their_bytes(gpt2, trained):
    """token_str writes a byte outside a whole UTF-8 character as <0xNN>: GPT-2's 128 byte tokens
    that are not text on their own get 128 different labels, not 128 U+FFFD; a merge trace of
    a text with "é" shows its two bytes, and the BPE view takes it (its steps join to one text's
    bytes)."""
    from gptlib.tokenizers.base import text_bytes
    from gptlib.widgets import BPEMergeView

    labels = {gpt2.token_str(gpt2.ranks[bytes([b])]) for b in range(128, 256)}
    assert len(labels) == 128 and all(t.startswith("<0x") for t in labels)
    assert gpt2.token_str(gpt2.ranks[b"\xe2"]) == "<0xE2>"
    steps, merges = trained.merge_trace("café")
    assert steps[0] == ["c", "a", "f", "<0xC3>", "<0xA9>"]
    assert all(text_bytes("".join(s)) == "café".encode() for s in steps)
    BPEMergeView(steps, merges)


def test_gpt2_known_encoding(gpt2):
    assert gpt2.vocab_size == 50257
    assert gpt2.special_tokens == {"<|endoftext|>": 50256}
    assert gpt2.encode("Not all heroes wear capes") == [3673, 477, 10281, 5806, 1451, 274]


def test_gpt2_equals_tiktoken_r50k(gpt2, r50k):
    ref = r50k
    text = load_corpus()[:20_000]
    for t in VARIED + [text]:
        assert gpt2.encode(t) == ref.encode_ordinary(t)
        assert gpt2.decode(ref.encode_ordinary(t)) == t
    assert gpt2.encode("a<|endoftext|>", allowed_special="all") == ref.encode(
        "a<|endoftext|>", allowed_special="all"
    )


def test_gpt2_merges_rebuild_the_vocabulary(gpt2):
    merges = gpt2.merges
    assert len(merges) == 50000
    for k in (0, 1, 100, 49_999):
        a, b = merges[k]
        assert gpt2.token_bytes(a) + gpt2.token_bytes(b) == gpt2.token_bytes(256 + k)


def test_char_and_word_tokenizers():
    c = CharTokenizer.train("hello world")
    assert c.decode(c.encode("low")) == "low"
    with pytest.raises(ValueError, match="'z'"):
        c.encode("z")
    with pytest.raises(ValueError, match="ids"):
        c.decode([99])
    with pytest.raises(ValueError, match="text"):
        CharTokenizer.train("")
    w = WordTokenizer.train("The cat sat on the mat.")
    assert w.decode(w.encode("The cat sat.")) == "The cat sat ."
    assert w.encode("The dog")[1] == w.stoi["<|unk|>"]


# --- the Tokenizer contract, over all three ------------------------------------------------------
CONTRACT_TRAIN = "The cat sat on the mat. It's 3.14, ça va? 🙂\n\tindented  twice"
CONTRACT_TEXTS = [
    "",
    "The cat sat.",
    "It's the mat?",
    "ça va 🙂",
    "the  cat\n\tsat  ",
    "mat, mat. cat",
]


def _word_survivors(tok: WordTokenizer, text: str) -> str:
    # WordTokenizer's documented loss: whitespace becomes single spaces, unknown words <|unk|>.
    return " ".join(w if w in tok.stoi else tok.UNK for w in tok.SPLIT.findall(text))


TOKENIZERS = {
    "char": (lambda: CharTokenizer.train(CONTRACT_TRAIN), lambda tok, text: text),
    "word": (lambda: WordTokenizer.train(CONTRACT_TRAIN), _word_survivors),
    "bpe": (lambda: BPETokenizer.train(CONTRACT_TRAIN * 3, 280), lambda tok, text: text),
}


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@pytest.mark.parametrize("text", CONTRACT_TEXTS + ["unseen words: dog, Ελληνικά"])
def test_tokenizer_contract(kind, text, tmp_path):
    make, survivors = TOKENIZERS[kind]
    tok = make()
    assert isinstance(tok, Tokenizer)
    if kind == "char" and not set(text) <= set(tok.vocab):
        with pytest.raises(ValueError, match="not in the vocabulary"):
            tok.encode(text)
        return
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == survivors(
        tok, text
    )  # the identity for char (on its alphabet) and BPE
    if kind != "word":
        assert len(ids) <= len(text.encode("utf-8"))  # no tokenizer here is longer than bytes
    loaded = type(tok).load(tok.save(tmp_path / f"{kind}.json"))
    assert loaded.vocab_size == tok.vocab_size and loaded.encode(text) == ids


@pytest.mark.parametrize("cls", [CharTokenizer, WordTokenizer])
def test_char_and_word_files_and_corrupt_files(cls, tmp_path):
    tok = cls.train("the cat sat")
    p = tok.save(tmp_path / "tok.json")
    assert cls.load(p).vocab == tok.vocab
    d = json.loads(p.read_text())
    assert d["format"] == cls.FORMAT and d["version"] == 1
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        cls.load(tmp_path / "bad.json")
    other = CharTokenizer if cls is WordTokenizer else WordTokenizer
    other.train("x").save(tmp_path / "other.json")
    with pytest.raises(ValueError, match="format"):
        cls.load(tmp_path / "other.json")
    for field, value, match in [
        ("version", 2, "version"),
        ("vocab", None, "lacks the field 'vocab'"),
        ("vocab", ["a", "a"], "field 'vocab'.*distinct|field 'vocab'.*duplicates"),
        ("vocab", [1, 2], "field 'vocab'"),
    ]:
        bad = dict(d)
        if value is None:
            del bad[field]
        else:
            bad[field] = value
        (tmp_path / "field.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            cls.load(tmp_path / "field.json")


_ALPHABET = CharTokenizer.train("abc xyz.,!\n🙂é")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abc xyz.,!\n🙂é", max_size=60))
def test_property_char_round_trip(text):
    assert _ALPHABET.decode(_ALPHABET.encode(text)) == text
    assert len(_ALPHABET.encode(text)) == len(text)


_WORDS = WordTokenizer.train("the cat sat on the mat. a dog!")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_property_word_keeps_its_documented_survivors(text):
    ids = _WORDS.encode(text)
    assert len(ids) == len(_WORDS.SPLIT.findall(text))
    assert _WORDS.decode(ids) == _word_survivors(_WORDS, text)


@pytest.fixture(scope="module")
def small_bpe(corpus):
    """A 300-token BPE of the corpus's first 30,000 characters, and its tiktoken twin."""
    tok = BPETokenizer.train(corpus[:30_000], 300)
    return tok, tok.to_tiktoken()


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_property_round_trip_any_text(small_bpe, text):
    tok, twin = small_bpe
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text) == twin.encode_ordinary(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=299), max_size=40))
def test_property_decode_never_raises_on_valid_ids(small_bpe, ids):
    assert isinstance(small_bpe[0].decode(ids), str)


def test_bytes_to_unicode_is_gpt2s_table():
    from transformers.convert_slow_tokenizer import bytes_to_unicode as hf_table

    from gptlib.tokenizers.bpe import bytes_to_unicode

    assert bytes_to_unicode() == hf_table()
