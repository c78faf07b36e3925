"""The live step as an ONNX graph: ``torch.onnx.export`` of :func:`gptlib.step.step` for a model,
its weights stored as float16 where float16 holds them exactly (:func:`to_onnx`), or (SmolLM2,
:func:`to_onnx_gguf`) its quantized weights as float32 initializers in an external-data file that
the page makes from the GGUF's own Q4_1 and Q8_0 blocks (:mod:`gptlib.export.q4`), optimized by
onnxruntime ahead of time (:func:`optimize_ahead`). The bytes are deterministic (no stack traces or
other export metadata).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..model import GPT
from ..modern import ModernGPT
from ..runtime import check_finite_weights
from ..step import INPUTS, OUTPUTS, _check_model, _shape, _step
from .q4 import TRANSPOSED

__all__ = ["AHEAD", "to_onnx", "to_onnx_gguf", "optimize_ahead"]

# onnxruntime's optimization level applied to SmolLM2's graph at export (:func:`optimize_ahead`),
# which the page then loads with its optimizations off: "extended" rewrites the graph with
# onnxruntime's own fused operators and no layout of a particular processor ("all" adds those)
AHEAD = "extended"


class _Step(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, past, head_mask, lens, targets, queries, head) -> tuple[Tensor, ...]:
        out = _step(self.model, ids, past, head_mask, lens, targets, queries, head)
        return tuple(out[k] for k in OUTPUTS)


def _strip_metadata(proto) -> None:
    """Drop what varies between runs or machines: stack traces, FX names, doc strings."""
    proto.ClearField("metadata_props")
    proto.doc_string = ""
    graph = proto.graph
    graph.ClearField("metadata_props")
    graph.doc_string = ""
    for node in graph.node:
        node.ClearField("metadata_props")
        node.doc_string = ""
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        value.ClearField("metadata_props")
        value.doc_string = ""
    for init in graph.initializer:
        init.ClearField("metadata_props")
        init.doc_string = ""


def _store_float16(graph) -> int:
    """Store every float32 initializer that float16 holds exactly as float16, cast back to float32
    by a Cast node under its old name; returns how many were converted."""
    from onnx import TensorProto, helper, numpy_helper

    kept, casts = [], []
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            w = numpy_helper.to_array(init)
            h = w.astype(np.float16)
            if np.array_equal(h.astype(np.float32), w):
                half = numpy_helper.from_array(h, f"{init.name}.fp16")
                kept.append(half)
                casts.append(
                    helper.make_node(
                        "Cast",
                        [half.name],
                        [init.name],
                        name=f"{init.name}.cast",
                        to=TensorProto.FLOAT,
                    )
                )
                continue
        kept.append(init)
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    graph.ClearField("node")
    graph.node.extend(nodes)
    return len(casts)


def _export_proto(model: nn.Module):
    """torch.onnx.export (dynamo) of :func:`step` for ``model``, as an onnx ModelProto."""
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    if n_ctx < 4:
        raise ValueError(
            f"model.config.n_ctx must be >= 4 to export a graph with variable lengths, got {n_ctx}"
        )
    # example sizes above 1 so that torch.export keeps every length symbolic
    example = (
        torch.zeros((1, 2), dtype=torch.int64),
        torch.zeros((2, L, 2, n_kv, d_head)),
        torch.ones((L, H)),
        torch.zeros((2,), dtype=torch.int64),
        torch.zeros((2,), dtype=torch.int64),
        torch.zeros((2,), dtype=torch.int64),
        torch.zeros((2, 4), dtype=torch.int64),
    )
    Dim = torch.export.Dim
    dims = {
        "ids": {1: Dim("T", min=1, max=n_ctx)},
        "past": {0: Dim("P", min=0, max=n_ctx - 1)},
        "head_mask": None,
        "lens": {0: Dim("n", min=0, max=1024)},
        "targets": {0: Dim("m", min=0, max=max(V, 4))},
        "queries": {0: Dim("r", min=0, max=n_ctx)},
        "head": {0: Dim("s", min=0, max=64)},
    }
    # torch.export's own deprecation notices and its note that torchvision's operators are not
    # registered: neither is about this model.
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level, dev, was_training = registry.level, next(model.parameters()).device, model.training
    registry.setLevel(logging.ERROR)
    model.to("cpu").eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            program = torch.onnx.export(
                _Step(model).eval(),
                example,
                dynamo=True,
                input_names=list(INPUTS),
                output_names=list(OUTPUTS),
                dynamic_shapes=dims,
                optimize=True,
                verbose=False,
            )
    finally:
        registry.setLevel(level)
        model.to(dev).train(was_training)
    proto = program.model_proto
    _strip_metadata(proto)
    # W_U tied to W_E (W_U_rows is the parameter itself): the graph stores it as W_E^T
    rows = model.W_U_rows
    tied = {f"model.{n}" for n, p in model.named_parameters(remove_duplicate=False) if p is rows}
    if tied:
        _vocab_columns(proto.graph, next(i.name for i in proto.graph.initializer if i.name in tied))
    return proto


def _vocab_columns(graph, name: str) -> None:
    """Store the tied embedding W_E (V, d_model), the initializer ``name``, which the graph both
    gathers rows of and multiplies (the read-out W_E x^T), as W_E^T (d_model, V) under the name
    ``name`` + :data:`TRANSPOSED`, and rewrite its users to match: a gather of rows becomes a
    gather of columns, transposed; W_E B becomes (B^T W_E^T)^T, whose pairs of transposes
    onnxruntime removes. A use of another kind raises ``ValueError``, before the graph changes.

    Why: the read-out of one position is a product with one column, and onnxruntime's
    WebAssembly kernels compute W_E x^T in blocks of 16 columns of which one is used: SmolLM2's
    read-out took 48 ms a step in onnxruntime-web 1.30 (node, one thread), and x W_E^T with the
    transpose stored 7 ms. The values are the same numbers, moved."""
    from onnx import helper, numpy_helper

    users: dict[str, list] = {}
    for node in graph.node:
        for k, x in enumerate(node.input):
            users.setdefault(x, []).append((node, k))
    rank = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in list(graph.input) + list(graph.value_info) + list(graph.output)
    }
    for n, k in users.get(name, []):
        if k != 0 or not (n.op_type == "MatMul" or (n.op_type == "Gather" and _axis(n) == 0)):
            raise ValueError(
                f"{name} is input {k} of a {n.op_type} ({n.name}): only gathers of its rows and "
                "products W_E B can use it transposed"
            )
    columns = name + TRANSPOSED
    made = []  # (the node rewritten, the nodes that replace it)
    for node, _ in users.get(name, []):
        out, tmp = node.output[0], f"{node.output[0]}{TRANSPOSED}"
        if node.op_type == "Gather":  # W_E[I] (*I, d) = (W_E^T[:, I])^T, axis 0 moved last
            r = rank.get(node.input[1])
            if r is None:
                raise ValueError(f"{out!r} gathers by {node.input[1]!r}, of unknown rank")
            made.append(
                (
                    node,
                    [
                        helper.make_node("Gather", [columns, node.input[1]], [tmp], axis=1),
                        helper.make_node("Transpose", [tmp], [out], perm=[*range(1, r + 1), 0]),
                    ],
                )
            )
        else:  # W_E B = (B^T W_E^T)^T for a matrix B
            if rank.get(node.input[1]) != 2:
                raise ValueError(f"{out!r} multiplies {name!r} by {node.input[1]!r}, not a matrix")
            made.append(
                (
                    node,
                    [
                        helper.make_node("Transpose", [node.input[1]], [tmp + "_B"], perm=[1, 0]),
                        helper.make_node("MatMul", [tmp + "_B", columns], [tmp]),
                        helper.make_node("Transpose", [tmp], [out], perm=[1, 0]),
                    ],
                )
            )
    init = next(i for i in graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).T.copy(), columns))
    nodes = list(graph.node)
    for node, new in made:
        at = next(k for k, n in enumerate(nodes) if n is node)
        nodes[at : at + 1] = new
    del graph.node[:]
    graph.node.extend(nodes)


def _axis(node) -> int:
    """A node's ``axis`` attribute (0 where it has none, ONNX's default for Gather)."""
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def to_onnx(model: GPT | ModernGPT) -> bytes:
    """The ONNX graph (serialized) of :func:`step` for ``model``: inputs :data:`INPUTS`, outputs
    :data:`OUTPUTS`, with T, P, n, m, r and s dynamic (all but T may be 0). Deterministic bytes for
    a given model. The weights are stored as float16 where float16 holds them exactly."""
    import onnx  # a build-time dependency (requirements.txt), not needed to read the book

    _check_model(model)
    check_finite_weights(model)  # a graph of NaN weights would show NaN as probabilities
    proto = _export_proto(model)
    _store_float16(proto.graph)
    onnx.checker.check_model(proto)
    return proto.SerializeToString(deterministic=True)


def _used_opsets(proto) -> None:
    """Keep only the operator sets the graph's nodes use (onnxruntime lists every one it knows)."""
    used = {""} | {node.domain for node in proto.graph.node}
    kept = [o for o in proto.opset_import if o.domain in used]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


