"""Infrastructure: the book's models in the browser — one step function, its ONNX graph, the
tokenizer.json and a manifest, for the English GPT and for SmolLM2-135M-Instruct.

The live playground of the HTML book (:class:`gptlib.widgets.PlaygroundView`) runs a model with
onnxruntime-web and its BPE with @huggingface/tokenizers, both vendored from npm; in a Jupyter
kernel the same widget calls :func:`step` in PyTorch. This module writes what the page reads:

* ``<name>.onnx.0``, ``.1``, ...: ``torch.onnx.export`` of :func:`step` (:func:`to_onnx`), which
  composes the model's own modules, so the PyTorch model stays the only definition of the maths.
  A step takes the new tokens, the keys and values of the positions before them, a mask over the
  heads and the logit-lens and target requests; it returns the next-token logits, the keys and
  values with the new positions appended, every head's attention rows, the top of the logit lens
  and each head's direct contribution to the target logits. The English model's weights that
  float16 holds exactly are stored as float16; SmolLM2's are the GGUF's own Q4_1 and Q8_0 blocks
  (:mod:`gptlib.export_q4`), unpacked by the graph when onnxruntime loads it. The serialized
  graph is cut into pieces of at most :data:`PIECE_BYTES` bytes (a static host's file limit).
  The bytes are deterministic (no stack traces or other export metadata).
* ``<name>.tokenizer.json``: the tokenizer in Hugging Face's ``tokenizer.json`` format
  (:func:`tokenizer_json`, :func:`gguf_tokenizer_json`).
* ``<name>.json``: the manifest (:func:`manifest`): the config, the files and their SHA-256,
  every token as a string and as bytes, the special tokens, the chat template's prefix and suffix,
  and :func:`weights_sha256`, which a widget compares with the model it was made from.

``make book`` runs ``python -m gptlib.export models/english book_static/live`` and
``python -m gptlib.export --smollm2 book_static/live``; nothing they write is committed.
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
from torch.func import functional_call

from .attention import KVCache, repeat_kv
from .hooks import capture, capture_patterns
from .model import GPT
from .modern import ModernGPT, RMSNorm
from .runtime import atomic_write, check_file, check_finite_weights, check_ids, check_int
from .sampling import _check_finite_weights

__all__ = [
    "OUTPUTS",
    "INPUTS",
    "LENS_TOP",
    "PIECE_BYTES",
    "step",
    "step_inputs",
    "to_onnx",
    "pieces",
    "tokenizer_json",
    "gguf_tokenizer_json",
    "weights_sha256",
    "manifest",
    "export",
    "export_smollm2",
]

PIECE_BYTES = 95_000_000  # GitHub Pages refuses files of 100 MB

OUTPUTS = ("logits", "present", "attn", "lens_ids", "lens_logits", "lens_lse", "direct")
INPUTS = ("ids", "past", "head_mask", "lens", "targets")
LENS_TOP = 10
FORMAT = "gptlib-live"
VERSION = 2


# --- the step: one call of the model on new tokens, with its cache, masks and read-outs ----------
class _PastCache(KVCache):
    """A :class:`KVCache` that starts from ``past`` (n_layers, 2, n_kv, P, d_head) and appends by
    concatenation, so that a traced graph holds no buffers: the keys and values the model's own
    attention layers write, P + T positions per layer after the step."""

    def __init__(self, past: Tensor):
        super().__init__(past.shape[0])
        self._k = [past[layer, 0][None] for layer in range(self.n_layers)]  # (1, n_kv, P, d_head)
        self._v = [past[layer, 1][None] for layer in range(self.n_layers)]
        self._filled = [past.shape[3]] * self.n_layers

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._k[layer] = torch.cat([self._k[layer], k], dim=2)  # (1, n_kv, P + T, d_head)
        self._v[layer] = torch.cat([self._v[layer], v], dim=2)
        self._filled[layer] += k.shape[2]
        return self._k[layer], self._v[layer]


def _shape(model: nn.Module) -> tuple[int, int, int, int, int, int]:
    """(n_layers, n_heads, n_kv, d_head, d_vocab, n_ctx) of a GPT or ModernGPT."""
    attn = model.blocks[0].attn
    n_kv = getattr(attn, "n_kv_heads", attn.n_heads)
    c = model.config
    return c.n_layers, attn.n_heads, n_kv, attn.d_head, c.d_vocab, c.n_ctx


def _ln_f_linear(model: nn.Module, o: Tensor, x_last: Tensor) -> Tensor:
    """ln_f's linear part with its normaliser frozen at x_last (d_model,), applied to rows o
    (..., d_model): RMSNorm o w / rms(x_last); LayerNorm (o - mean o) w / sigma(x_last)."""
    ln = model.ln_f
    if isinstance(ln, RMSNorm):
        scale = torch.rsqrt(x_last.pow(2).mean() + ln.eps)  # 1 / rms(X_L[-1])
        return o * ln.w * scale
    centred = x_last - x_last.mean()
    scale = torch.rsqrt(centred.pow(2).mean() + ln.eps)  # 1 / sigma(X_L[-1]), biased variance
    return (o - o.mean(dim=-1, keepdim=True)) * ln.w * scale


def _step(
    model: nn.Module, ids: Tensor, past: Tensor, head_mask: Tensor, lens: Tensor, targets: Tensor
) -> dict[str, Tensor]:
    """:func:`step` without the checks of its arguments (what the graph traces)."""
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    T, P = ids.shape[1], past.shape[3]
    torch._check(P + T <= n_ctx)  # the model raises beyond n_ctx; the trace learns the bound
    cache = _PastCache(past)
    # head h's output z_h W_O^h times its mask: the rows of W_O scaled, as ablate_heads zeroes them
    masked = {
        f"blocks.{layer}.attn.W_O": model.blocks[layer].attn.W_O
        * head_mask[layer][:, None].expand(H, d_head).reshape(H * d_head, 1)  # (H d_head, 1)
        for layer in range(L)
    }
    with capture(model, "hook_resid") as streams, capture_patterns(model) as patterns:
        functional_call(model, masked, (ids, cache), {"check_ids": False}, strict=False)
    resid = torch.stack([x[0, -1] for x in streams])  # (L + 1, d_model): X_0 .. X_L, last row
    attn = torch.stack([p[0] for p in patterns])  # (L, H, T, P + T)
    present = torch.stack(
        [torch.stack([cache.k[layer][0], cache.v[layer][0]]) for layer in range(L)]
    )  # (L, 2, n_kv, P + T, d_head)
    logits = model.read_out(resid[-1:])  # (1, V): ln_f(X_L[-1]) W_U
    # the logit lens at the last position, cut to its top K inside the step
    lens_rows = model.read_out(resid.index_select(0, lens))  # (n, V)
    top = torch.topk(lens_rows, min(LENS_TOP, V), dim=-1)  # (n, K), largest first
    # the direct contributions: head h's output at the last position, through ln_f's linear part
    v_last = repeat_kv(present[:, 1], H // n_kv)  # (L, H, P + T, d_head): head h reads h // G
    z = torch.einsum("lhs,lhsd->lhd", attn[:, :, -1], v_last)  # (L, H, d_head): z_h
    W_O = torch.stack([masked[f"blocks.{layer}.attn.W_O"] for layer in range(L)])
    out = torch.einsum("lhd,lhde->lhe", z, W_O.view(L, H, d_head, -1))  # (L, H, d_model)
    W_t = model.W_U.index_select(1, targets)  # (d_model, m)
    direct = _ln_f_linear(model, out, resid[-1]) @ W_t  # (L, H, m)
    return {
        "logits": logits,
        "present": present,
        "attn": attn,
        "lens_ids": top.indices,
        "lens_logits": top.values,
        "lens_lse": torch.logsumexp(lens_rows, dim=-1),
        "direct": direct,
    }


def _check_model(model: object) -> None:
    """A GPT or ModernGPT with multi-head or grouped-query attention and float32 weights (the step
    and its graph compute in float32; :class:`_PastCache` holds keys and values per head)."""
    if not isinstance(model, (GPT, ModernGPT)):
        raise ValueError(f"model must be a gptlib GPT or ModernGPT, got {type(model).__name__}")
    attn = type(model.blocks[0].attn)
    if attn.__name__ not in ("MultiHeadAttention", "GroupedQueryAttention"):
        raise ValueError(
            f"model's attention is {attn.__name__} (latent attention keeps no keys and values per "
            "head): the step and its graph take multi-head or grouped-query attention"
        )
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes - {torch.float32}:
        raise ValueError(
            f"model's weights are {', '.join(sorted(map(str, dtypes)))}; the step computes in "
            "torch.float32: pass model.float()"
        )
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ValueError("model's weights are on the meta device (no values): load them first")


def _check_index_list(name: str, values: object, hi: int) -> list[int]:
    """``values`` as a list of ints in [0, hi): ints only (numpy's too; bool and float refused)."""
    if isinstance(values, Tensor):
        values = values.tolist() if values.dtype in (torch.int64, torch.int32) else values
    try:
        items = list(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a sequence of ints, got {type(values).__name__}"
        ) from None
    return [check_int(f"{name}[{k}]", v, 0, hi - 1) for k, v in enumerate(items)]


def _check_outputs(model: nn.Module, out: dict[str, Tensor]) -> dict[str, Tensor]:
    """``out`` if its logits are finite; else the weight at fault named, or the overflow said."""
    if not bool(torch.isfinite(out["logits"]).all()):
        check_finite_weights(model)
        raise ValueError("the step's logits are NaN or infinite: the model overflows on this text")
    return out


def _check_tensor(name: str, t: object, dtype: torch.dtype, shape: tuple) -> Tensor:
    """``t`` must be a tensor of ``dtype`` whose shape matches ``shape`` (None: any size)."""
    if (
        not isinstance(t, Tensor)
        or t.dtype != dtype
        or t.dim() != len(shape)
        or any(s is not None and s != n for s, n in zip(shape, t.shape))
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        got = (t.dtype, tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dtype} tensor of shape {want}, got {got}")
    return t


@torch.no_grad()
def step(
    model: GPT | ModernGPT,
    ids: Tensor,
    past: Tensor,
    head_mask: Tensor,
    lens: Tensor,
    targets: Tensor,
) -> dict[str, Tensor]:
    """One step of ``model`` (in eval mode) on new tokens, given the keys and values before them.

    Inputs (B = 1; L layers, H heads, n_kv key-value heads, d_vocab V):

    * ``ids`` int64 (1, T), T >= 1: the new tokens, at positions P .. P + T - 1;
    * ``past`` float32 (L, 2, n_kv, P, d_head), P >= 0: the cached keys (index 0; for a ModernGPT
      rotated, as :class:`~gptlib.attention.KVCache` holds them) and values (index 1);
    * ``head_mask`` float32 (L, H): head h's output z_h W_O^h is multiplied by it (0 removes the
      head exactly as :func:`gptlib.circuits.ablate_heads` does, 1 keeps it);
    * ``lens`` int64 (n,), 0 <= n: which residual streams X_0 .. X_L the logit lens reads at the
      last new position;
    * ``targets`` int64 (m,): the token ids whose logits ``direct`` decomposes.

    Outputs (float32 unless stated), in the order of :data:`OUTPUTS`:

    * ``logits`` (1, V): ln_f(X_L) W_U at the last new position;
    * ``present`` (L, 2, n_kv, P + T, d_head): ``past`` with the new positions appended;
    * ``attn`` (L, H, T, P + T): every head's attention rows for the new positions (zero beyond a
      query's position), masked heads included;
    * ``lens_ids`` int64 (n, K), ``lens_logits`` (n, K), ``lens_lse`` (n,): the top K =
      :data:`LENS_TOP` tokens of ln_f(X_l) W_U for each requested stream l, largest first, and
      the logsumexp of the whole row, so that p = exp(logit - lse);
    * ``direct`` (L, H, m): head h's output at the last position, z_h W_O^h (times its mask),
      through ln_f's linear part with the normaliser frozen at X_L's last row, dotted with
      W_U[:, t] for each target t.

    The model itself computes: a :class:`~gptlib.attention.KVCache` that starts from ``past``,
    its forward pass with W_O's rows scaled by the mask, hooks reading the patterns and the
    residual streams.

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8)).eval()
    >>> ids = torch.tensor([[5, 6, 7]])
    >>> first = step(model, ids[:, :2], *step_inputs(model, lens=[0, 2], targets=[7]))
    >>> {k: tuple(v.shape) for k, v in first.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'logits': (1, 512), 'present': (2, 2, 4, 2, 16), 'attn': (2, 4, 2, 2),
     'lens_ids': (2, 10), 'lens_logits': (2, 10), 'lens_lse': (2,), 'direct': (2, 4, 1)}
    >>> then = step(model, ids[:, 2:], first["present"], *step_inputs(model)[1:])
    >>> torch.allclose(then["logits"], model(ids)[:, -1], atol=1e-5)
    True

    Every argument is checked: a wrong dtype or shape, an id out of range, a stream beyond X_L or
    more positions than n_ctx raise ``ValueError`` naming the argument.
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    _check_tensor("ids", ids, torch.int64, (1, None))
    if ids.shape[1] < 1:
        raise ValueError("ids must hold at least one new token, got shape (1, 0)")
    check_ids(ids, V)
    _check_tensor("past", past, torch.float32, (L, 2, n_kv, None, d_head))
    P, T = past.shape[3], ids.shape[1]
    if P + T > n_ctx:
        raise ValueError(
            f"past ({P} positions) and ids ({T}) exceed n_ctx={n_ctx}; crop the context first"
        )
    _check_tensor("head_mask", head_mask, torch.float32, (L, H))
    for name, t in (("past", past), ("head_mask", head_mask)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite")
    _check_tensor("lens", lens, torch.int64, (None,))
    if lens.numel() and not bool(((lens >= 0) & (lens <= L)).all()):
        raise ValueError(f"lens must be stream indices in [0, {L}], got {lens.tolist()}")
    _check_tensor("targets", targets, torch.int64, (None,))
    if targets.numel() and not bool(((targets >= 0) & (targets < V)).all()):
        raise ValueError(f"targets must be token ids in [0, {V}), got {targets.tolist()}")
    device = next(model.parameters()).device
    args = (ids, past, head_mask, lens, targets)
    if any(t.device != device for t in args):
        raise ValueError(f"ids, past, head_mask, lens and targets must be on {device}")
    was_training = model.training
    model.eval()
    try:
        return _check_outputs(model, _step(model, *args))
    finally:
        model.train(was_training)


def step_inputs(
    model: GPT | ModernGPT, lens: list[int] = (), targets: list[int] = (), P: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``past`` (zeros, P positions), ``head_mask`` (ones), ``lens`` and ``targets`` for
    :func:`step`, on the model's device: the arguments after ``ids`` of a step that removes no
    head.

    >>> from gptlib.modern import ModernConfig
    >>> model = ModernGPT(ModernConfig.preset("tiny"))
    >>> [tuple(t.shape) for t in step_inputs(model, lens=[2], targets=[1, 2])]
    [(2, 2, 2, 0, 8), (2, 4), (1,), (2,)]
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    P = check_int("P", P, 0, n_ctx - 1)
    lens, targets = _check_index_list("lens", lens, L + 1), _check_index_list("targets", targets, V)
    device = next(model.parameters()).device
    return (
        torch.zeros(L, 2, n_kv, P, d_head, device=device),
        torch.ones(L, H, device=device),
        torch.tensor(lens, dtype=torch.int64, device=device),
        torch.tensor(targets, dtype=torch.int64, device=device),
    )


class _Step(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, past, head_mask, lens, targets) -> tuple[Tensor, ...]:
        out = _step(self.model, ids, past, head_mask, lens, targets)
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
        torch.zeros((L, 2, n_kv, 2, d_head)),
        torch.ones((L, H)),
        torch.zeros((2,), dtype=torch.int64),
        torch.zeros((2,), dtype=torch.int64),
    )
    Dim = torch.export.Dim
    dims = {
        "ids": {1: Dim("T", min=1, max=n_ctx)},
        "past": {3: Dim("P", min=0, max=n_ctx - 1)},
        "head_mask": None,
        "lens": {0: Dim("n", min=0, max=1024)},
        "targets": {0: Dim("m", min=0, max=max(V, 4))},
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


def to_onnx(model: GPT | ModernGPT, gguf: str | Path | None = None) -> bytes:
    """The ONNX graph (serialized) of :func:`step` for ``model``: inputs :data:`INPUTS`, outputs
    :data:`OUTPUTS`, with T, P, n and m dynamic (P, n and m may be 0). Deterministic bytes for a
    given model. The weights are stored as float16 where float16 holds them exactly; with ``gguf``,
    the path of the GGUF file the model was read from (SmolLM2), as that file's own quantized
    blocks (:func:`gptlib.export_q4.store_gguf_blocks`, which checks that they are the model's
    weights bit for bit)."""
    import onnx  # a build-time dependency (requirements.txt), not needed to read the book

    _check_model(model)
    _check_finite_weights(model)  # a graph of NaN weights would show NaN as probabilities
    proto = _export_proto(model)
    if gguf is None:
        _store_float16(proto.graph)
    else:
        from .export_q4 import store_gguf_blocks

        store_gguf_blocks(proto.graph, model, gguf)
    onnx.checker.check_model(proto)
    return proto.SerializeToString(deterministic=True)


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
    if any(t.device.type == "meta" for t in model.state_dict().values()):
        raise ValueError("model's weights are on the meta device (no values): load them first")
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode("utf-8") + b"\0" + str(tuple(t.shape)).encode("ascii") + b"\0")
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


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
    from .tokenizers.bpe import GPT2_SPLIT_PATTERN
    from .tokenizers.gguf import GGUFTokenizer

    if not isinstance(tokenizer, GGUFTokenizer):
        raise ValueError(f"tokenizer must be a GGUFTokenizer, got {type(tokenizer).__name__}")
    split = lambda pattern: {  # noqa: E731
        "type": "Split",
        "pattern": {"Regex": pattern},
        "behavior": "Isolated",
        "invert": False,
    }
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    special = sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t, i in special
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [split(r"\p{N}"), split(GPT2_SPLIT_PATTERN), byte_level],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": {t: i for i, t in reversed(list(enumerate(tokenizer.tokens)))},
            "merges": [m.split(" ") for m in tokenizer.merges],
        },
    }


CHAT_MARK = "\ue000"  # a private-use character: where the user's message goes in the template


def _render_chat(tokenizer) -> str:
    """The chat template rendered around :data:`CHAT_MARK`; a template that cannot be rendered
    (Jinja's syntax or runtime errors) is a ``ValueError`` that says so."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": CHAT_MARK}])
    except Exception as e:  # jinja2's TemplateError and whatever the template raises
        raise ValueError(
            f"the tokenizer's chat template cannot be rendered: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(text, str):
        raise ValueError(f"the tokenizer's chat template gave {type(text).__name__}, not text")
    return text


def chat_frame(tokenizer) -> dict | None:
    """The chat template around one user message: ``{"prefix", "suffix", "stop"}`` rendered by
    :meth:`GGUFTokenizer.apply_chat_template` (with the assistant's turn opened), ``stop`` the id
    of ``<|im_end|>``; None for a tokenizer without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = _render_chat(tokenizer)
    if text.count(CHAT_MARK) != 1:
        raise ValueError("the chat template must hold the user's message exactly once")
    prefix, suffix = text.split(CHAT_MARK)
    stop = [tokenizer.special_tokens[t] for t in ("<|im_end|>",) if t in tokenizer.special_tokens]
    if not stop and tokenizer.eos_id is not None:
        stop = [tokenizer.eos_id]
    return {"prefix": prefix, "suffix": suffix, "stop": stop}


def manifest(
    model: GPT | ModernGPT,
    tokenizer,
    name: str,
    onnx_pieces: list[bytes],
    tokenizer_bytes: bytes,
) -> dict:
    """What the page reads first (format ``gptlib-live`` version 2): the model's shape, the files
    and their SHA-256, the tokens as strings and bytes, the special tokens and the chat frame."""
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    if tokenizer.vocab_size != V:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, the model d_vocab={V}")
    whole = b"".join(onnx_pieces)
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    from .tokenizers.gguf import GGUFTokenizer

    modern_tok = isinstance(tokenizer, GGUFTokenizer)
    token_bytes = (lambda i: tokenizer.vocab[i]) if modern_tok else tokenizer.token_bytes
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "family": "modern" if isinstance(model, ModernGPT) else "gpt",
        "config": {
            "d_vocab": V,
            "n_ctx": n_ctx,
            "d_model": model.config.d_model,
            "n_layers": L,
            "n_heads": H,
            "n_kv_heads": n_kv,
            "d_head": d_head,
        },
        "lens_top": LENS_TOP,
        "onnx": {
            "pieces": [
                {"file": f"{name}.onnx.{k}", "bytes": len(p), "sha256": digest(p)}
                for k, p in enumerate(onnx_pieces)
            ],
            "bytes": len(whole),
            "sha256": digest(whole),
        },
        "tokenizer": {
            "file": f"{name}.tokenizer.json",
            "bytes": len(tokenizer_bytes),
            "sha256": digest(tokenizer_bytes),
        },
        "download_bytes": len(whole) + len(tokenizer_bytes),
        "weights_sha256": weights_sha256(model),
        "tokens": [tokenizer.token_str(i) for i in range(V)],
        "token_bytes": [base64.b64encode(token_bytes(i)).decode("ascii") for i in range(V)],
        # the tokens the page's tokenizer.json encodes as special (none for a BPETokenizer, whose
        # encode() reads special-token text as ordinary text)
        "special": dict(sorted(tokenizer.special_tokens.items())) if modern_tok else {},
        "chat": chat_frame(tokenizer),
    }


def _check_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not name
        or any(c in name for c in "/\\\0")
        or name.startswith(".")
    ):
        raise ValueError(f"name must be a plain file name, got {name!r}")
    return name


def _write(out_dir: Path, name: str, model, tokenizer, onnx_bytes: bytes, tok: dict) -> list[Path]:
    """Write the pieces, the tokenizer.json and, last, the manifest (each atomically); remove
    pieces of an earlier export beyond the new ones."""
    tok_bytes = (json.dumps(tok, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    parts = pieces(onnx_bytes)
    info = manifest(model, tokenizer, name, parts, tok_bytes)
    written = [
        atomic_write(out_dir / p["file"], data) for p, data in zip(info["onnx"]["pieces"], parts)
    ]
    k = len(parts)
    while (out_dir / f"{name}.onnx.{k}").is_file():  # a longer earlier export's tail
        (out_dir / f"{name}.onnx.{k}").unlink()
        k += 1
    written.append(atomic_write(out_dir / info["tokenizer"]["file"], tok_bytes))
    text = json.dumps(info, ensure_ascii=False, sort_keys=True) + "\n"
    written.append(atomic_write(out_dir / f"{name}.json", text))
    return written


def export(model_dir: str | Path, out_dir: str | Path, name: str | None = None) -> list[Path]:
    """Write ``<name>.onnx.0``, ``<name>.tokenizer.json`` and ``<name>.json`` into ``out_dir``
    for the model (``GPT.load``) and tokenizer (``tokenizer.json``) in ``model_dir``. Everything
    is read and checked before anything is written; each file is written atomically, the manifest
    last. ``name`` (``None``: the name of ``model_dir``) must be a plain file name."""
    from .tokenizers import BPETokenizer

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    name = _check_name(model_dir.resolve().name if name is None else name)
    tok_path = check_file(model_dir / "tokenizer.json")
    model = GPT.load(model_dir).eval()
    tokenizer = BPETokenizer.load(tok_path)
    if tokenizer.vocab_size != model.config.d_vocab:
        raise ValueError(
            f"{tok_path} has {tokenizer.vocab_size} tokens, the model in {model_dir} "
            f"d_vocab={model.config.d_vocab}"
        )
    return _write(out_dir, name, model, tokenizer, to_onnx(model), tokenizer_json(tokenizer))


def export_smollm2(out_dir: str | Path, name: str = "smollm2") -> list[Path]:
    """Write ``<name>.onnx.0``, ``.1``, ..., ``<name>.tokenizer.json`` and ``<name>.json`` for
    SmolLM2-135M-Instruct from the cache that ``make smollm2`` fills: the model of
    :func:`gptlib.gguf.load_smollm2`, its weights in the graph as the GGUF's own blocks."""
    from .assets import asset_path
    from .gguf import ASSET, load_smollm2

    name = _check_name(name)
    model, tokenizer = load_smollm2()
    onnx_bytes = to_onnx(model, gguf=asset_path(ASSET))
    return _write(Path(out_dir), name, model, tokenizer, onnx_bytes, gguf_tokenizer_json(tokenizer))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gptlib.export",
        description="Write a model's ONNX step graph, tokenizer.json and manifest for the page.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="MODEL_DIR OUT_DIR (a directory written by GPT.save, with tokenizer.json), or "
        "OUT_DIR with --smollm2",
    )
    parser.add_argument(
        "--smollm2", action="store_true", help="export SmolLM2-135M-Instruct from the cache"
    )
    parser.add_argument(
        "--name", default=None, help="file names (default: the model directory's name; smollm2)"
    )
    args = parser.parse_args(argv)
    if len(args.paths) != (1 if args.smollm2 else 2):
        parser.error("give MODEL_DIR OUT_DIR, or --smollm2 OUT_DIR")
    if args.smollm2:
        written = export_smollm2(args.paths[0], args.name or "smollm2")
    else:
        written = export(args.paths[0], args.paths[1], args.name)
    for path in written:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
