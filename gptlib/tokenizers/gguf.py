"""The byte-level BPE tokenizer stored in a GGUF file's metadata (Chapter 12's SmolLM2).

llama.cpp keeps a model's tokenizer as key-value metadata (``tokenizer.ggml.*``): the token
strings in GPT-2's printable byte form, the merges and each token's type. :class:`GGUFTokenizer`
rebuilds it on top of :class:`gptlib.tokenizers.BPETokenizer`; :mod:`gptlib.gguf` reads the file.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import regex

from ..runtime import atomic_write, check_file
from .base import token_text
from .bpe import GPT2_SPLIT_PATTERN, BPETokenizer, bytes_to_unicode

__all__ = ["GGUFTokenizer", "CONTROL", "USER_DEFINED"]


CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types of special tokens


class GGUFTokenizer:
    """The byte-level BPE tokenizer stored in a GGUF file's metadata (``tokenizer.ggml.*``).

    Ordinary tokens are GPT-2-style byte strings; merge k joins two tokens into one. Encoding
    splits off special tokens (when allowed), then digits (one piece each: SmolLM2's
    pre-tokenizer, ``tokenizer.ggml.pre = "smollm"``), then applies GPT-2's split pattern and the
    merges through :class:`BPETokenizer`, whose ranks are 0…255 for the bytes and 256 + k for the
    result of merge k. ``ids`` maps those ranks to the file's token ids.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        bos_id: int | None = None,
        eos_id: int | None = None,
        chat_template: str | None = None,
    ):
        tokens, merges, token_types = list(tokens), list(merges), list(token_types)
        if not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError("tokens must be a non-empty list of non-empty strings")
        if not all(isinstance(m, str) for m in merges):
            raise ValueError("merges must be strings 'left right'")
        if len(token_types) != len(tokens):
            raise ValueError(
                f"token_types must have one entry per token ({len(tokens)}), got {len(token_types)}"
            )
        bad = next(
            (t for t in token_types if isinstance(t, bool) or not isinstance(t, numbers.Integral)),
            None,
        )
        if bad is not None:
            raise ValueError(f"token_types must be ints, got {bad!r}")
        for name, i in (("bos_id", bos_id), ("eos_id", eos_id)):
            if i is not None and (
                isinstance(i, bool)
                or not isinstance(i, numbers.Integral)
                or not 0 <= i < len(tokens)
            ):
                raise ValueError(f"{name} must be None or an int in [0, {len(tokens)}), got {i!r}")
        if chat_template is not None and not isinstance(chat_template, str):
            raise ValueError(
                f"chat_template must be a str or None, got {type(chat_template).__name__}"
            )
        char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
        self.tokens, self.merges = tokens, merges
        self.token_types = [int(t) for t in token_types]
        self.bos_id = None if bos_id is None else int(bos_id)
        self.eos_id = None if eos_id is None else int(eos_id)
        self.chat_template = chat_template
        self.special_tokens = {
            t: i
            for i, (t, ty) in enumerate(zip(tokens, token_types))
            if ty in (CONTROL, USER_DEFINED)
        }
        self.vocab: list[bytes] = []
        by_bytes: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            if i in self.special_tokens.values():
                self.vocab.append(t.encode("utf-8"))
                continue
            try:
                b = bytes(char_to_byte[c] for c in t)
            except KeyError:
                raise ValueError(f"token {i} ({t!r}) is not a byte-level BPE token") from None
            self.vocab.append(b)
            by_bytes.setdefault(b, i)
        # Bytes without a token of their own (SmolLM2 lacks 21: control characters and lead bytes
        # of rare or invalid UTF-8 sequences) take part in no merge; encoding drops them, as
        # Hugging Face's tokenizer without an unknown token does.
        self.missing_bytes = [b for b in range(256) if bytes([b]) not in by_bytes]
        ranks = {bytes([b]): b for b in range(256)}
        token_set = set(tokens)
        for k, m in enumerate(merges):
            parts = m.split(" ")
            if (
                len(parts) != 2
                or parts[0] not in token_set
                or parts[1] not in token_set
                or parts[0] + parts[1] not in token_set
            ):
                raise ValueError(
                    f"merge {k} ({m!r}) must join two tokens into a token of the vocabulary"
                )
            b = bytes(char_to_byte[c] for c in parts[0] + parts[1])
            if b in ranks:
                raise ValueError(
                    f"merge {k} ({m!r}) makes a token that an earlier merge or byte already made"
                )
            ranks[b] = 256 + k
        self.bpe = BPETokenizer(ranks, GPT2_SPLIT_PATTERN, name="gguf-bpe")
        self.ids = [
            by_bytes.get(b, -1) for b, _ in sorted(ranks.items(), key=lambda kv: kv[1])
        ]  # rank -> token id (-1: none)
        self._digits = regex.compile(r"\p{N}|[^\p{N}]+")
        self._special_split = (
            re.compile(
                "("
                + "|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True))
                + ")"
            )
            if self.special_tokens
            else None
        )

    @classmethod
    def from_metadata(cls, metadata: dict, source: str = "metadata") -> GGUFTokenizer:
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"{source}: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), got {model!r}"
            )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            if key not in metadata:
                raise ValueError(f"{source} lacks the metadata key {key!r}")
        try:
            return cls(
                metadata["tokenizer.ggml.tokens"],
                metadata["tokenizer.ggml.merges"],
                metadata["tokenizer.ggml.token_type"],
                metadata.get("tokenizer.ggml.bos_token_id"),
                metadata.get("tokenizer.ggml.eos_token_id"),
                metadata.get("tokenizer.chat_template"),
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, allowed_special: str | set[str] = frozenset()) -> list[int]:
        """Text -> token ids; special-token strings count as special only if in ``allowed_special``
        (or ``"all"``)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        if allowed - set(self.special_tokens):
            raise ValueError(
                "allowed_special names unknown special tokens "
                f"{sorted(allowed - set(self.special_tokens))}"
            )
        parts = self._special_split.split(text) if allowed and self._special_split else [text]
        out: list[int] = []
        for part in parts:
            if part in allowed:
                out.append(self.special_tokens[part])
                continue
            for piece in self._digits.findall(part):
                out.extend(
                    i for i in (self.ids[r] for r in self.bpe.encode_ordinary(piece)) if i >= 0
                )
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text (invalid UTF-8 becomes U+FFFD)."""
        ids = list(ids)
        bad = [
            i
            for i in ids
            if isinstance(i, bool)
            or not isinstance(i, numbers.Integral)
            or not 0 <= i < len(self.vocab)
        ]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self.vocab)}), got {bad[:5]}")
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    def token_str(self, i: int) -> str:
        """Token ``i`` as text, a byte outside a whole UTF-8 character as ``<0xNN>``
        (:func:`gptlib.tokenizers.base.token_text`)."""
        self.decode([i])  # (checks i)
        return token_text(self.vocab[i])

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the instruct model was trained on, rendered from the file's Jinja
        template."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.tokens[self.bos_id] if self.bos_id is not None else "",
            eos_token=self.tokens[self.eos_id] if self.eos_id is not None else "",
        )

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "merges": self.merges,
            "token_types": self.token_types,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "chat_template": self.chat_template,
        }

    def to_json(self) -> bytes:
        """The JSON file :meth:`save` writes (UTF-8); the same tokenizer always gives the same
        bytes."""
        return json.dumps(self.to_dict(), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "JSON") -> GGUFTokenizer:
        """The tokenizer :meth:`to_json` wrote; anything else raises ``ValueError`` naming
        ``source``."""
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            return cls(**d)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{source} is not a GGUFTokenizer file: {e}") from None

    def save(self, path: str | Path) -> Path:
        return atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> GGUFTokenizer:
        path = check_file(path)
        return cls.from_json(path.read_bytes(), str(path))
