"""The manifest the page reads first (:func:`manifest`: the config, the files and their SHA-256,
the external weights' table (SmolLM2's blocks and where the page unpacks them to), every token as
a string and as bytes, the special tokens, the chat template's prefix and suffix) and
:func:`weights_sha256`, which a widget compares with the model it was made from.
"""

from __future__ import annotations

import base64
import hashlib

import torch
from torch import nn

from ..model import GPT
from ..modern import ModernGPT, RMSNorm
from ..step import LENS_TOP, _check_model, _shape

__all__ = ["FORMAT", "VERSION", "weights_sha256", "chat_frame", "manifest"]

FORMAT = "gptlib-live"
VERSION = 5


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
    blocks: tuple[list[dict], list[bytes]] | None = None,
    optimized: str | None = None,
) -> dict:
    """What the page reads first (format ``gptlib-live`` version 5): the model's shape (with what
    the head view needs: RoPE's base, whether ln_f centres, whether attention has biases), the files
    and their SHA-256, the tokens as strings and bytes, the special tokens and the chat frame.
    ``blocks``: for a graph whose quantized weights are external (:func:`to_onnx_gguf`), their
    table and the pieces of the blocks; the manifest's ``weights`` then says which files hold
    the blocks and where each tensor goes in the external-data file ``<name>.weights``, which
    the page makes (:func:`gptlib.export.q4.unpack_external`); None otherwise. ``optimized``:
    the onnxruntime level the graph was optimized at ahead of time (:func:`optimize_ahead`; the
    page then loads it with its optimizations off), None for a graph the page optimizes."""
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    if tokenizer.vocab_size != V:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, the model d_vocab={V}")
    whole = b"".join(onnx_pieces)
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    from ..tokenizers.gguf import GGUFTokenizer

    modern_tok = isinstance(tokenizer, GGUFTokenizer)
    weights = None
    if blocks is not None:
        tensors, parts = blocks
        joined = b"".join(parts)
        weights = {
            "file": f"{name}.weights",
            "bytes": sum(t["bytes"] for t in tensors),
            "tensors": tensors,
            "blocks": {
                "pieces": [
                    {"file": f"{name}.blocks.{k}", "bytes": len(p), "sha256": digest(p)}
                    for k, p in enumerate(parts)
                ],
                "bytes": len(joined),
                "sha256": digest(joined),
            },
        }
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
            "rope_base": getattr(model.blocks[0].attn, "rope_base", None),  # None: no RoPE
            "ln_f_centred": not isinstance(model.ln_f, RMSNorm),  # LayerNorm subtracts the mean
            "attn_bias": getattr(model.blocks[0].attn, "b_Q", None) is not None,
        },
        "lens_top": LENS_TOP,
        "onnx": {
            "pieces": [
                {"file": f"{name}.onnx.{k}", "bytes": len(p), "sha256": digest(p)}
                for k, p in enumerate(onnx_pieces)
            ],
            "bytes": len(whole),
            "sha256": digest(whole),
            "optimized": optimized,
        },
        "tokenizer": {
            "file": f"{name}.tokenizer.json",
            "bytes": len(tokenizer_bytes),
            "sha256": digest(tokenizer_bytes),
        },
        "weights": weights,
        "download_bytes": len(whole)
        + len(tokenizer_bytes)
        + (weights["blocks"]["bytes"] if weights else 0),
        "weights_sha256": weights_sha256(model),
        "tokens": [tokenizer.token_str(i) for i in range(V)],
        "token_bytes": [base64.b64encode(token_bytes(i)).decode("ascii") for i in range(V)],
        # the tokens the page's tokenizer.json encodes as special (none for a BPETokenizer, whose
        # encode() reads special-token text as ordinary text)
        "special": dict(sorted(tokenizer.special_tokens.items())) if modern_tok else {},
        "chat": chat_frame(tokenizer),
    }
