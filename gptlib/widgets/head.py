"""The head view's inputs (``head.js``), from :func:`gptlib.head_trace.head_trace`: what the kernel
answers a ``head`` request with, and what the page's step graph is to hand the view.

The view computes every stage itself from these (``traceHead``), so the kernel and the page
feed one piece of JavaScript: the query after RoPE, the keys and values of the shared key-value
head as the KV cache holds them, W_O^h, ln_f's gain and frozen normaliser, W_U[:, v], and RoPE's
base with the pair to show.

In the page (onnxruntime-web) the step graph hands over, for the chosen layer ell, head h,
query t (one of the step's new positions) and token v only (:func:`gptlib.step.step`'s ``head``
input and ``head_*`` outputs): the query of head h at t after RoPE (d_head numbers), ln_f's
normaliser at X_L[t] (one number), and, as gathers of its weights, W_O^h (d_head, d_model),
ln_f's gain (d_model) and W_U[:, v] (d_model). The keys and values are the rows of the cache the
page keeps (layer ell, key-value head h // G); ``rope_base``, whether ln_f centres (LayerNorm)
and whether the model has biases come from the manifest's config. ``head.js``'s ``pageInputs``
makes the same inputs from those.
"""

from __future__ import annotations

from ..circuits import ablate_heads
from ..head_trace import HeadTrace, head_trace
from ..modern import ModernGPT

__all__ = ["view_inputs", "head_reply"]


def view_inputs(model, tr: HeadTrace) -> dict:
    """The inputs of ``head.js``'s ``traceHead`` and ``headPanel`` for the trace ``tr`` of
    ``model`` (JSON-ready lists and numbers).

    >>> from gptlib.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig.preset("tiny")).eval()
    >>> inp = view_inputs(model, head_trace(model, [1, 2, 3], 0, 2, 1, 7))
    >>> (inp["head"], inp["position"], len(inp["k"]), len(inp["W_O"][0]), inp["rope"])
    (2, 1, 3, 64, None)
    """
    attn = model.blocks[tr.layer].attn
    rope = {"base": attn.rope_base, "pair": tr.pair} if isinstance(model, ModernGPT) else None
    return {
        "layer": tr.layer,
        "head": tr.head,
        "kvHead": tr.kv_head,
        "group": tr.group,
        "position": tr.position,
        "target": tr.target,
        "bias": getattr(attn, "b_Q", None) is not None,
        "q": tr.q.tolist(),
        "k": tr.k.tolist(),
        "v": tr.v.tolist(),
        "W_O": tr.W_O.tolist(),
        "ln": {"w": tr.ln_w.tolist(), "scale": tr.ln_scale, "centred": tr.ln_centred},
        "unembed": tr.W_U_v.tolist(),
        "rope": rope,
    }


def head_reply(model, content: dict) -> dict:
    """The kernel's answer to ``{"kind": "head", "ids", "layer", "head", "position", "target",
    "pair", "mask"}`` (``pair`` optional: RoPE's pair 0; ``mask`` optional: the step's head mask,
    whose zeros remove heads as the page's step does): ``{"kind": "head", "inputs": ...}``, the
    view's inputs; every invalid field raises ``ValueError`` naming it (the page shows it).

    >>> from gptlib.modern import ModernConfig
    >>> model = ModernGPT(ModernConfig.preset("tiny")).eval()
    >>> ask = {"ids": [1, 2], "layer": 1, "head": 3, "position": 1, "target": 4}
    >>> head_reply(model, {"kind": "head", **ask})["inputs"]["rope"]
    {'base': 10000.0, 'pair': 0}
    >>> head_reply(model, {"kind": "head", **ask, "head": 9})
    Traceback (most recent call last):
    ...
    ValueError: head must be in [0, 3], got 9
    """
    fields = ("ids", "layer", "head", "position", "target")
    missing = [f for f in fields if f not in content]
    if missing:
        raise ValueError(f"a head request needs {', '.join(missing)}")
    args = {f: content[f] for f in fields}
    if not isinstance(args["ids"], list):
        raise ValueError(f"ids must be a list of token ids, got {type(args['ids']).__name__}")
    removed = _removed(model, content.get("mask"))
    with ablate_heads(model, removed):  # the step's mask: W_O^h = 0 for a head removed
        tr = head_trace(model, **args, pair=content.get("pair"))
        return {"kind": "head", "inputs": view_inputs(model, tr)}


def _removed(model, mask) -> list[tuple[int, int]]:
    """The heads (layer, h) that a head mask of n_layers * n_heads zeros and ones removes (the
    playground's mask; None removes none)."""
    if mask is None:
        return []
    L, H = model.config.n_layers, model.config.n_heads
    if not isinstance(mask, list) or len(mask) != L * H or any(m not in (0, 1) for m in mask):
        raise ValueError(f"mask must be a list of n_layers * n_heads = {L * H} zeros and ones")
    return [(k // H, k % H) for k, m in enumerate(mask) if m == 0]
