"""The page's tokenizers in Hugging Face's ``tokenizer.json`` format, which @huggingface/tokenizers
reads: the book's :class:`~gptlib.tokenizers.BPETokenizer` and SmolLM2's
:class:`~gptlib.tokenizers.gguf.GGUFTokenizer`. Both are byte-level BPEs (:func:`byte_level_bpe`):
``Split`` pre-tokenizers (pieces kept), GPT-2's byte alphabet (``ByteLevel`` without its own regex)
and a ``BPE`` model whose merges are in rank order.
"""

from __future__ import annotations

__all__ = ["byte_level_bpe", "tokenizer_json", "gguf_tokenizer_json"]


def _split(pattern: str) -> dict:
    """A pre-tokenizer that cuts the text at ``pattern``'s matches, keeping them as pieces."""
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level() -> dict:
    """GPT-2's byte alphabet, both ways, without ByteLevel's own regex."""
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }


def byte_level_bpe(
    patterns: list[str], vocab: dict[str, int], merges: list[list[str]], added: list[dict] = ()
) -> dict:
    """The ``tokenizer.json`` of a byte-level BPE: the text cut at each of ``patterns`` in turn,
    each piece's bytes in GPT-2's byte alphabet, then a ``BPE`` with ``vocab`` (token -> id, tokens
    in that alphabet) and ``merges`` in rank order; ``ignore_merges`` takes a piece that is a token
    whole. ``added`` are the added tokens (matched before any split).

    >>> d = byte_level_bpe([r"\\s+"], {"a": 0, "b": 1, "ab": 2}, [["a", "b"]])
    >>> [p["type"] for p in d["pre_tokenizer"]["pretokenizers"]], d["model"]["merges"]
    (['Split', 'ByteLevel'], [['a', 'b']])
    """
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": list(added),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [_split(p) for p in patterns] + [_byte_level()],
        },
        "post_processor": None,
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def tokenizer_json(tokenizer) -> dict:
    """A :class:`~gptlib.tokenizers.BPETokenizer` in Hugging Face's ``tokenizer.json`` format.

    The split pattern becomes a ``Split`` pre-tokenizer (pieces kept, "Isolated"), the bytes of each
    piece GPT-2's byte alphabet (``ByteLevel`` without its own regex), and the model a ``BPE`` with
    the vocabulary and the merges in rank order; ``ignore_merges`` takes a piece that is a token
    whole, as :meth:`BPETokenizer.encode` does. Special tokens are not listed as added tokens, so
    their text is encoded as ordinary text, as ``encode`` does by default; their ids stay in the
    manifest's token list.

    >>> from gptlib.tokenizers import BPETokenizer
    >>> tok = BPETokenizer.train("hug hugs hugged", 259, special_tokens=())
    >>> d = tokenizer_json(tok)  # spaces in GPT-2's byte alphabet: "Ġ"
    >>> d["model"]["merges"], d["model"]["vocab"]["Ġhug"]
    ([['h', 'u'], ['hu', 'g'], ['Ġ', 'hug']], 258)
    """
    from ..tokenizers.bpe import BPETokenizer, bytes_to_unicode

    if not isinstance(tokenizer, BPETokenizer):
        raise ValueError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    byte = bytes_to_unicode()
    name = lambda i: "".join(byte[b] for b in tokenizer.vocab[i])  # noqa: E731
    vocab = {name(i): i for i in range(len(tokenizer.ranks))}
    merges = [[name(a), name(b)] for a, b in tokenizer.merges]
    return byte_level_bpe([tokenizer.pattern], vocab, merges)


def gguf_tokenizer_json(tokenizer) -> dict:
    r"""A :class:`~gptlib.tokenizers.GGUFTokenizer` (SmolLM2's) in Hugging Face's
    ``tokenizer.json`` format, splitting as :meth:`GGUFTokenizer.encode` with
    ``allowed_special="all"`` does: the special tokens as added tokens (``special: true``), each
    digit a piece of its own (a ``Split`` on ``\p{N}``), GPT-2's split pattern, GPT-2's byte
    alphabet, and a ``BPE`` with the file's vocabulary and merges in rank order.

    >>> from gptlib.tokenizers.gguf import GGUFTokenizer
    >>> tokens = [chr(0x100 + b) if b < 33 else chr(b) for b in range(33, 40)] + ["#$", "<|x|>"]
    >>> tok = GGUFTokenizer(tokens, ["# $"], [1] * 8 + [3])
    >>> d = gguf_tokenizer_json(tok)
    >>> d["added_tokens"][0]["content"], d["added_tokens"][0]["id"], d["model"]["merges"]
    ('<|x|>', 8, [['#', '$']])
    """
    from ..tokenizers.bpe import GPT2_SPLIT_PATTERN
    from ..tokenizers.gguf import GGUFTokenizer

    if not isinstance(tokenizer, GGUFTokenizer):
        raise ValueError(f"tokenizer must be a GGUFTokenizer, got {type(tokenizer).__name__}")
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t, i in sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1])
    ]
    vocab = {t: i for i, t in reversed(list(enumerate(tokenizer.tokens)))}
    merges = [m.split(" ") for m in tokenizer.merges]
    return byte_level_bpe([r"\p{N}", GPT2_SPLIT_PATTERN], vocab, merges, added)
