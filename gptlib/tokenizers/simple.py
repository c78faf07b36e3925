"""The two simplest tokenizers: one token per character, and one per word or punctuation mark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import regex

from .base import _check_ids, _read_json, _write_json

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
        return self.SEP.join(self.vocab[i] for i in _check_ids(ids, self.vocab_size))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary as JSON (atomically)."""
        return _write_json(path, self.FORMAT, {"vocab": self.vocab})

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read a tokenizer written by :meth:`save`; a corrupt file fails naming what is wrong."""
        d = _read_json(path, cls.FORMAT, ["vocab"])
        try:
            return cls(d["vocab"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: field 'vocab': {e}") from None


class CharTokenizer(_ListTokenizer):
    """One token per character: V = the sorted set of characters of a training text.

    >>> tok = CharTokenizer.train("hello")
    >>> tok.vocab, tok.encode("hole")
    (['e', 'h', 'l', 'o'], [1, 3, 2, 0])
    """

    FORMAT, SEP = "gptlib-char", ""

    def __init__(self, vocab: Sequence[str]):
        vocab = list(vocab)
        if not vocab or any(not isinstance(c, str) or len(c) != 1 for c in vocab) or len(set(vocab)) != len(vocab):
            raise ValueError("vocab must be a non-empty list of distinct single characters")
        self.vocab = vocab
        self.stoi = {c: i for i, c in enumerate(vocab)}

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        """The tokenizer whose vocabulary is the set of characters of ``text``."""
        if not text:
            raise ValueError("text must not be empty")
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
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
        vocab = list(vocab)
        if any(not isinstance(w, str) or not w for w in vocab):
            raise ValueError("vocab must be a list of non-empty strings")
        if self.UNK not in vocab:
            vocab.append(self.UNK)
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not contain duplicates")
        self.vocab = vocab
        self.stoi = {w: i for i, w in enumerate(vocab)}

    @classmethod
    def train(cls, text: str) -> "WordTokenizer":
        """The tokenizer whose vocabulary is the set of words and marks of ``text``, plus ``<|unk|>``."""
        return cls(sorted(set(cls.SPLIT.findall(text))))

    def encode(self, text: str) -> list[int]:
        unk = self.stoi[self.UNK]
        return [self.stoi.get(w, unk) for w in self.SPLIT.findall(text)]
