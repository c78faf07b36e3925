"""Fuzzed texts: every one round-trips, and gets the same ids as tiktoken on the same ranks.

A seeded generator (rather than hypothesis' ``st.text``) builds each text from fragments of many
kinds, so that combinations random code points almost never produce come up often: a letter
newer than Python's ``unicodedata`` right before a contraction, emoji sequences with joiners,
digits of other scripts, runs of mixed whitespace, control characters, special-token text.

Texts hold no lone surrogates: UTF-8 cannot write them, and the byte-level BPE refuses them
(``test_tokenizers_checks.py`` tests that). The default run checks 1,000 texts; the run marked
``slow`` (which ``make test`` includes) checks 10,000 on GPT-2's tokenizer and on a trained one.
"""

import functools
import random
import unicodedata

import pytest
import regex
import tiktoken
import tiktoken.load

from gptlib.data import load_corpus
from gptlib.tokenizers import (
    BPETokenizer,
    encode_piece,
    get_stats,
    merge,
    merge_steps,
)


@functools.lru_cache(maxsize=1)
def newer_than_python() -> str:
    """Letters and numbers to the regex module that Python's own unicodedata leaves unassigned."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    return "".join(
        c for c in regex.findall(r"[\p{L}\p{N}]", every) if unicodedata.category(c) == "Cn"
    )


def _letters(rng, alphabet, lo, hi):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


FRAGMENTS = {
    "word": lambda rng: _letters(rng, "etaoinshrdlucmfwypvbgkjqxzETAOIN", 1, 9),
    "accent": lambda rng: rng.choice(
        ["café", "naïve", "e\u0301", "Ångström", "ñ", "ß", "ǅ", "İ", "ﬁ", "Ελλάδα"]
    ),
    "cjk": lambda rng: "".join(
        chr(
            rng.choice(
                [
                    rng.randrange(0x4E00, 0xA000),
                    rng.randrange(0x3040, 0x30A0),
                    rng.randrange(0xAC00, 0xD7A4),
                ]
            )
        )
        for _ in range(rng.randint(1, 6))
    ),
    "emoji": lambda rng: rng.choice(
        ["🙂", "👩\u200d👩\u200d👧", "🇩🇪", "👍🏽", "❤\ufe0f", "🚀", "🫠", "🧑🏿\u200d🚀"]
    ),
    "digits": lambda rng: rng.choice(
        [
            _letters(rng, "0123456789", 1, 7),
            "3.14",
            "1,000",
            "٣٤",
            "１２",
            "Ⅻ",
            "½",
            "²",
            "߀",
            "\U00011f50",
        ]
    ),
    "space": lambda rng: rng.choice(
        [
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\xa0",
            "\u2028",
            "\u3000",
            "   \n  ",
            "\x0b",
            "\x0c",
            "\n\n\n",
            " \t ",
        ]
    ),
    "control": lambda rng: rng.choice(
        [chr(rng.randrange(32)), "\x7f", "\x85", "\u200d", "\ufeff", "\u202e"]
    ),
    "newer": lambda rng: "".join(rng.choice(newer_than_python()) for _ in range(rng.randint(1, 3))),
    "contraction": lambda rng: rng.choice(
        ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", "’s", "'", "''"]
    ),
    "punct": lambda rng: rng.choice(
        [".", ",", "!?", "...", "—", "«", "»", "(", ")", "{}", "#", "**", "->", "$5"]
    ),
    "special": lambda rng: rng.choice(
        ["<|endoftext|>", "<|endoftext", "|>", "<|endoftext|><|endoftext|>"]
    ),
    "any": lambda rng: chr(rng.choice([rng.randrange(0xD800), rng.randrange(0xE000, 0x110000)])),
    "odd": lambda rng: rng.choice(
        ["\ue000", "\U000f0000", "\u0378", "\ufdd0", "\uffff", "\U0010ffff"]
    ),
    "long": lambda rng: rng.choice(
        [
            _letters(rng, "abcdefgh", 50, 400),
            _letters(rng, "日本語の文字列", 30, 200),
            " " * rng.randint(20, 100),
            _letters(rng, "0123456789", 30, 200),
        ]
    ),
}
KINDS = sorted(FRAGMENTS)


def fuzz_texts(n: int, seed: int) -> list[str]:
    """``n`` texts of 0 to 12 fragments each (a few with a leading space), reproducible from
    ``seed``."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        kinds = [rng.choice(KINDS) for _ in range(rng.randint(0, 12))]
        texts.append(
            "".join((" " if rng.random() < 0.3 else "") + FRAGMENTS[k](rng) for k in kinds)
        )
    return texts