# the most bytes of constants that onnxruntime's optimization may add to the graph itself: its
# folded shapes and ranges; a weight folded into a new tensor would be tens of MB
FOLDED_BYTES = 8_000_000


def optimize_ahead(proto, tensors: list[dict], weights: bytes, location: str, level: str = AHEAD):
    """``proto`` (a graph whose external initializers are ``tensors``, see
    :func:`gptlib.export.q4.store_gguf_blocks`, their float32 bytes ``weights``) as onnxruntime
    optimizes it at ``level`` ("basic" or "extended": no layout of a particular processor), so
    that the page loads it with its own optimizations off (onnxruntime-web spends most of a
    session's creation optimizing). The weights stay external initializers under the same names,
    at the same places of ``location``, each checked to hold the same bytes; the constants the
    optimization makes are stored in the graph. A ``ValueError`` says which weight the
    optimization changed, folded away or replaced by a new tensor."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }
    if level not in levels:
        raise ValueError(f"level must be 'basic' or 'extended', got {level!r}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / location).write_bytes(weights)
        (folder / "step.onnx").write_bytes(proto.SerializeToString())
        opts = ort.SessionOptions()
        opts.graph_optimization_level = levels[level]
        opts.intra_op_num_threads = 1
        opts.optimized_model_filepath = str(folder / "optimized.onnx")
        entry = "session.optimized_model_external_initializers_"
        opts.add_session_config_entry(entry + "file_name", "optimized.data")
        opts.add_session_config_entry(entry + "min_size_in_bytes", "1")  # all, then sorted below
        ort.InferenceSession(str(folder / "step.onnx"), opts, providers=["CPUExecutionProvider"])
        out = onnx.load(folder / "optimized.onnx", load_external_data=False)
        data = np.fromfile(folder / "optimized.data", np.uint8)
    ours, seen, folded = {t["name"]: t for t in tensors}, set(), 0
    for init in out.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        e = {x.key: x.value for x in init.external_data}
        raw = data[int(e["offset"]) : int(e["offset"]) + int(e["length"])].tobytes()
        del init.external_data[:]
        t = ours.get(init.name)
        if t is None:  # a constant of the optimization: into the graph
            init.data_location = TensorProto.DEFAULT
            init.raw_data = raw
            folded += len(raw)
            continue
        if raw != weights[t["offset"] : t["offset"] + t["bytes"]]:
            raise ValueError(f"onnxruntime's optimization at level {level!r} changed {t['name']}")
        for key, value in (("location", location), ("offset", t["offset"]), ("length", t["bytes"])):
            x = init.external_data.add()
            x.key, x.value = key, str(value)
        seen.add(init.name)
    if seen != set(ours):
        lost = ", ".join(sorted(set(ours) - seen))
        raise ValueError(f"onnxruntime's optimization at level {level!r} folded away {lost}")
    if folded > FOLDED_BYTES:
        raise ValueError(
            f"onnxruntime's optimization at level {level!r} made {folded:,} bytes of constants "
            f"(at most {FOLDED_BYTES:,}): it folded a weight into a new tensor"
        )
    _used_opsets(out)
    _strip_metadata(out)
    return out


def to_onnx_gguf(
    model: ModernGPT, gguf: str | Path, location: str
) -> tuple[bytes, list[dict], bytes]:
    """The graph of :func:`to_onnx` for a model read from the GGUF file ``gguf`` (SmolLM2), its
    quantized weights float32 initializers stored in the external-data file ``location``, which
    the page unpacks from the file's own blocks (:func:`gptlib.export.q4.store_gguf_blocks`, which
    checks that they are the model's weights bit for bit), optimized ahead of time at level
    :data:`AHEAD` (:func:`optimize_ahead`). Returns (the graph's bytes, the table of external
    tensors, the blocks); :func:`gptlib.export.q4.unpack_external` makes the file."""
    import onnx

    from .q4 import store_gguf_blocks, unpack_external

    _check_model(model)
    check_finite_weights(model)
    proto = _export_proto(model)
    onnx.checker.check_model(proto)  # before: the checker opens external files, never written
    tensors, blocks = store_gguf_blocks(proto.graph, model, gguf, location)
    proto = optimize_ahead(proto, tensors, unpack_external(blocks, tensors), location)
    return proto.SerializeToString(deterministic=True), tensors, blocks
