"""Chapters 7 and 8's live playground: the book's GPT on any text the reader types.

The view shows the text's tokens as the BPE splits them, the next-token distribution over the
whole vocabulary under temperature, top-k and top-p (exactly
:func:`gptlib.sampling.next_token_probs`,
with the temperature-1 ghost and the cumulative mass top-p cuts), seeded sampling and greedy steps
for as long as the reader presses (past ``n_ctx`` the window slides, as in
:func:`gptlib.sampling.generate`), with undo and reset, a logit lens (the next token read off the
residual stream after each block), and every head's attention pattern with its scores (the panel
of :class:`AttentionView`).

Who computes:

* in the HTML book, the page itself: onnxruntime-web (WebAssembly, one thread) runs the graph of
  :func:`gptlib.export.readout` that ``make book`` writes (``source``, a path under the book's
  ``_static/``), and @huggingface/tokenizers its BPE; both libraries are vendored from npm and
  downloaded only when the reader starts the live model. A page that cannot load WebAssembly (a
  file opened from disk) says so and keeps the stored analysis.
* in Jupyter or Colab, the kernel: the widget's messages reach this object, which answers with
  PyTorch (:func:`gptlib.export.readout` on ``model``) and ``tokenizer.encode``.

Until the live model starts, the page shows the analysis of ``text`` stored in the widget state
(computed here, so the page shows something true without downloading anything).
"""

from __future__ import annotations

import base64

import torch
import traitlets

from ..export import readout, weights_sha256
from ..model import GPT
from ..runtime import check_ids, check_int
from ._base import BookWidget, bundle, check_title, read_asset, rounded
from .sampling import _check_settings

__all__ = ["PlaygroundView"]


def _lens_tops(lens: torch.Tensor, n: int) -> list[dict]:
    """Per residual stream: the ``n`` most probable next tokens at temperature 1 and their
    probabilities."""
    probs = torch.softmax(lens.double(), dim=-1)  # (n_layers + 1, d_vocab)
    out = []
    for row, p in zip(lens, probs):
        ids = torch.sort(row, descending=True, stable=True).indices[:n]
        out.append({"ids": ids.tolist(), "probs": rounded(p[ids], 4)})
    return out


