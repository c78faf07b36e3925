"""The kernel's side of the live model: one protocol for every view that runs a model.

A view that names a live model (:class:`~gptlib.widgets.PlaygroundView`, and
:meth:`SamplingView.from_model <gptlib.widgets.SamplingView.from_model>` with a ``source``) mixes
in :class:`LiveKernel`. In Jupyter and Colab its page (``live.js``'s ``connect``) sends custom
messages ``{"kind", "req", ...}`` and gets one answer each, with the same ``req``:

* ``ping`` -> ``pong``: a kernel is listening;
* ``start`` -> ``started``: the model's shape (:func:`live_config`), ``lens_top``, every token's
  string and bytes (base64), the special tokens and the chat frame (or None);
* ``encode`` (``text``) -> ``encoded`` (``ids``): the tokenizer's ids, special tokens as one id;
* ``step`` (``ids``, ``mask``, ``lens``, ``targets``, ``rows``, ``window``, ``rows_from``) ->
  ``step`` with six buffers: the outputs ``logits``, ``attn``, ``lens_ids``, ``lens_logits``,
  ``lens_lse``, ``direct`` of :func:`gptlib.step.step` on the whole of ``ids`` from an empty
  cache, which computes only what is asked: the lens of the streams ``lens``, the contributions
  to ``targets`` (-1: the most probable token), every query's attention rows when ``rows`` is
  true (none otherwise). With ``rows`` and ``window`` (the heads panel's window W) and
  ``rows_from`` (the first query whose row the page lacks), the step computes and ``attn`` holds
  only the rows the page lacks that the window keeps, cut to the window's keys
  (:func:`window_rows`), and a seventh buffer ``entropy`` each head's last-row entropy, so that a
  run of any length computes and sends at most the new rows of W keys;
* ``head`` (``ids``, ``layer``, ``head``, ``position``, ``target``, ``pair``) -> ``head``
  (``inputs``): one head at one query, what ``head.js`` draws
  (:func:`gptlib.widgets.head.head_reply`);
* anything else, or a failure -> ``error`` with the message, which the page shows.

The page's own backend (onnxruntime-web) runs the same step, exported to ONNX, so both answer
the same questions with the same numbers; the views never know which one they talk to.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

# The step and the files of the live model: every widget reaches them through here.
from ..export import chat_frame, weights_sha256
from ..modern import ModernGPT
from ..runtime import check_ids, check_int
from ..step import LENS_TOP, step, step_inputs
from ._base import token_strings
from .head import head_reply

__all__ = [
    "LiveKernel",
    "live_config",
    "window_first",
    "window_rows",
    "STEP_BUFFERS",
    "LENS_TOP",
    "chat_frame",
    "weights_sha256",
]

# The buffers of a ``step`` answer, in order (float32, but lens_ids int64).
STEP_BUFFERS = ("logits", "attn", "lens_ids", "lens_logits", "lens_lse", "direct")


def live_config(model) -> dict[str, int]:
    """The shape the page needs: d_vocab, n_ctx, n_layers, n_heads, n_kv_heads, d_head.

    >>> from gptlib.model import GPT, GPTConfig
    >>> live_config(GPT(GPTConfig.preset("tiny", n_ctx=8)))  # doctest: +NORMALIZE_WHITESPACE
    {'d_vocab': 512, 'n_ctx': 8, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 4, 'd_head': 16}
    """
    c = model.config
    return {
        "d_vocab": c.d_vocab,
        "n_ctx": c.n_ctx,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": getattr(c, "n_kv_heads", c.n_heads),
        "d_head": getattr(c, "d_head", c.d_model // c.n_heads),
    }


def window_positions(T: int, window: int) -> list[int]:
    """The keys a heads panel's window of ``window`` positions holds of T (rows.js's
    ``windowPositions``): every position while T <= window, else key 0 and the last window - 1.

    >>> window_positions(3, 4), window_positions(10, 4)
    ([0, 1, 2], [0, 7, 8, 9])
    """
    lo = max(1, T - window + 1)
    return [0, *range(lo, T)] if T else []


def window_first(T: int, rows_from: int, window: int) -> int:
    """The first query of T whose row the page lacks (from ``rows_from`` on) and a heads panel's
    window of ``window`` positions keeps (rows.js's ``firstKept``); the last query always, for
    its entropy.

    >>> window_first(5, 1, 3), window_first(5, 4, 3), window_first(5, 5, 3), window_first(3, 0, 4)
    (3, 4, 4, 0)
    """
    return min(T - 1, max(rows_from, T - window + 1 if T > window else 0))


def window_rows(attn: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``attn`` (L, H, r, T) of the last r queries of T positions, cut to a heads
    panel's window of ``window`` positions (its keys :func:`window_positions`): (L, H, r, n),
    n = len(window_positions(T, window)); and each head's last-row entropy over all its keys,
    (L, H). Below, T = 5 and W = 3: queries 3 and 4 on keys 0, 3, 4 (uniform rows of 5 keys:
    0.2 each, entropy log 5).

    >>> A = torch.tril(torch.ones(1, 1, 5, 5)); A = A / A.sum(-1, keepdim=True)
    >>> cut, ent = window_rows(A[:, :, window_first(5, 1, 3) :], 3)
    >>> tuple(cut.shape), [round(a, 4) for a in cut[0, 0, -1].tolist()], round(float(ent), 4)
    ((1, 1, 2, 3), [0.2, 0.2, 0.2], 1.6094)
    """
    T = attn.shape[-1]
    keys = torch.tensor(window_positions(T, window), device=attn.device)
    cut = attn.index_select(-1, keys)  # (L, H, r, n)
    entropy = torch.special.entr(attn[:, :, -1].double()).sum(-1).float()  # (L, H)
    return cut, entropy


def _token_bytes(tokenizer, i: int) -> bytes:
    """Token ``i``'s bytes: ``token_bytes``, else ``vocab`` (bytes, or text in UTF-8), else its
    decoded text in UTF-8 (a CharTokenizer's tokens are characters)."""
    f = getattr(tokenizer, "token_bytes", None)
    if callable(f):
        return f(i)
    t = tokenizer.vocab[i] if hasattr(tokenizer, "vocab") else tokenizer.decode([i])
    return t if isinstance(t, bytes) else t.encode("utf-8")


class LiveKernel:
    """Mixin for a widget that answers its page with a model: call :meth:`_serve` in
    ``__init__``; the messages are those of this module's docstring."""

    _model: Any = None
    _tokenizer: Any = None

    def _serve(self, model, tokenizer) -> None:
        """Answer the page's messages with ``model`` and ``tokenizer`` from now on."""
        self._model, self._tokenizer = model, tokenizer
        self._frame = chat_frame(tokenizer)
        self.on_msg(self._answer)

    def _encode(self, text: str) -> list[int]:
        """The tokenizer's ids; a GGUFTokenizer's special tokens (the chat template's) count as
        special, as in the page's tokenizer.json."""
        if isinstance(self._model, ModernGPT):
            return self._tokenizer.encode(text, allowed_special="all")
        return self._tokenizer.encode(text)

    def _step(
        self, ids, mask=None, lens=(), targets=(), rows=True, window=None, rows_from=0
    ) -> dict[str, torch.Tensor]:
        """:func:`gptlib.step.step` on ``ids`` (1 to n_ctx tokens) from an empty cache, on the
        CPU; ``mask`` n_layers * n_heads numbers (None keeps every head); every query's attention
        rows if ``rows``, else none; with ``window`` (and ``rows``), only the rows from
        ``rows_from`` on that the window keeps (:func:`window_first`), cut to its keys, and each
        head's last-row ``entropy`` (:func:`window_rows`). NaN or infinite logits or patterns
        are an error."""
        c = self._model.config
        check_ids(ids, c.d_vocab)
        if not 1 <= len(ids) <= c.n_ctx:
            raise ValueError(f"ids must hold 1 to n_ctx={c.n_ctx} tokens, got {len(ids)}")
        if not isinstance(rows, bool):
            raise ValueError(f"rows must be true or false, got {rows!r}")
        T = len(ids)
        if window is None:
            queries = range(T) if rows else ()
        else:
            if not rows:
                raise ValueError("window is the window of the attention rows: rows must be true")
            window = check_int("window", window, 1, None)
            rows_from = check_int("rows_from", rows_from, 0, T)
            queries = range(window_first(T, rows_from, window), T)
        past, ones, lens_t, targets_t, queries_t = step_inputs(
            self._model, lens=lens, targets=targets, queries=queries
        )
        if mask is not None:
            m = torch.as_tensor(np.asarray(mask, dtype=np.float32)).to(ones.device)
            if m.numel() != ones.numel() or not torch.isfinite(m).all():
                raise ValueError(
                    f"mask must hold n_layers * n_heads = {ones.numel()} finite numbers"
                )
            ones = m.view_as(ones)
        x = torch.tensor([ids], device=ones.device)  # (1, T)
        out = step(self._model, x, past, ones, lens_t, targets_t, queries_t)
        for name in ("logits", "attn"):
            if not torch.isfinite(out[name]).all():
                raise ValueError(
                    f"the model gives non-finite {name} (NaN or inf) on this text; it cannot be "
                    "shown"
                )
        if window is not None:
            out["attn"], out["entropy"] = window_rows(out["attn"], window)
        return {k: v.cpu() for k, v in out.items()}

    def _started(self) -> dict:
        """The answer to ``start``: what the page's backend holds of the model."""
        tok, V = self._tokenizer, self._model.config.d_vocab
        token_str = token_strings(tok)
        return {
            "kind": "started",
            "config": live_config(self._model),
            "lens_top": LENS_TOP,
            "tokens": [token_str(i) for i in range(V)],
            "token_bytes": [
                base64.b64encode(_token_bytes(tok, i)).decode("ascii") for i in range(V)
            ],
            "special": dict(sorted(getattr(tok, "special_tokens", {}).items())),
            "chat": self._frame,
        }

    def _reply(self, content: dict) -> tuple[dict, list[bytes]]:
        """The answer to one request (without its ``req``) and its buffers."""
        kind = content.get("kind")
        if kind == "ping":
            return {"kind": "pong"}, []
        if kind == "start":
            return self._started(), []
        if kind == "encode":
            text = content.get("text")
            if not isinstance(text, str):
                raise ValueError("text must be a str")
            return {"kind": "encoded", "ids": self._encode(text)}, []
        if kind == "step":
            out = self._step(
                list(content.get("ids", [])),
                content.get("mask"),
                content.get("lens") or (),
                content.get("targets") or (),
                content.get("rows", True),
                content.get("window"),
                content.get("rows_from", 0),
            )
            names = STEP_BUFFERS + (("entropy",) if "entropy" in out else ())
            return {"kind": "step"}, [out[k].contiguous().numpy().tobytes() for k in names]
        if kind == "head":
            return head_reply(self._model, content), []
        raise ValueError(f"unknown request {kind!r}")

    def _answer(self, _widget, content: dict, _buffers) -> None:
        """The widget's message handler: one answer per request that carries a ``req``; an error
        is answered with its message (nothing is silent)."""
        if not isinstance(content, dict) or "req" not in content:
            return
        req = content["req"]
        try:
            msg, buffers = self._reply(content)
        except Exception as e:  # the page shows the message
            msg, buffers = {"kind": "error", "message": f"{type(e).__name__}: {e}"}, []
        self.send({**msg, "req": req}, buffers=buffers or None)