@pytest.fixture(scope="module")
def trained():
    tok = BPETokenizer.train(load_corpus()[:50_000], 512)
    return tok, tok.to_tiktoken()


def by_pieces(tok: BPETokenizer, text: str) -> list[int]:
    """The ids by definition: the split's pieces, each merged by the Python loop encode_piece."""
    return [i for p in tok.split(text) for i in encode_piece(p.encode("utf-8"), tok.ranks)]


def check_texts(tok: BPETokenizer, enc: tiktoken.Encoding, texts: list[str]) -> None:
    for text in texts:
        ids = tok.encode(text)
        assert ids == enc.encode_ordinary(text) == by_pieces(tok, text), text
        assert tok.decode(ids) == text, text
        with_special = tok.encode(text, allowed_special="all")
        assert with_special == enc.encode(text, allowed_special="all"), text
        # decode is a function of the ids: its round trip is asked again only of other ids
        assert with_special == ids or tok.decode(with_special) == text, text


def test_generator_makes_the_hard_cases():
    texts = fuzz_texts(1000, seed=0)
    newer = set(newer_than_python())
    assert len(newer) > 20_000  # Unicode 15.0 to 18.0: letters Python 3.11 does not know
    contracted = [t for t in texts if any(a in newer and b == "'" for a, b in zip(t, t[1:]))]
    assert len(contracted) >= 10  # a newer letter right before an apostrophe
    assert sum("\u200d" in t for t in texts) >= 20 and sum(len(t) > 200 for t in texts) >= 20
    assert fuzz_texts(5, seed=1) == fuzz_texts(5, seed=1)


@pytest.mark.parametrize("seed", [0])
def test_fuzz_gpt2_equals_tiktoken(gpt2, r50k, seed):
    check_texts(gpt2, r50k, fuzz_texts(1000, seed))


@pytest.mark.parametrize("seed", [0])
def test_fuzz_trained_equals_its_tiktoken(trained, seed):
    check_texts(*trained, fuzz_texts(1000, seed))


@pytest.mark.slow
def test_fuzz_10000_texts_gpt2_and_trained(gpt2, r50k, trained):
    texts = fuzz_texts(10_000, seed=2024)
    check_texts(gpt2, r50k, texts)
    check_texts(*trained, texts)


# --- the fast merge loop equals the readable ones -------------------------------------------------
def by_merge_steps(piece: bytes, ranks: dict) -> list[int]:
    parts = [bytes([b]) for b in piece]
    for _ in merge_steps(parts, ranks):
        pass
    return [ranks[p] for p in parts]


def by_get_stats_and_merge(piece: bytes, ranks: dict, rule: dict) -> list[int]:
    """minbpe's loop: of the pairs present, merge (everywhere) the one made earliest."""
    ids = [ranks[bytes([b])] for b in piece]
    while len(ids) > 1:
        pair = min(get_stats(ids), key=lambda p: rule.get(p, float("inf")))
        if pair not in rule:
            break
        ids = merge(ids, pair, rule[pair])
    return ids


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2", "trained"])
def test_encode_piece_equals_the_readable_loops(which, request):
    tok = (
        request.getfixturevalue("gpt2")
        if which == "gpt2"
        else request.getfixturevalue("trained")[0]
    )
    rule = {pair: 256 + k for k, pair in enumerate(tok.merges)}
    pieces = {p.encode() for t in fuzz_texts(300, seed=5) for p in tok.split(t)}
    rng = random.Random(6)
    pieces |= {
        _letters(rng, "abcdeth ", 200, 600).encode() for _ in range(5)
    }  # long pieces, spaces inside
    for piece in sorted(pieces):
        fast = encode_piece(piece, tok.ranks)
        assert (
            fast
            == by_merge_steps(piece, tok.ranks)
            == by_get_stats_and_merge(piece, tok.ranks, rule)
        ), piece


def test_encode_of_a_long_text_equals_the_python_merges(trained):
    """Issue 41: encode merges a piece met for the first time in tiktoken's compiled code and
    caches it by the piece. On a corpus (most pieces met before, a few longer than the cache
    keeps) a fresh tokenizer, then the same one from its cache, give the Python loop's ids."""
    text = load_corpus()[:120_000] + " " + "ab" * 300 + "\n\n" + "é" * 70
    fresh = BPETokenizer(trained[0].ranks, trained[0].pattern, trained[0].special_tokens)
    want = by_pieces(fresh, text)
    assert fresh.encode(text) == want
    assert fresh.encode(text) == want
