"""The live step as an ONNX graph: ``torch.onnx.export`` of :func:`gptlib.step.step` for a model,
its weights stored as float16 where float16 holds them exactly (:func:`to_onnx`), or (SmolLM2,
:func:`to_onnx_gguf`) its quantized weights as float32 initializers in an external-data file that
the page makes from the GGUF's own Q4_1 and Q8_0 blocks (:mod:`gptlib.export.q4`). The bytes are
deterministic (no stack traces or other export metadata).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..model import GPT
from ..modern import ModernGPT
from ..runtime import check_finite_weights
from ..step import INPUTS, OUTPUTS, _check_model, _shape, _step

__all__ = ["to_onnx", "to_onnx_gguf"]


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
    return proto


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


def to_onnx_gguf(
    model: ModernGPT, gguf: str | Path, location: str
) -> tuple[bytes, list[dict], bytes]:
    """The graph of :func:`to_onnx` for a model read from the GGUF file ``gguf`` (SmolLM2), its
    quantized weights float32 initializers stored in the external-data file ``location``, which
    the page unpacks from the file's own blocks (:func:`gptlib.export.q4.store_gguf_blocks`, which
    checks that they are the model's weights bit for bit). Returns (the graph's bytes, the table
    of external tensors, the blocks); :func:`gptlib.export.q4.unpack_external` makes the file."""
    import onnx

    from .q4 import store_gguf_blocks

    _check_model(model)
    check_finite_weights(model)
    proto = _export_proto(model)
    onnx.checker.check_model(proto)  # before: the checker opens external files, never written
    tensors, blocks = store_gguf_blocks(proto.graph, model, gguf, location)
    return proto.SerializeToString(deterministic=True), tensors, blocks
