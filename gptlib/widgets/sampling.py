"""Chapter 7's sampling view: the next-token distribution under temperature, top-k and top-p."""

from __future__ import annotations

import math

import traitlets

from ._base import BookWidget, read_asset, rounded

MAX_FULL_VOCAB = 8192
KEPT_WHEN_LARGER = 4096
MASKED_LOGIT = -1e30  # stands for -inf in the (JSON) widget state


class SamplingView(BookWidget):
    """Bars for the most probable next tokens, recomputed live from the logits in JavaScript.

    The browser applies exactly :func:`gptlib.sampling.next_token_probs`: temperature, then top-k,
    then top-p, then renormalisation (temperature 0 = all mass on the argmax). For vocabularies of
    at most 8192 tokens the state holds every logit, so the view is exact; above that it keeps the
    4096 largest, and the probabilities are those of that truncated vocabulary. Logits are stored
    rounded to 6 decimals; a logit of -inf (a token that can never be drawn) is stored as -1e30,
    since JSON has no infinities, and keeps probability 0.

    >>> SamplingView([10.0, 6.0, 4.0], ["a", "b", "c"], temperature=0.5, top_k=2)
    SamplingView(vocab=3, temperature=0.5, top_k=2, top_p=1.0)
    """

    _esm = read_asset("sampling.js")
    _css = read_asset("widgets.css")
    logits = traitlets.List(traitlets.Float()).tag(sync=True)
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    ids = traitlets.List(traitlets.Int()).tag(sync=True)
    temperature = traitlets.Float(1.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)  # 0 = off
    top_p = traitlets.Float(1.0).tag(sync=True)
    n_show = traitlets.Int(20).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(self, logits, tokens, temperature=1.0, top_k=None, top_p=None, n_show=20, title=""):
        if hasattr(logits, "detach"):
            logits = logits.detach().to("cpu").double()
        raw = logits.tolist() if hasattr(logits, "tolist") else list(logits)
        if not raw or any(isinstance(v, (list, tuple)) or hasattr(v, "__len__") for v in raw):
            raise ValueError("logits must be a non-empty 1-D sequence (one logit per token)")
        values = [float(v) for v in raw]
        if any(math.isnan(v) for v in values):
            raise ValueError("logits must not contain NaN")
        if any(v == math.inf for v in values) or max(values) == -math.inf:
            raise ValueError("logits must be finite, apart from -inf for tokens that can never be drawn")
        # JSON has no -inf: a logit this far below the others has probability exactly 0 anyway.
        values = [v if v != -math.inf else MASKED_LOGIT for v in values]
        tokens = [str(t) for t in tokens]
        if len(tokens) != len(values):
            raise ValueError(f"tokens must have one string per logit ({len(values)}), got {len(tokens)}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and (int(top_k) != top_k or top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {top_k}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be None or in (0, 1], got {top_p}")
        if n_show < 1:
            raise ValueError(f"n_show must be >= 1, got {n_show}")
        ids = list(range(len(values)))
        if len(values) > MAX_FULL_VOCAB:
            ids = sorted(sorted(ids, key=lambda i: (-values[i], i))[:KEPT_WHEN_LARGER])
        super().__init__(
            logits=rounded([values[i] for i in ids], 6), tokens=[tokens[i] for i in ids], ids=ids,
            temperature=float(temperature), top_k=int(top_k or 0), top_p=float(top_p if top_p is not None else 1.0),
            n_show=int(min(n_show, len(ids))), title=title,
        )

    def _repr_facts(self):
        return {"vocab": len(self.logits), "temperature": self.temperature, "top_k": self.top_k or None,
                "top_p": self.top_p}
