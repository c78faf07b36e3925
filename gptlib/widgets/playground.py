"""The live playground: a GPT on any text the reader types, the book's English model (Chapters 7
and 8) or SmolLM2-135M-Instruct with its chat template (Chapter 12).

The view shows the text's tokens as the tokenizer splits them, the next-token distribution over
the whole vocabulary under temperature, top-k and top-p (exactly
:func:`gptlib.sampling.next_token_probs`, with the temperature-1 ghost and the cumulative mass
top-p cuts), seeded sampling and greedy steps, one at a time or a run of up to ``n_generate``
with a stop button (past ``n_ctx`` the window slides, as in :func:`gptlib.sampling.generate`),
undo and reset, a logit lens (the next token read off the residual stream after each block),
every head's attention pattern with its scores (the panel of :class:`AttentionView`; the heads
that share a key-value head marked), a head mask (a click ablates a head, as
:func:`gptlib.circuits.ablate_heads` does) and each head's direct contribution to the logit of
the most probable token. With ``chat=True`` the text is the user's message inside the model's
chat template, and a run stops at the template's stop token.

Who computes, always :func:`gptlib.step.step`:

* in the HTML book, the page itself: onnxruntime-web (WebAssembly, one thread) runs the step
  graph that ``make book`` writes (``source``, a manifest under the book's ``_static/``), keeping
  the keys and values of the text between steps, and @huggingface/tokenizers the tokenizer; both
  libraries are vendored from npm, and nothing is downloaded until the reader starts the live
  model (for SmolLM2 the page says how much first). A page that cannot load WebAssembly says so
  and keeps the stored analysis.
* in Jupyter or Colab, the kernel: the widget's messages reach this object, which answers with
  :func:`gptlib.step.step` in PyTorch on the whole context and ``tokenizer.encode``.

Each action of the reader runs the model once, asking only for what is shown: the logit lens
and the heads (their rows and direct contributions) are panels the reader can close, computed
only while open (the lens starts closed where reading every stream through W_U costs more than
100 million multiplications, as SmolLM2's does); a run of draws takes steps without the lens or
the direct contributions, keeps the new attention rows while the heads' panel is open, and draws
its text every few tokens. An action that comes during a step waits for it (the latest such
action wins), and a kernel that does not answer a step in time is said so in the status line.

Until the live model starts, the page shows the analysis of ``text`` stored in the widget state
(computed here, so the page shows something true without downloading anything).
"""

from __future__ import annotations

import base64

import torch
import traitlets

from ..model import GPT
from ..modern import ModernGPT
from ..runtime import check_int
from ._base import BookWidget, bundle, check_source, check_title, read_asset, rounded
from .continuations import _temperatures, rest_log_weights
from .live import LENS_TOP, LiveKernel, chat_frame, live_config, weights_sha256
from .sampling import _check_settings

__all__ = ["PlaygroundView"]

# A large vocabulary (SmolLM2's 49,152) stores only its most probable logits and the others'
# log-weight; its patterns as bytes (weight * 255, rounded), the lower triangle only.
STORED_TOP = 256
LARGE_VOCAB = 8192


def _lens_tops(lens_ids: torch.Tensor, lens_logits: torch.Tensor, lse: torch.Tensor, n: int):
    """Per residual stream: the ``n`` most probable next tokens at temperature 1 (from
    :func:`gptlib.step.step`'s ``lens_ids``, ``lens_logits``, ``lens_lse``) and their
    probabilities exp(logit - lse), rounded to 4 decimals."""
    probs = torch.exp(lens_logits.double() - lse.double()[:, None])  # (n_streams, K)
    return [
        {"ids": ids[:n].tolist(), "probs": rounded(p[:n], 4)} for ids, p in zip(lens_ids, probs)
    ]


def _pattern_bytes(attn: torch.Tensor) -> str:
    """The lower triangles of patterns (L, H, T, T), row by row, as base64 bytes round(255 a).

    >>> a = torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]])
    >>> list(base64.b64decode(_pattern_bytes(a)))
    [255, 64, 191]
    """
    T = attn.shape[-1]
    rows, cols = torch.tril_indices(T, T)
    tri = attn[..., rows, cols]  # (L, H, T(T+1)/2)
    u8 = torch.round(tri.clamp(0, 1) * 255).to(torch.uint8)
    return base64.b64encode(u8.numpy().tobytes()).decode("ascii")


