"""Chapter 9's toy task: sentence openings of the Brown corpus as prompts, and a program as the
labeller.

This is the chapter's stand-in for human raters, not a general tool; it lives here so that the
chapter
and ``scripts/rlhf_sweep.py`` use one copy of it. A prompt is ``prompt_len`` tokens that open a
sentence and end on a word boundary; a response is the next ``response_len`` tokens. The labeller
gives half a point for finishing a sentence and half for using only words of its dictionary (every
word of the training split), so a response scores 0, 1/2 or 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from ..runtime import check_int
from ..tokenizers import BPETokenizer

__all__ = [
    "PROMPT_LEN",
    "RESPONSE_LEN",
    "SentenceLabeller",
    "sentence_starts",
    "SentenceTask",
    "sentence_task",
]

PROMPT_LEN = RESPONSE_LEN = 16  # the chapter's lengths, in tokens


@dataclass(frozen=True)
class SentenceLabeller:
    """Scores a response text: 1/2 for finishing a sentence, 1/2 for using only ``known_words``.

    A response is cut after a fixed number of tokens, so a word running to its very end may be
    unfinished: that last word is not judged.

    >>> judge = SentenceLabeller.from_text("The jury said that it was over.")
    >>> judge(" the jury said. It was"), judge(" the jury said that it")  # last word is not judged
    (1.0, 0.5)
    >>> judge(" the jurry said. It"), judge(" the jurry said that")  # "jurry" is not a known word
    (0.5, 0.0)
    """

    known_words: frozenset[str]

    @classmethod
    def from_text(cls, text: str) -> SentenceLabeller:
        """A labeller whose dictionary is every word (a run of letters, lower-cased) of ``text``."""
        return cls(frozenset(re.findall(r"[a-z]+", text.lower())))

    def parts(self, response: str) -> tuple[bool, bool]:
        """The two halves of the score: (finishes a sentence, uses only known words).

        >>> SentenceLabeller.from_text("The jury said.").parts(" the jurry said. It")
        (True, False)
        """
        words = re.findall(r"[A-Za-z]+", response)
        if response[-1:].isalpha():
            words = words[:-1]
        real_words = all(w.lower() in self.known_words for w in words)
        ends_sentence = re.search(r"[.?!](\s|$)", response) is not None
        return ends_sentence, real_words

    def __call__(self, response: str) -> float:
        ends_sentence, real_words = self.parts(response)
        return 0.5 * ends_sentence + 0.5 * real_words


def sentence_starts(
    ids: Tensor, tokenizer: BPETokenizer, prompt_len: int, response_len: int
) -> Tensor:
    """(n,): every position o of the token stream ``ids`` (1-D) where a sentence opens a prompt.

    Token o - 1 ends a sentence (``.``, ``?``, ``!`` or a newline, spaces aside), tokens o and
    o + prompt_len start words, and a response of ``response_len`` tokens fits after the prompt.
    """
    check_int("prompt_len", prompt_len, lo=1)
    check_int("response_len", response_len, lo=1)
    token_text = [tokenizer.decode([t]) for t in range(tokenizer.vocab_size)]
    starts_word = torch.tensor([s[:1] in (" ", "\n") for s in token_text])  # (d_vocab,)
    ends_sentence = torch.tensor(
        [s.rstrip(" ").endswith((".", "?", "!", "\n")) for s in token_text]
    )
    o = torch.arange(1, len(ids) - prompt_len - response_len)
    return o[ends_sentence[ids[o - 1]] & starts_word[ids[o]] & starts_word[ids[o + prompt_len]]]


@dataclass(frozen=True, eq=False)
class SentenceTask:
    """The prompts, the labeller and the training split's sentence openings (see
    :func:`sentence_task`)."""

    tokenizer: BPETokenizer
    labeller: SentenceLabeller
    prompt_len: int
    response_len: int
    train_prompts: Tensor  # (n_train, prompt_len), from the training split
    eval_prompts: Tensor  # (n_eval, prompt_len), from the held-out split
    openings: Tensor  # (n, prompt_len + response_len): every sentence opening of the training split

    def judged(self, ids: Tensor) -> Tensor:
        """(B,) float32: the labeller's score of each response ``ids[:, prompt_len:]``, decoded."""
        responses = ids[:, self.prompt_len :].tolist()  # one conversion, not one per row
        return torch.tensor([self.labeller(self.tokenizer.decode(row)) for row in responses])

    def judged_parts(self, ids: Tensor) -> Tensor:
        """(B, 2) bool: for each response, whether it finishes a sentence and whether it uses only
        known
        words (:meth:`SentenceLabeller.parts`); :meth:`judged` is half their sum."""
        responses = ids[:, self.prompt_len :].tolist()
        return torch.tensor([self.labeller.parts(self.tokenizer.decode(row)) for row in responses])


def sentence_task(
    tokenizer: BPETokenizer,
    train_text: str,
    val_text: str,
    labeller: SentenceLabeller,
    prompt_len: int = PROMPT_LEN,
    response_len: int = RESPONSE_LEN,
    n_train: int = 500,
    n_eval: int = 100,
    seed: int = 0,
) -> SentenceTask:
    """The chapter's task: ``n_train`` prompts from the training text and ``n_eval`` from the
    held-out
    text, each drawn without replacement from the sentence openings (:func:`sentence_starts`) by one
    generator seeded with ``seed`` (training prompts first)."""
    check_int("n_train", n_train, lo=1)
    check_int("n_eval", n_eval, lo=1)
    ids_train, ids_val = (
        torch.tensor(tokenizer.encode(train_text)),
        torch.tensor(tokenizer.encode(val_text)),
    )
    train_starts = sentence_starts(ids_train, tokenizer, prompt_len, response_len)
    val_starts = sentence_starts(ids_val, tokenizer, prompt_len, response_len)
    g = torch.Generator().manual_seed(seed)
    train_prompts = _draw_prompts(ids_train, train_starts, n_train, prompt_len, g, "train_text")
    eval_prompts = _draw_prompts(ids_val, val_starts, n_eval, prompt_len, g, "val_text")
    openings = ids_train.unfold(0, prompt_len + response_len, 1)[
        train_starts
    ]  # (n, prompt_len + response_len)
    return SentenceTask(
        tokenizer, labeller, prompt_len, response_len, train_prompts, eval_prompts, openings
    )


def _draw_prompts(
    ids: Tensor, starts: Tensor, n: int, prompt_len: int, g: torch.Generator, name: str
) -> Tensor:
    """(n, prompt_len): the prompts at ``n`` of ``starts``, drawn without replacement."""
    if len(starts) < n:
        raise ValueError(
            f"{name} has {len(starts)} sentence openings, fewer than the {n} prompts asked for"
        )
    picked = starts[torch.randperm(len(starts), generator=g)[:n]]  # (n,)
    return ids[picked[:, None] + torch.arange(prompt_len)]  # (n, prompt_len)
