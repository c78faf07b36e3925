"""The files of one live model, written for the page: the graph's pieces, the tokenizer.json and,
last, the manifest, for the English GPT (:func:`export`) and SmolLM2-135M-Instruct
(:func:`export_smollm2`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..model import GPT
from ..runtime import atomic_write
from .graph import AHEAD, to_onnx, to_onnx_gguf
from .manifest import manifest
from .tokenizer import gguf_tokenizer_json, tokenizer_json

__all__ = ["PIECE_BYTES", "pieces", "export", "export_smollm2"]

PIECE_BYTES = 95_000_000  # GitHub Pages refuses files of 100 MB


def pieces(data: bytes, size: int = PIECE_BYTES) -> list[bytes]:
    """``data`` cut into consecutive pieces of at most ``size`` bytes (at least one piece).

    >>> [len(p) for p in pieces(bytes(10), 4)]
    [4, 4, 2]
    """
    if type(size) is not int or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    return [data[i : i + size] for i in range(0, max(len(data), 1), size)]


def _check_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not name
        or any(c in name for c in "/\\\0")
        or name.startswith(".")
    ):
        raise ValueError(f"name must be a plain file name, got {name!r}")
    return name


def _write_pieces(out_dir: Path, stem: str, listed: list[dict], parts: list[bytes]) -> list[Path]:
    """Write ``stem.0``, ``.1``, ... (each atomically); remove an earlier export's pieces beyond."""
    written = [atomic_write(out_dir / p["file"], data) for p, data in zip(listed, parts)]
    k = len(parts)
    while (out_dir / f"{stem}.{k}").is_file():  # a longer earlier export's tail
        (out_dir / f"{stem}.{k}").unlink()
        k += 1
    return written


def _write(
    out_dir: Path,
    name: str,
    model,
    tokenizer,
    onnx_bytes: bytes,
    tok: dict,
    external: tuple[list[dict], bytes] | None = None,
    optimized: str | None = None,
) -> list[Path]:
    """Write the pieces (of the graph, and of the blocks of ``external``: its table and blocks),
    the tokenizer.json and, last, the manifest (each atomically); remove pieces of an earlier
    export beyond the new ones."""
    tok_bytes = (json.dumps(tok, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    parts = pieces(onnx_bytes)
    blocks = None if external is None else (external[0], pieces(external[1]))
    info = manifest(model, tokenizer, name, parts, tok_bytes, blocks, optimized)
    written = _write_pieces(out_dir, f"{name}.onnx", info["onnx"]["pieces"], parts)
    listed = info["weights"]["blocks"]["pieces"] if blocks else []
    written += _write_pieces(out_dir, f"{name}.blocks", listed, blocks[1] if blocks else [])
    written.append(atomic_write(out_dir / info["tokenizer"]["file"], tok_bytes))
    text = json.dumps(info, ensure_ascii=False, sort_keys=True) + "\n"
    written.append(atomic_write(out_dir / f"{name}.json", text))
    return written


def export(model_dir: str | Path, out_dir: str | Path, name: str | None = None) -> list[Path]:
    """Write ``<name>.onnx.0``, ``<name>.tokenizer.json`` and ``<name>.json`` into ``out_dir``
    for the model (``GPT.load``) and tokenizer (``tokenizer.json``) in ``model_dir``. Everything
    is read and checked before anything is written; each file is written atomically, the manifest
    last. ``name`` (``None``: the name of ``model_dir``) must be a plain file name."""
    from ..tokenizers import BPETokenizer

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    name = _check_name(model_dir.resolve().name if name is None else name)
    model = GPT.load(model_dir).eval()  # checks model.safetensors once
    tokenizer = BPETokenizer.load(model_dir / "tokenizer.json")  # checks tokenizer.json once
    if tokenizer.vocab_size != model.config.d_vocab:
        raise ValueError(
            f"{model_dir / 'tokenizer.json'} has {tokenizer.vocab_size} tokens, the model in "
            f"{model_dir} d_vocab={model.config.d_vocab}"
        )
    return _write(out_dir, name, model, tokenizer, to_onnx(model), tokenizer_json(tokenizer))


def export_smollm2(out_dir: str | Path, name: str = "smollm2") -> list[Path]:
    """Write ``<name>.onnx.0``, ``<name>.blocks.0``, ``.1``, ..., ``<name>.tokenizer.json`` and
    ``<name>.json`` for SmolLM2-135M-Instruct from the cache that ``make smollm2`` fills: the model
    of :func:`gptlib.gguf.load_smollm2`, its quantized weights the GGUF's own blocks, which the
    page unpacks into the graph's external data (``<name>.weights``, never written); the graph
    optimized ahead of time (:func:`gptlib.export.graph.optimize_ahead`)."""
    from ..assets import asset_path
    from ..gguf import ASSET, load_smollm2

    name = _check_name(name)
    model, tokenizer = load_smollm2()
    onnx_bytes, tensors, blocks = to_onnx_gguf(model, asset_path(ASSET), f"{name}.weights")
    tok = gguf_tokenizer_json(tokenizer)
    external = (tensors, blocks)
    return _write(Path(out_dir), name, model, tokenizer, onnx_bytes, tok, external, AHEAD)