def _check_tokenizer(tokenizer, d_vocab: int) -> None:
    """A BPETokenizer or a GGUFTokenizer of the model's vocabulary: encode, token_str, bytes."""
    for name in ("encode", "token_str"):
        if not callable(getattr(tokenizer, name, None)):
            raise ValueError(
                f"tokenizer must have a method {name}() (a BPETokenizer or a GGUFTokenizer), "
                f"got {type(tokenizer).__name__}"
            )
    if not (callable(getattr(tokenizer, "token_bytes", None)) or hasattr(tokenizer, "vocab")):
        raise ValueError(
            f"tokenizer must give each token's bytes (token_bytes() or vocab), got "
            f"{type(tokenizer).__name__}"
        )
    if getattr(tokenizer, "vocab_size", d_vocab) != d_vocab:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} tokens, the model d_vocab={d_vocab}"
        )


def _stored_analysis(ids: list[int], out: dict, lens_top: int, temperature: float) -> dict:
    """What the state stores of a step's outputs ``out`` on the text ``ids``: the last position's
    logits (a large vocabulary: the top STORED_TOP and the others' log-weight at each temperature
    the slider offers, with ``temperature`` among them, as :class:`SamplingView` stores it), every
    head's pattern (a large vocabulary: as bytes) and the lens' top ``lens_top`` tokens per
    stream."""
    logits = out["logits"][0]  # (d_vocab,)
    lens = _lens_tops(out["lens_ids"], out["lens_logits"], out["lens_lse"], lens_top)
    if len(logits) <= LARGE_VOCAB:
        return {
            "ids": ids,
            "logits": rounded(logits, 4),
            "patterns": rounded(out["attn"], 4),
            "lens": lens,
        }
    order = torch.sort(logits, descending=True, stable=True).indices
    kept = order[:STORED_TOP]
    top = rounded(logits[kept], 4)
    temps = _temperatures(temperature)
    # the page's m is the largest logit as it stores it (rounded): the others' weight is relative
    # to that, so that exp((y_i - m)/t) and exp(rest) share one normaliser at every t
    rest = rest_log_weights(logits, kept.tolist(), temps, ndigits=6, reference=top[0])
    return {
        "ids": ids,
        "top": {
            "ids": kept.tolist(),
            "logits": top,
            "temperatures": temps,
            "rest_logz": rest,
        },
        "patterns_u8": _pattern_bytes(out["attn"]),
        "lens": lens,
    }


