"""Infrastructure for :mod:`gptlib.export`: SmolLM2's weights for the page as the GGUF's own
blocks, unpacked by the page into float32 initializers that the graph stores externally.

llama.cpp's Q4_1 stores a row in blocks of 32 numbers, 20 bytes each: the step d and the minimum m
as float16, then 16 bytes whose low nibbles are the block's numbers 0..15 and whose high nibbles
are 16..31; the number is w = d q + m, computed in float32 (a product, then a sum, each rounded
once, as :func:`gguf.quants.dequantize` computes it for the cached safetensors). Q8_0 stores d as
float16 and 32 int8 numbers, w = q d.

The page downloads the blocks (4.5 bits a weight), and unpacks them itself, off its main thread,
into the float32 bytes of one external-data file (:func:`unpack_external` is that unpacking in
numpy, the peer of the page's ``q4.js``); the graph's initializers of those weights name their
place in that file (:func:`store_gguf_blocks`), so that onnxruntime reads plain float32 weights:
no unpacking operators for it to fold, no float32 intermediates beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["BLOCK", "unpack_q4_1", "unpack_q8_0", "unpack_external", "store_gguf_blocks"]

BLOCK = 32  # numbers per block, Q4_1 and Q8_0
Q4_1_BYTES, Q8_0_BYTES = 20, 34

# the suffix of an initializer the graph stores as the transpose of the model's parameter
# (graph.py's _vocab_columns: the tied embedding W_E as W_E^T)
TRANSPOSED = ".T"

BLOCK_BYTES = {"Q4_1": Q4_1_BYTES, "Q8_0": Q8_0_BYTES}


def unpack_q4_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 bytes (..., n_blocks * 20) -> (nibbles (N, 16) uint8, d (N, 1) float16, m (N, 1)
    float16) for the N blocks in order.

    >>> dm = np.array([0.5, -1.0], np.float16).view(np.uint8)  # d = 0.5, m = -1
    >>> raw = np.concatenate([dm, [0x21], np.zeros(15, np.uint8)])  # numbers 0: 1 and 16: 2
    >>> q, d, m = unpack_q4_1(raw)
    >>> (d * (q[:, :1] & 15) + m).item(), (d * (q[:, :1] >> 4) + m).item()
    (-0.5, 0.0)
    """
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, Q4_1_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16)  # (N, 1)
    m = blocks[:, 2:4].copy().view(np.float16)
    return blocks[:, 4:].copy(), d, m


def unpack_q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes (..., n_blocks * 34) -> (numbers (N, 32) int8, d (N, 1) float16)."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, Q8_0_BYTES)
    return blocks[:, 2:].copy().view(np.int8), blocks[:, 0:2].copy().view(np.float16)