class PlaygroundView(BookWidget):
    """The live playground for a GPT and its BPE tokenizer (``encode``, ``token_str``,
    ``token_bytes``).

    ``text`` is the opening text; its analysis (tokens, the last position's logits rounded to 4
    decimals, every head's pattern rounded to 4 decimals, the lens) is stored in the state, so keep
    it short (its patterns take n_layers * n_heads * T**2 numbers). ``source`` names the files the
    HTML book serves for this model (``python -m gptlib.export``); the page runs them only if their
    weights are this model's (:func:`gptlib.export.weights_sha256`). ``lens_top`` tokens are shown
    per stream; ``layer`` and ``head`` are the head shown enlarged first. Temperature, top-k, top-p,
    ``n_show`` and ``seed`` are as in :class:`SamplingView`.
    """

    _esm = bundle("playground")
    _css = read_asset("widgets.css")
    title = traitlets.Unicode("").tag(sync=True)
    text = traitlets.Unicode("").tag(sync=True)
    source = traitlets.Unicode("live/english.json").tag(sync=True)
    weights_sha256 = traitlets.Unicode("").tag(sync=True)
    config = traitlets.Dict().tag(sync=True)  # d_vocab, n_ctx, n_layers, n_heads
    stored = traitlets.Dict().tag(sync=True)  # ids, logits, patterns, lens of `text`
    tokens = traitlets.Dict().tag(sync=True)  # {str(id): token string} for the stored analysis
    temperature = traitlets.Float(1.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)  # 0 = off
    top_p = traitlets.Float(1.0).tag(sync=True)
    n_show = traitlets.Int(15).tag(sync=True)
    lens_top = traitlets.Int(5).tag(sync=True)
    seed = traitlets.Int(0).tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(0).tag(sync=True)

    def __init__(
        self,
        model,
        tokenizer,
        text: str,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        n_show: int = 15,
        lens_top: int = 5,
        seed: int = 0,
        title: str = "",
        layer: int = 0,
        head: int = 0,
        source: str = "live/english.json",
    ):
        if not isinstance(model, GPT):
            raise ValueError(f"model must be a gptlib GPT, got {type(model).__name__}")
        for name in ("encode", "token_str", "token_bytes"):
            if not callable(getattr(tokenizer, name, None)):
                raise ValueError(
                    f"tokenizer must have a method {name}() (a BPETokenizer), got "
                    f"{type(tokenizer).__name__}"
                )
        c = model.config
        if getattr(tokenizer, "vocab_size", c.d_vocab) != c.d_vocab:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} tokens, the model d_vocab={c.d_vocab}"
            )
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty str")
        _check_settings(temperature, top_k, top_p, n_show, seed)
        check_title(title)
        lens_top = check_int("lens_top", lens_top, 1, c.d_vocab)
        layer, head = (
            check_int("layer", layer, 0, c.n_layers - 1),
            check_int("head", head, 0, c.n_heads - 1),
        )
        if (
            not isinstance(source, str)
            or not source.endswith(".json")
            or source.startswith(("/", "\\", "http:", "https:"))
            or ".." in source.replace("\\", "/").split("/")
            or ":" in source
        ):
            raise ValueError(
                "source must be a relative path to a .json manifest under the book's _static/, "
                f"got {source!r}"
            )
        self._model, self._tokenizer = model, tokenizer
        ids = tokenizer.encode(text)
        if not ids:
            raise ValueError(f"text must give at least one token, got {text!r}")
        out = self._readout(ids[-c.n_ctx :])
        shown = torch.sort(out["logits"], descending=True, stable=True).indices[:n_show].tolist()
        lens = _lens_tops(out["lens"], lens_top)
        needed = set(ids[-c.n_ctx :]) | set(shown) | {i for row in lens for i in row["ids"]}
        super().__init__(
            title=title,
            text=text,
            source=source,
            weights_sha256=weights_sha256(model),
            config={k: getattr(c, k) for k in ("d_vocab", "n_ctx", "n_layers", "n_heads")},
            stored={
                "ids": ids,
                "logits": rounded(out["logits"], 4),
                "patterns": rounded(out["patterns"], 4),
                "lens": lens,
            },
            tokens={str(i): tokenizer.token_str(i) for i in sorted(needed)},
            temperature=float(temperature),
            top_k=int(top_k or 0),
            top_p=float(top_p if top_p is not None else 1.0),
            n_show=int(n_show),
            lens_top=lens_top,
            seed=int(seed),
            layer=layer,
            head=head,
        )
        self.on_msg(self._answer)

    # --- the kernel's side of the live model ---------------------------------------------------
    def _readout(self, ids: list[int]) -> dict[str, torch.Tensor]:
        """logits (d_vocab,) at the last position, patterns (n_layers, n_heads, T, T), lens
        (n_layers + 1, d_vocab), float32 on the CPU; NaN or infinite outputs are an error."""
        c = self._model.config
        check_ids(ids, c.d_vocab)
        if not 1 <= len(ids) <= c.n_ctx:
            raise ValueError(f"ids must hold 1 to n_ctx={c.n_ctx} tokens, got {len(ids)}")
        dev = next(self._model.parameters()).device
        out = readout(self._model, torch.tensor([ids], device=dev))
        result = {
            "logits": out["logits"][0, -1],
            "patterns": out["patterns"][0],
            "lens": out["lens"][0],
        }
        for name, t in result.items():
            if not torch.isfinite(t).all():
                raise ValueError(
                    f"the model gives non-finite {name} (NaN or inf) on this text; it cannot be "
                    "shown"
                )
        return {k: v.float().cpu() for k, v in result.items()}

    def _answer(self, _widget, content: dict, _buffers) -> None:
        if not isinstance(content, dict) or "req" not in content:
            return
        req, kind = content["req"], content.get("kind")
        try:
            if kind == "ping":
                self.send({"kind": "pong", "req": req})
            elif kind == "start":
                tok, V = self._tokenizer, self._model.config.d_vocab
                self.send(
                    {
                        "kind": "started",
                        "req": req,
                        "config": self.config,
                        "tokens": [tok.token_str(i) for i in range(V)],
                        "token_bytes": [
                            base64.b64encode(tok.token_bytes(i)).decode("ascii") for i in range(V)
                        ],
                    }
                )
            elif kind == "encode":
                text = content.get("text")
                if not isinstance(text, str):
                    raise ValueError("text must be a str")
                self.send({"kind": "encoded", "req": req, "ids": self._tokenizer.encode(text)})
            elif kind == "forward":
                out = self._readout(list(content.get("ids", [])))
                self.send(
                    {"kind": "forward", "req": req},
                    buffers=[
                        out[k].contiguous().numpy().tobytes()
                        for k in ("logits", "patterns", "lens")
                    ],
                )
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as e:  # the page shows the message; nothing is silent
            self.send({"kind": "error", "req": req, "message": f"{type(e).__name__}: {e}"})

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
