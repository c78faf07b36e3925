"""The two simplest tokenizers: one token per character, and one per word or punctuation mark."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import regex

from .base import _read_json, _write_json, as_ids, check_text

__all__ = ["CharTokenizer", "WordTokenizer"]


class _ListTokenizer:
    """What the character and word tokenizers share: a list of token strings, id = position."""

    FORMAT: str  # the "format" field of the JSON file
    SEP: str  # what decode puts between tokens
    vocab: list[str]
    stoi: dict[str, int]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; ``ids`` must be ints in [0, vocab_size) (a list, iterator or 1-D
        tensor)."""
        return self.SEP.join(self.vocab[i] for i in as_ids(ids, self.vocab_size))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary as JSON (atomically)."""
        return _write_json(path, self.FORMAT, {"vocab": self.vocab})

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read a tokenizer written by :meth:`save`; a corrupt file fails naming what is wrong."""
        d = _read_json(path, cls.FORMAT, {"vocab": list})
        try:
            tok = cls(d["vocab"])
        except ValueError as e:
            raise ValueError(f"{path}: field 'vocab': {e}") from None
        cls._check_file_vocab(path, d["vocab"])
        return tok

    @classmethod
    def _check_file_vocab(cls, path, vocab: list) -> None:
        """What a file's vocabulary needs beyond what the constructor checks (nothing, by
        default)."""


class CharTokenizer(_ListTokenizer):
    """One token per character: V = the sorted set of characters of a training text.

    >>> tok = CharTokenizer.train("hello")
    >>> tok.vocab, tok.encode("hole")
    (['e', 'h', 'l', 'o'], [1, 3, 2, 0])
    """

    FORMAT, SEP = "gptlib-char", ""

    def __init__(self, vocab: Sequence[str]):
        vocab = list(vocab)  # (a str is a sequence of characters: CharTokenizer("abc") is fine)
        if (
            not vocab
            or any(not isinstance(c, str) or len(c) != 1 for c in vocab)
            or len(set(vocab)) != len(vocab)
        ):
            raise ValueError(
                f"vocab must be a non-empty list of distinct single characters, got {vocab!r:.80}"
            )
        self.vocab = vocab
        self.stoi = {c: i for i, c in enumerate(vocab)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the set of characters of ``text``."""
        if not check_text(text):
            raise ValueError("text must not be empty")
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in check_text(text)]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None


class WordTokenizer(_ListTokenizer):
    """One token per word or punctuation mark; words not seen in training become ``<|unk|>``.

    Decoding puts single spaces between words, so it is not an inverse: whitespace is lost and
    unknown words come back as ``<|unk|>``. What survives is
    ``" ".join(w if w in tok.stoi else tok.UNK for w in tok.SPLIT.findall(text))``.

    >>> tok = WordTokenizer.train("the cat sat. the end")
    >>> tok.decode(tok.encode("the dog sat."))
    'the <|unk|> sat .'
    """

    SPLIT = regex.compile(r"\w+|[^\w\s]")
    UNK = "<|unk|>"
    FORMAT, SEP = "gptlib-word", " "

    def __init__(self, vocab: Sequence[str]):
        if isinstance(vocab, str):
            raise ValueError(f"vocab must be a list of words, got the str {vocab!r:.40}")
        vocab = list(vocab)
        for w in vocab:
            # A token no split produces could never be encoded: refuse it (the unknown token aside).
            if not isinstance(w, str) or (w != self.UNK and not self.SPLIT.fullmatch(w)):
                raise ValueError(
                    f"vocab must hold single words or marks (as SPLIT cuts them), got {w!r}"
                )
        if self.UNK not in vocab:
            vocab.append(self.UNK)
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not contain duplicates")
        self.vocab = vocab
        self.stoi = {w: i for i, w in enumerate(vocab)}

    @classmethod
    def train(cls, text: str) -> WordTokenizer:
        """The tokenizer whose vocabulary is the set of words and marks of ``text``, plus
        ``<|unk|>``."""
        return cls(sorted(set(cls.SPLIT.findall(check_text(text)))))

    def encode(self, text: str) -> list[int]:
        unk = self.stoi[self.UNK]
        return [self.stoi.get(w, unk) for w in self.SPLIT.findall(check_text(text))]

    @classmethod
    def _check_file_vocab(cls, path, vocab: list) -> None:
        # The constructor appends <|unk|> to a word list without it; a file written by save always
        # lists it, and one without it would load with a different vocab_size.
        if cls.UNK not in vocab:
            raise ValueError(f"{path}: field 'vocab' lacks the unknown-word token {cls.UNK!r}")
