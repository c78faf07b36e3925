"""Infrastructure for :mod:`gptlib.export`: SmolLM2's weights in the ONNX graph as the GGUF's own
blocks, unpacked by the graph.

llama.cpp's Q4_1 stores a row in blocks of 32 numbers, 20 bytes each: the step d and the minimum m
as float16, then 16 bytes whose low nibbles are the block's numbers 0..15 and whose high nibbles
are 16..31; the number is w = d q + m, computed in float32 (a product, then a sum, each rounded
once, as :func:`gguf.quants.dequantize` computes it for the cached safetensors). Q8_0 stores d as
float16 and 32 int8 numbers, w = q d. Here each quantized weight becomes three (two) initializers,
the packed bytes, d and m, and a few plain operators (Cast, Mul, Floor, Add, Concat, Reshape,
Transpose) that rebuild the float32 weight under the name the graph uses. Their inputs are all
constants, so onnxruntime folds them once, when it creates the session: the page downloads 4.5
bits a weight and multiplies in float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["BLOCK", "unpack_q4_1", "unpack_q8_0", "store_gguf_blocks"]

BLOCK = 32  # numbers per block, Q4_1 and Q8_0
Q4_1_BYTES, Q8_0_BYTES = 20, 34


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
    """What the graph computes, in numpy: d q + m in float32, (N, 32)."""
    qf = q.astype(np.float32)
    hi = np.floor(qf * np.float32(1 / 16))
    lo = qf + hi * np.float32(-16)
    return d.astype(np.float32) * np.concatenate([lo, hi], axis=1) + m.astype(np.float32)


def _nodes_q4_1(name: str, transpose: bool) -> list:
    """Nodes that rebuild ``name`` from ``name.q4``, ``.d``, ``.m`` and its GGUF shape
    ``name.shape``, transposed to the model's layout if ``transpose``."""
    from onnx import TensorProto, helper

    n = lambda op, ins, out, **kw: helper.make_node(op, ins, [f"{name}.{out}"], **kw)  # noqa: E731
    last = [f"{name}.w"] if not transpose else [f"{name}.wt"]
    nodes = [
        n("Cast", [f"{name}.q4"], "qf", to=TensorProto.FLOAT),  # (N, 16): 16 hi + lo
        n("Mul", [f"{name}.qf", f"{name}.sixteenth"], "qs"),
        n("Floor", [f"{name}.qs"], "hi"),  # the high nibbles: numbers 16..31
        n("Mul", [f"{name}.hi", f"{name}.minus16"], "hi16"),
        n("Add", [f"{name}.qf", f"{name}.hi16"], "lo"),  # the low nibbles: numbers 0..15
        n("Concat", [f"{name}.lo", f"{name}.hi"], "q", axis=1),  # (N, 32)
        n("Cast", [f"{name}.d"], "d32", to=TensorProto.FLOAT),
        n("Cast", [f"{name}.m"], "m32", to=TensorProto.FLOAT),
        n("Mul", [f"{name}.d32", f"{name}.q"], "dq"),
        n("Add", [f"{name}.dq", f"{name}.m32"], "flat"),  # d q + m
        helper.make_node("Reshape", [f"{name}.flat", f"{name}.shape"], last),
    ]
    if transpose:
        nodes.append(helper.make_node("Transpose", last, [name], perm=[1, 0]))
    else:
        nodes[-1].output[0] = name
    return nodes


def store_gguf_blocks(graph, model, gguf_path: str | Path) -> dict[str, str]:
    """Replace the float32 initializers of ``model``'s quantized weights in ``graph`` (an ONNX
    GraphProto exported from :func:`gptlib.step.step`, initializers named ``model.<parameter>``)
    by the GGUF file's own Q4_1 and Q8_0 blocks and the nodes that unpack them; F32 tensors stay
    as they are. Each unpacked weight is checked to equal the initializer it replaces, bit for bit,
    before the graph is changed. Returns parameter name -> GGUF type."""
    from gguf import GGMLQuantizationType, GGUFReader
    from onnx import helper, numpy_helper

    from ..gguf import _gguf_names

    gguf_path = Path(gguf_path)
    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as e:
        raise ValueError(f"{gguf_path} is not a readable GGUF file: {e}") from None
    raw = {t.name: t for t in reader.tensors}
    inits = {i.name: i for i in graph.initializer}
    new_inits, new_nodes, replaced, types = [], [], set(), {}
    for ours, (theirs, transpose) in _gguf_names(model.config).items():
        if theirs not in raw:
            raise ValueError(f"{gguf_path} lacks tensor {theirs!r}")
        t, name = raw[theirs], f"model.{ours}"
        kind = t.tensor_type
        types[ours] = kind.name
        if kind == GGMLQuantizationType.F32:
            continue  # the norms' gains: float32 in the file and in the graph
        if name not in inits:
            raise ValueError(f"the graph has no initializer {name!r} for {theirs!r}")
        want = numpy_helper.to_array(inits[name])  # float32, the model's layout
        if want.ndim != 2:
            raise ValueError(f"{name} has shape {want.shape}; a quantized weight is a matrix")
        rows_cols = want.shape[::-1] if transpose else want.shape  # the GGUF's row-major layout
        if kind == GGMLQuantizationType.Q4_1:
            q, d, m = unpack_q4_1(t.data)
            values = _q4_1_values(q, d, m)
            nodes = _nodes_q4_1(name, transpose)
            consts = [
                numpy_helper.from_array(q, f"{name}.q4"),
                numpy_helper.from_array(d, f"{name}.d"),
                numpy_helper.from_array(m, f"{name}.m"),
                numpy_helper.from_array(np.array(1 / 16, np.float32), f"{name}.sixteenth"),
                numpy_helper.from_array(np.array(-16, np.float32), f"{name}.minus16"),
            ]
        elif kind == GGMLQuantizationType.Q8_0:
            q, d = unpack_q8_0(t.data)
            values = q.astype(np.float32) * d.astype(np.float32)
            last = f"{name}.w" if transpose else name
            nodes = [
                helper.make_node("Cast", [f"{name}.q8"], [f"{name}.q"], to=1),
                helper.make_node("Cast", [f"{name}.d"], [f"{name}.d32"], to=1),
                helper.make_node("Mul", [f"{name}.q", f"{name}.d32"], [f"{name}.flat"]),
                helper.make_node("Reshape", [f"{name}.flat", f"{name}.shape"], [last]),
            ]
            if transpose:
                nodes.append(helper.make_node("Transpose", [last], [name], perm=[1, 0]))
            consts = [
                numpy_helper.from_array(q, f"{name}.q8"),
                numpy_helper.from_array(d, f"{name}.d"),
            ]
        else:
            raise ValueError(f"{gguf_path}: {theirs!r} is {kind.name}; Q4_1, Q8_0 or F32 expected")
        values = values.reshape(rows_cols)
        if not np.array_equal((values.T if transpose else values), want):
            raise ValueError(
                f"{gguf_path}: {theirs!r} unpacked does not equal the model's {ours!r}; the model "
                "was not made from this file"
            )
        consts.append(numpy_helper.from_array(np.array(rows_cols, np.int64), f"{name}.shape"))
        new_inits += consts
        new_nodes += nodes
        replaced.add(name)
    kept = [i for i in graph.initializer if i.name not in replaced]
    graph.ClearField("initializer")
    graph.initializer.extend(kept + new_inits)
    nodes = new_nodes + list(graph.node)
    graph.ClearField("node")
    graph.node.extend(nodes)
    return types
