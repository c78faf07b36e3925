"""Chapter 4's attention view: every head as a cell coloured by a score, one in detail.

The scores (previous-token, first-token, induction) are the small pure functions of
:mod:`gptlib.circuits`. The widget computes them once, in Python, and stores them rounded in its
state, beside the score of a uniform causal head, the level a head that looks nowhere in particular
reaches.
"""

from __future__ import annotations

import torch
import traitlets

from ..circuits import head_scores
from ._base import BookWidget, bundle, check_strings, check_title, read_asset, rounded

__all__ = ["AttentionView"]


def _holds_bool(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_holds_bool(v) for v in x)
    return isinstance(x, bool)


def _as_nested(patterns):
    if hasattr(patterns, "detach"):
        patterns = patterns.detach().to("cpu").double()
    if hasattr(patterns, "tolist"):
        patterns = patterns.tolist()
    return patterns


class AttentionView(BookWidget):
    """Attention patterns of shape (n_layers, n_heads, T, T) with token strings on both axes.

    The view shows every head as one small cell (layers down, heads across) coloured by the score
    the reader chooses (:func:`head_scores`: previous token, first token, and induction when a
    token repeats; and the entropy of the last row); the head under the pointer, or the keyboard's
    (arrow keys), is drawn in detail as a heatmap with a colour scale and its legend, and a click
    or Enter keeps it. Row i of a pattern is the distribution of query i over keys j <= i.
    Hovering a token of the text (or a query row) colours the text by where that token attends
    and lists the keys it attends to most. Patterns
    may be a torch tensor, a numpy array or nested lists; they are stored rounded to 6 decimals,
    the scores to 3.

    >>> AttentionView(["a", "b"], [[[[1.0, 0.0], [0.25, 0.75]]]])
    AttentionView(layers=1, heads=1, tokens=2)
    """

    _esm = bundle("attention")
    _css = read_asset("widgets.css")
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    patterns = traitlets.List().tag(sync=True)
    layer_labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
    head_labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
    scores = traitlets.List(traitlets.Dict()).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(0).tag(sync=True)

    def __init__(self, tokens, patterns, title: str = "", layer_labels=None, head_labels=None):
        tokens = check_strings("tokens", tokens)
        check_title(title)
        p = _as_nested(patterns)
        try:
            n_layers, n_heads = len(p), len(p[0])
            shapes = {
                (len(p[l][h]), len(row))
                for l in range(n_layers)
                for h in range(n_heads)
                for row in p[l][h]
            }
        except (TypeError, IndexError):
            raise ValueError("patterns must have shape (n_layers, n_heads, T, T)") from None
        T = len(tokens)
        if shapes != {(T, T)}:
            raise ValueError(
                f"patterns must have shape (n_layers, n_heads, T, T) with T = len(tokens) = {T}, "
                f"got rows {sorted(shapes)}"
            )
        try:
            if _holds_bool(p):
                raise TypeError("a bool is not a weight")
            weights = torch.tensor(p, dtype=torch.float64)  # (n_layers, n_heads, T, T)
        except (TypeError, ValueError):
            raise ValueError("patterns must hold numbers") from None
        if not torch.isfinite(weights).all():
            raise ValueError(
                "patterns must be finite: they hold NaN or an infinity (a widget state holds JSON "
                "numbers only)"
            )
        if weights.numel() and not (weights.min() >= -1e-6 and weights.max() <= 1 + 1e-6):
            raise ValueError(
                f"patterns must be attention weights in [0, 1], got values in "
                f"[{float(weights.min()):.4g}, {float(weights.max()):.4g}]"
            )
        # each row a distribution over the keys j <= i (rounding to 6 decimals moves a sum
        # by < 1e-3)
        sums = weights.sum(-1)  # (n_layers, n_heads, T)
        if weights.numel() and float((sums - 1).abs().max()) > 1e-3:
            l, h, i = (int(v) for v in torch.nonzero((sums - 1).abs() > 1e-3)[0])
            raise ValueError(
                f"patterns must be attention patterns: row {i} of layer {l}, head {h} sums to "
                f"{float(sums[l, h, i]):.4g}, not 1"
            )
        ahead = torch.triu(weights, diagonal=1)  # (n_layers, n_heads, T, T): weights on keys j > i
        if weights.numel() and float(ahead.max()) > 1e-6:
            l, h, i, j = (int(v) for v in torch.nonzero(ahead > 1e-6)[0])
            raise ValueError(
                f"patterns must be causal (query i attends to keys j <= i): layer {l}, head {h}, "
                f"query {i} gives key {j} the weight {float(weights[l, h, i, j]):.4g}"
            )
        layer_labels = [str(x) for x in (layer_labels or [f"layer {l}" for l in range(n_layers)])]
        head_labels = [str(x) for x in (head_labels or [f"head {h}" for h in range(n_heads)])]
        if len(layer_labels) != n_layers:
            raise ValueError(f"layer_labels must have {n_layers} entries, got {len(layer_labels)}")
        if len(head_labels) != n_heads:
            raise ValueError(f"head_labels must have {n_heads} entries, got {len(head_labels)}")
        p = rounded(p, 6)
        scores = [
            {
                "name": s["name"],
                "values": rounded(s["values"], 3),
                "uniform": round(s["uniform"], 3),
            }
            for s in head_scores(torch.tensor(p, dtype=torch.float64), tokens)
        ]
        super().__init__(
            tokens=tokens,
            patterns=p,
            title=title,
            layer_labels=layer_labels,
            head_labels=head_labels,
            scores=scores,
        )

    def _repr_facts(self):
        return {
            "layers": len(self.patterns),
            "heads": len(self.patterns[0]),
            "tokens": len(self.tokens),
        }