def _q4_1_values(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """d q + m in float32, (N, 32): the low nibbles are numbers 0..15, the high ones 16..31."""
    numbers = np.concatenate([q & 15, q >> 4], axis=1).astype(np.float32)
    return d.astype(np.float32) * numbers + m.astype(np.float32)


def _values(kind: str, raw: np.ndarray) -> np.ndarray:
    """The float32 numbers of ``raw``'s blocks in order, flat."""
    if kind == "Q4_1":
        return _q4_1_values(*unpack_q4_1(raw)).reshape(-1)
    if kind == "Q8_0":
        q, d = unpack_q8_0(raw)
        return (q.astype(np.float32) * d.astype(np.float32)).reshape(-1)
    raise ValueError(f"kind must be 'Q4_1' or 'Q8_0', got {kind!r}")


def _weight(kind: str, raw: np.ndarray, rows: int, cols: int, transpose: bool) -> np.ndarray:
    """The GGUF tensor (rows, cols) of ``raw``'s blocks, transposed to (cols, rows) if asked."""
    w = _values(kind, raw).reshape(rows, cols)
    return np.ascontiguousarray(w.T) if transpose else w


def unpack_external(blocks: bytes, tensors: list[dict]) -> bytes:
    """The external-data file of the graph (float32, little-endian) from the blocks and the
    manifest's table of ``tensors`` (each: ``type`` Q4_1 or Q8_0, the GGUF ``rows`` and ``cols``,
    ``transpose``, ``blocks_offset``, ``blocks_bytes``, ``offset``, ``bytes``): what the page's
    ``q4.js`` computes, in numpy.

    >>> dm = np.array([0.5, -1.0], np.float16).view(np.uint8)  # d = 0.5, m = -1
    >>> raw = np.concatenate([dm, np.arange(16, dtype=np.uint8) * 17]).tobytes()
    >>> t = dict(type="Q4_1", rows=1, cols=32, transpose=False, blocks_offset=0,
    ...          blocks_bytes=20, offset=0, bytes=128)
    >>> np.frombuffer(unpack_external(raw, [t]), "<f4")[[0, 1, 16, 31]].tolist()
    [-1.0, -0.5, -1.0, 6.5]
    """
    size = max((t["offset"] + t["bytes"] for t in tensors), default=0)
    out = np.zeros(size // 4, "<f4")
    src = np.frombuffer(blocks, np.uint8)
    for t in tensors:
        raw = src[t["blocks_offset"] : t["blocks_offset"] + t["blocks_bytes"]]
        w = _weight(t["type"], raw, t["rows"], t["cols"], t["transpose"])
        out[t["offset"] // 4 : (t["offset"] + t["bytes"]) // 4] = w.reshape(-1)
    return out.tobytes()


def store_gguf_blocks(
    graph, model, gguf_path: str | Path, location: str
) -> tuple[list[dict], bytes]:
    """Make the float32 initializers of ``model``'s quantized weights in ``graph`` (an ONNX
    GraphProto exported from :func:`gptlib.step.step`, initializers named ``model.<parameter>``)
    external: their bytes in the file ``location``, one after another, which the page makes from
    the GGUF file's own Q4_1 and Q8_0 blocks; F32 tensors stay in the graph. Each unpacked weight
    is checked to equal the initializer it replaces, bit for bit, before the graph is changed.
    Returns (the table of tensors, see :func:`unpack_external`; the blocks, concatenated)."""
    from gguf import GGMLQuantizationType, GGUFReader
    from onnx import TensorProto, numpy_helper

    from ..gguf import _gguf_names

    gguf_path = Path(gguf_path)
    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as e:
        raise ValueError(f"{gguf_path} is not a readable GGUF file: {e}") from None
    raw = {t.name: t for t in reader.tensors}
    inits = {i.name: i for i in graph.initializer}
    tensors, blocks, at, offset = [], [], 0, 0
    for ours, (theirs, transpose) in _gguf_names(model.config).items():
        if theirs not in raw:
            raise ValueError(f"{gguf_path} lacks tensor {theirs!r}")
        t, name = raw[theirs], f"model.{ours}"
        if name not in inits and name + TRANSPOSED in inits:  # graph.py's _vocab_columns
            name, transpose = name + TRANSPOSED, not transpose
        kind = t.tensor_type
        if kind == GGMLQuantizationType.F32:
            continue  # the norms' gains: float32 in the file and in the graph
        if kind not in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
            raise ValueError(f"{gguf_path}: {theirs!r} is {kind.name}; Q4_1, Q8_0 or F32 expected")
        if name not in inits:
            raise ValueError(f"the graph has no initializer {name!r} for {theirs!r}")
        want = numpy_helper.to_array(inits[name])  # float32, the model's layout
        if want.ndim != 2:
            raise ValueError(f"{name} has shape {want.shape}; a quantized weight is a matrix")
        rows, cols = want.shape[::-1] if transpose else want.shape  # the GGUF's row-major layout
        data = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        if not np.array_equal(_weight(kind.name, data, rows, cols, transpose), want):
            raise ValueError(
                f"{gguf_path}: {theirs!r} unpacked does not equal the model's {ours!r}; the model "
                "was not made from this file"
            )
        tensors.append(
            {
                "name": name,
                "type": kind.name,
                "rows": int(rows),
                "cols": int(cols),
                "transpose": bool(transpose),
                "blocks_offset": at,
                "blocks_bytes": int(data.size),
                "offset": offset,
                "bytes": int(want.size * 4),
            }
        )
        blocks.append(data.tobytes())
        at += data.size
        offset += want.size * 4
    for t in tensors:
        init = inits[t["name"]]
        init.ClearField("raw_data")
        init.ClearField("float_data")
        init.data_location = TensorProto.EXTERNAL
        del init.external_data[:]
        for key, value in (("location", location), ("offset", t["offset"]), ("length", t["bytes"])):
            entry = init.external_data.add()
            entry.key, entry.value = key, str(value)
    return tensors, b"".join(blocks)
