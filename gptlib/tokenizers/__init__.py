"""Chapter 1: tokenizers, maps from texts to sequences of tokens and back.

Three tokenizers of increasing sophistication:

* :class:`CharTokenizer`: one token per character of a fixed alphabet;
* :class:`WordTokenizer`: one token per word or punctuation mark, with an unknown-word token;
* :class:`BPETokenizer`: byte-level byte-pair encoding as in GPT-2. The base vocabulary is the
  256 bytes, so every text has an encoding; training adds one merged token per step.

All three follow the :class:`Tokenizer` protocol (``base.py``): ``train`` learns one from text,
``encode`` and ``decode`` map between texts and ids, ``save`` and ``load`` store it as JSON.
``base.py`` also holds what they share: the checks of texts and ids (every id below
``vocab_size`` is a token; bools and floats are refused) and the split of a text by a pattern,
which must cover the text. The character and word tokenizers live in ``simple.py``, byte-level
BPE in ``bpe.py``, and its merge loop in ``merges.py``, twice: readable (:func:`merge_steps`) and
fast (:func:`encode_piece`).
"""

from .base import Tokenizer
from .bpe import GPT2_SPLIT_PATTERN, BPETokenizer, gpt2_tokenizer
from .merges import encode_piece, get_stats, merge, merge_steps
from .simple import CharTokenizer, WordTokenizer

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "Tokenizer",
    "get_stats",
    "merge",
    "merge_steps",
    "encode_piece",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "gpt2_tokenizer",
]