class PlaygroundView(LiveKernel, BookWidget):
    """The live playground for a :class:`~gptlib.model.GPT` with its :class:`BPETokenizer`, or a
    :class:`~gptlib.modern.ModernGPT` with its :class:`GGUFTokenizer` (SmolLM2).

    ``text`` is the opening text (with ``chat=True``, the user's message in the tokenizer's chat
    template); its analysis (tokens, the last position's logits, every head's pattern, the lens)
    is stored in the state, so keep it short (its patterns take n_layers * n_heads * T**2 / 2
    numbers). A GPT stores them rounded to 4 decimals; a model of more than 8,192 tokens stores
    its 256 most probable logits and the others' log-weight, and the patterns as bytes
    (round(255 a)). ``source`` names the files the HTML book serves for this model
    (``python -m gptlib.export``: ``live/english.json``, ``live/smollm2.json``); the page runs
    them only if their weights are this model's (:func:`gptlib.export.weights_sha256`).
    ``lens_top`` tokens (at most 10) are shown per stream; ``layer`` and ``head`` are the head
    shown enlarged first; ``n_generate`` the length of a run. Temperature, top-k, top-p,
    ``n_show`` and ``seed`` are as in :class:`SamplingView`.
    """

    _esm = bundle("playground")
    _css = read_asset("widgets.css")
    title = traitlets.Unicode("").tag(sync=True)
    text = traitlets.Unicode("").tag(sync=True)
    chat = traitlets.Bool(False).tag(sync=True)
    chat_available = traitlets.Bool(False).tag(sync=True)
    source = traitlets.Unicode("live/english.json").tag(sync=True)
    weights_sha256 = traitlets.Unicode("").tag(sync=True)
    config = traitlets.Dict().tag(sync=True)  # d_vocab, n_ctx, n_layers, n_heads, n_kv_heads
    stored = traitlets.Dict().tag(sync=True)  # ids, logits (or top), patterns, lens of `text`
    tokens = traitlets.Dict().tag(sync=True)  # {str(id): token string} for the stored analysis
    temperature = traitlets.Float(1.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)  # 0 = off
    top_p = traitlets.Float(1.0).tag(sync=True)
    n_show = traitlets.Int(15).tag(sync=True)
    lens_top = traitlets.Int(5).tag(sync=True)
    seed = traitlets.Int(0).tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(0).tag(sync=True)
    n_generate = traitlets.Int(40).tag(sync=True)

    def __init__(
        self,
        model,
        tokenizer,
        text: str,
        *,
        chat: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        n_show: int = 15,
        lens_top: int = 5,
        seed: int = 0,
        title: str = "",
        layer: int = 0,
        head: int = 0,
        n_generate: int = 40,
        source: str = "live/english.json",
    ):
        if not isinstance(model, (GPT, ModernGPT)):
            raise ValueError(f"model must be a gptlib GPT or ModernGPT, got {type(model).__name__}")
        c = model.config
        _check_tokenizer(tokenizer, c.d_vocab)
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty str")
        if not isinstance(chat, bool):
            raise ValueError(f"chat must be True or False, got {chat!r}")
        frame = chat_frame(tokenizer)
        if chat and frame is None:
            raise ValueError("chat=True needs a tokenizer with a chat template (a GGUFTokenizer)")
        _check_settings(temperature, top_k, top_p, n_show, seed)
        if top_k is not None:  # as SamplingView: top-k keeps at most the d_vocab tokens there are
            check_int("top_k", top_k, 1, c.d_vocab)
        check_title(title)
        lens_top = check_int("lens_top", lens_top, 1, min(LENS_TOP, c.d_vocab))
        n_generate = check_int("n_generate", n_generate, 1, 1000)
        layer, head = (
            check_int("layer", layer, 0, c.n_layers - 1),
            check_int("head", head, 0, c.n_heads - 1),
        )
        source = check_source(source)
        self._model, self._tokenizer = model, tokenizer  # LiveKernel's, before _serve
        ids = self._encode(frame["prefix"] + text + frame["suffix"] if chat else text)
        if not ids:
            raise ValueError(f"text must give at least one token, got {text!r}")
        window = ids[-c.n_ctx :]
        out = self._step(window, lens=list(range(c.n_layers + 1)))
        stored = _stored_analysis(ids, out, lens_top, temperature)
        shown = torch.sort(out["logits"][0], descending=True, stable=True).indices[:n_show]
        needed = set(window) | set(shown.tolist()) | {i for r in stored["lens"] for i in r["ids"]}
        super().__init__(
            title=title,
            text=text,
            chat=chat,
            chat_available=frame is not None,
            source=source,
            weights_sha256=weights_sha256(model),
            config=live_config(model),
            stored=stored,
            tokens={str(i): tokenizer.token_str(i) for i in sorted(needed)},
            temperature=float(temperature),
            top_k=int(top_k or 0),
            top_p=float(top_p if top_p is not None else 1.0),
            n_show=int(n_show),
            lens_top=lens_top,
            seed=int(seed),
            layer=layer,
            head=head,
            n_generate=n_generate,
        )
        self._serve(model, tokenizer)  # the kernel's side of the live model (LiveKernel)

    def _repr_facts(self):
        c = self.config
        return {
            "layers": c["n_layers"],
            "heads": c["n_heads"],
            "tokens": len(self.stored["ids"]),
            "temperature": self.temperature,
            "top_k": self.top_k or None,
            "top_p": self.top_p,
        }
