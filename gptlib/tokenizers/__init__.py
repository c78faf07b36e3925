"""Chapter 1: tokenizers, maps from texts to sequences of tokens and back.

Three tokenizers of increasing sophistication:

* :class:`CharTokenizer`: one token per character of a fixed alphabet;
* :class:`WordTokenizer`: one token per word or punctuation mark, with an unknown-word token;
* :class:`BPETokenizer`: byte-level byte-pair encoding as in GPT-2. The base vocabulary is the
  256 bytes, so every text has an encoding; training adds one merged token per step.

All three follow the :class:`Tokenizer` protocol (``base.py``): ``train`` learns one from text,
``encode`` and ``decode`` map between texts and ids, ``save`` and ``load`` store it as JSON.
The character and word tokenizers live in ``simple.py``, byte-level BPE in ``bpe.py``.
"""

from .base import Tokenizer
from .bpe import GPT2_SPLIT_PATTERN, BPETokenizer, get_stats, gpt2_tokenizer, merge, merge_steps
from .simple import CharTokenizer, WordTokenizer

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "Tokenizer",
    "get_stats",
    "merge",
    "merge_steps",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "gpt2_tokenizer",
]
