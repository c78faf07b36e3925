"""Infrastructure: the book's GPT in the browser — an ONNX graph, a tokenizer.json and a manifest.

The live playground of the HTML book (:class:`gptlib.widgets.PlaygroundView`) runs a model with
onnxruntime-web and its BPE with @huggingface/tokenizers, both vendored from npm. This module
writes what they read, from a model directory written by :meth:`GPT.save`:

* ``<name>.onnx``: ``torch.onnx.export`` of :func:`readout`, which composes the model's own
  modules, so the PyTorch :class:`~gptlib.model.GPT` stays the only definition of the maths.
  Weights that float16 holds exactly (all of them for a model saved in fp16) are stored as
  float16 and cast to float32 inside the graph: half the bytes, the same numbers. The bytes are
  deterministic (no stack traces or other export metadata).
* ``<name>.tokenizer.json``: the tokenizer in Hugging Face's ``tokenizer.json`` format
  (:func:`tokenizer_json`): the same ids as :meth:`BPETokenizer.encode` (special-token text is
  ordinary text there too).
* ``<name>.json``: the manifest (:func:`manifest`): the config, the two files and their SHA-256,
  every token as a string and as bytes, and :func:`weights_sha256`, which a widget compares with
  the model it was made from.

``make book`` runs ``python -m gptlib.export models/english book_static/live``; nothing it writes
is committed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .hooks import capture, capture_patterns
from .model import GPT
from .runtime import atomic_write, check_file, check_ids
from .sampling import _check_finite_weights

__all__ = [
    "OUTPUTS",
    "readout",
    "to_onnx",
    "tokenizer_json",
    "weights_sha256",
    "manifest",
    "export",
]

OUTPUTS = ("logits", "patterns", "resid", "lens")
FORMAT = "gptlib-live"


@torch.no_grad()
def readout(model: GPT, ids: Tensor) -> dict[str, Tensor]:
    """One forward pass of ``model`` in eval mode, read out (float32, on the model's device):

    * ``logits`` (B, T, d_vocab): ``model(ids)``;
    * ``patterns`` (B, n_layers, n_heads, T, T): every head's attention pattern;
    * ``resid`` (B, n_layers + 1, T, d_model): the residual stream X_0 = embedding + positions,
      then X_l after block l;
    * ``lens`` (B, n_layers + 1, d_vocab): the logit lens at the last position,
      LN_f(X_l[:, -1]) W_U; its last row is ``logits[:, -1]``.

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8)).eval()
    >>> out = readout(model, torch.tensor([[1, 2, 3]]))
    >>> {k: tuple(v.shape) for k, v in out.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'logits': (1, 3, 512), 'patterns': (1, 2, 4, 3, 3), 'resid': (1, 3, 3, 64),
     'lens': (1, 3, 512)}
    >>> torch.allclose(out["logits"], model(torch.tensor([[1, 2, 3]])), atol=1e-5)
    True
    """
    if not isinstance(model, GPT):
        raise ValueError(f"model must be a gptlib GPT, got {type(model).__name__}")
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] < 1:
        raise ValueError(
            f"ids must be a tensor of shape (B, T) with T >= 1, got {getattr(ids, 'shape', ids)!r}"
        )
    check_ids(ids, model.config.d_vocab)
    T = ids.shape[1]
    if T > model.config.n_ctx:
        raise ValueError(
            f"ids has {T} positions, more than n_ctx={model.config.n_ctx}; crop the context first"
        )
    was_training = model.training
    model.eval()
    try:
        with capture(model, "hook_resid") as streams, capture_patterns(model) as patterns:
            logits = model(ids, check_ids=False)  # (B, T, d_vocab); ids checked above
        resid = torch.stack(streams, dim=1)  # (B, n_layers + 1, T, d_model): X_0, ..., X_L
        return {
            "logits": logits,
            "patterns": torch.stack(patterns, dim=1),  # (B, n_layers, n_heads, T, T)
            "resid": resid,
            "lens": model.read_out(resid[:, :, -1]),  # (B, n_layers + 1, d_vocab)
        }
    finally:
        model.train(was_training)


class _Readout(nn.Module):
    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> tuple[Tensor, ...]:
        out = readout(self.model, ids)
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


def to_onnx(model: GPT) -> bytes:
    """The ONNX graph (serialized) of :func:`readout` for ``model``: input ``ids`` (B, T) int64
    with 1 <= T <= n_ctx, outputs :data:`OUTPUTS`. Deterministic bytes for a given model."""
    import onnx  # a build-time dependency (requirements.txt), not needed to read the book

    if not isinstance(model, GPT):
        raise ValueError(f"model must be a gptlib GPT, got {type(model).__name__}")
    _check_finite_weights(model)  # a graph of NaN weights would show NaN as probabilities
    n_ctx = model.config.n_ctx
    if n_ctx < 3:
        raise ValueError(
            f"model.config.n_ctx must be >= 3 to export a graph with a variable length, got {n_ctx}"
        )
    example = torch.zeros(
        (2, 2), dtype=torch.int64
    )  # sizes above 1: torch.export keeps them symbolic
    dims = {
        "ids": {
            0: torch.export.Dim("B", min=1, max=1024),
            1: torch.export.Dim("T", min=1, max=n_ctx),
        }
    }
    # torch.export's own deprecation notices and its note that torchvision's operators are not
    # registered: neither is about this model.
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level, dev, was_training = registry.level, next(model.parameters()).device, model.training
    registry.setLevel(logging.ERROR)
    model.to("cpu").eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(
                _Readout(model).eval(),
                (example,),
                dynamo=True,
                input_names=["ids"],
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
    _store_float16(proto.graph)
    onnx.checker.check_model(proto)
    return proto.SerializeToString(deterministic=True)


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
    from .tokenizers.bpe import BPETokenizer, bytes_to_unicode

    if not isinstance(tokenizer, BPETokenizer):
        raise ValueError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    byte = bytes_to_unicode()
    name = lambda i: "".join(byte[b] for b in tokenizer.vocab[i])  # noqa: E731
    n = len(tokenizer.ranks)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": tokenizer.pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": {name(i): i for i in range(n)},
            "merges": [[name(a), name(b)] for a, b in tokenizer.merges],
        },
    }


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers as float32, by name: what a widget's state and
    the manifest both record, so that a page never runs another model than the one it describes.

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> a = GPT(GPTConfig.preset("tiny"))
    >>> _ = torch.manual_seed(0)
    >>> b = GPT(GPTConfig.preset("tiny"))
    >>> weights_sha256(a) == weights_sha256(b), len(weights_sha256(a))
    (True, 64)
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode("utf-8") + b"\0" + str(tuple(t.shape)).encode("ascii") + b"\0")
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def manifest(model: GPT, tokenizer, name: str, onnx_bytes: bytes, tokenizer_bytes: bytes) -> dict:
    """What the page reads first: the model's shape, the files and their SHA-256, the tokens."""
    c = model.config
    if tokenizer.vocab_size != c.d_vocab:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} tokens, the model d_vocab={c.d_vocab}"
        )
    return {
        "format": FORMAT,
        "version": 1,
        "name": name,
        "config": {
            k: getattr(c, k) for k in ("d_vocab", "n_ctx", "d_model", "n_heads", "n_layers")
        },
        "outputs": list(OUTPUTS),
        "onnx": {
            "file": f"{name}.onnx",
            "bytes": len(onnx_bytes),
            "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
        },
        "tokenizer": {
            "file": f"{name}.tokenizer.json",
            "bytes": len(tokenizer_bytes),
            "sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
        },
        "weights_sha256": weights_sha256(model),
        "tokens": [tokenizer.token_str(i) for i in range(c.d_vocab)],
        "token_bytes": [
            base64.b64encode(tokenizer.token_bytes(i)).decode("ascii") for i in range(c.d_vocab)
        ],
    }


def export(model_dir: str | Path, out_dir: str | Path, name: str | None = None) -> list[Path]:
    """Write ``<name>.onnx``, ``<name>.tokenizer.json`` and ``<name>.json`` into ``out_dir`` for
    the model (``GPT.load``) and tokenizer (``tokenizer.json``) in ``model_dir``. Everything is
    read and checked before anything is written; each file is written atomically, the manifest
    last. ``name`` (``None``: the name of ``model_dir``) must be a plain file name."""
    from .tokenizers import BPETokenizer

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    name = model_dir.resolve().name if name is None else name
    if (
        not isinstance(name, str)
        or not name
        or any(c in name for c in "/\\\0")
        or name.startswith(".")
    ):
        raise ValueError(f"name must be a plain file name, got {name!r}")
    tok_path = check_file(model_dir / "tokenizer.json")
    model = GPT.load(model_dir).eval()
    tokenizer = BPETokenizer.load(tok_path)
    if tokenizer.vocab_size != model.config.d_vocab:
        raise ValueError(
            f"{tok_path} has {tokenizer.vocab_size} tokens, the model in {model_dir} "
            f"d_vocab={model.config.d_vocab}"
        )
    onnx_bytes = to_onnx(model)
    tok_bytes = (
        json.dumps(tokenizer_json(tokenizer), ensure_ascii=False, sort_keys=True) + "\n"
    ).encode("utf-8")
    info = manifest(model, tokenizer, name, onnx_bytes, tok_bytes)
    written = [
        atomic_write(out_dir / info["onnx"]["file"], onnx_bytes),
        atomic_write(out_dir / info["tokenizer"]["file"], tok_bytes),
    ]
    written.append(
        atomic_write(
            out_dir / f"{name}.json", json.dumps(info, ensure_ascii=False, sort_keys=True) + "\n"
        )
    )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gptlib.export", description=export.__doc__.split("\n")[0]
    )
    parser.add_argument("model_dir", help="a directory written by GPT.save, with tokenizer.json")
    parser.add_argument(
        "out_dir", help="where to write <name>.onnx, <name>.tokenizer.json and <name>.json"
    )
    parser.add_argument(
        "--name", default=None, help="file names (default: the model directory's name)"
    )
    args = parser.parse_args(argv)
    for path in export(args.model_dir, args.out_dir, args.name):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
