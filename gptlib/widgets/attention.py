"""Chapter 4's attention view: every head as a thumbnail, one enlarged, per-head scores.

The scores are small pure functions of a pattern ``A`` of shape (..., T, T), where row i is the
distribution of query i over keys j <= i:

    previous-token score  = mean over i = 1..T-1 of A[i, i-1]
    first-token score     = mean over i = 1..T-1 of A[i, 0]
    induction score       = mean over the pairs (i, j) of :func:`induction_pairs` of A[i, j]

The widget computes them once, in Python, and stores them rounded in its state, beside the score
of a uniform causal head (A[i, j] = 1 / (i + 1)), the level a head that looks nowhere in
particular reaches.
"""

from __future__ import annotations

from typing import Sequence

import torch
import traitlets
from torch import Tensor

from ._base import BookWidget, read_asset, rounded

__all__ = ["AttentionView", "previous_token_score", "first_token_score", "induction_pairs", "induction_score",
           "uniform_causal_pattern", "head_scores"]


def _check_pattern(pattern: Tensor, min_T: int = 2) -> None:
    if not isinstance(pattern, Tensor) or pattern.dim() < 2 or pattern.shape[-1] != pattern.shape[-2]:
        shape = tuple(pattern.shape) if isinstance(pattern, Tensor) else type(pattern).__name__
        raise ValueError(f"pattern must be a tensor of shape (..., T, T), got {shape}")
    if pattern.shape[-1] < min_T:
        raise ValueError(f"pattern needs T >= {min_T} positions for this score, got T = {pattern.shape[-1]}")


def previous_token_score(pattern: Tensor) -> Tensor:
    """Mean attention of query i on key i - 1, over the queries i = 1..T-1; (..., T, T) -> (...).

    >>> A = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.2, 0.0], [0.1, 0.6, 0.3]])
    >>> previous_token_score(A)  # (0.8 + 0.6) / 2
    tensor(0.7000)
    """
    _check_pattern(pattern)
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def first_token_score(pattern: Tensor) -> Tensor:
    """Mean attention of query i on key 0, over the queries i = 1..T-1; (..., T, T) -> (...).

    Query 0 is left out: it can only look at key 0.

    >>> A = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.2, 0.0], [0.1, 0.6, 0.3]])
    >>> first_token_score(A)  # (0.8 + 0.1) / 2
    tensor(0.4500)
    """
    _check_pattern(pattern)
    return pattern[..., 1:, 0].mean(dim=-1)


def induction_pairs(tokens: Sequence) -> list[tuple[int, int]]:
    """The (query, key) pairs an induction head attends along: query i, whose token last occurred
    at k < i, and key j = k + 1, the token that followed it then (what comes next, if the text
    repeats). Pairs with j = i (the same token twice in a row) are left out: there the induction
    key is the query itself, which any head that attends to itself would score on.

    >>> induction_pairs(["A", "B", "C", "A", "B"])
    [(3, 1), (4, 2)]
    >>> induction_pairs(["a", "a", "b"])  # (1, 1) would be the query itself
    []
    """
    last: dict = {}
    pairs = []
    for i, t in enumerate(tokens):
        k = last.get(t)
        if k is not None and k + 1 < i:
            pairs.append((i, k + 1))
        last[t] = i
    return pairs


def induction_score(pattern: Tensor, tokens: Sequence) -> Tensor | None:
    """Mean attention along :func:`induction_pairs` of ``tokens``; (..., T, T) -> (...), or None
    when no token repeats (then there is nothing to measure).

    >>> A = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0],
    ...                   [0.2, 0.2, 0.6, 0.0], [0.1, 0.7, 0.1, 0.1]])
    >>> induction_score(A, ["x", "y", "z", "x"])  # the pair (3, 1): "x" again, look at what followed it
    tensor(0.7000)
    >>> induction_score(A, ["a", "b", "c", "d"]) is None
    True
    """
    _check_pattern(pattern, min_T=1)
    if len(tokens) != pattern.shape[-1]:
        raise ValueError(f"tokens must have T = {pattern.shape[-1]} entries, got {len(tokens)}")
    pairs = induction_pairs(tokens)
    if not pairs:
        return None
    i, j = torch.tensor(pairs).T
    return pattern[..., i, j].mean(dim=-1)


def uniform_causal_pattern(T: int) -> Tensor:
    """The pattern of a head that spreads each query evenly over keys 0..i: A[i, j] = 1 / (i + 1).

    >>> uniform_causal_pattern(3)
    tensor([[1.0000, 0.0000, 0.0000],
            [0.5000, 0.5000, 0.0000],
            [0.3333, 0.3333, 0.3333]], dtype=torch.float64)
    """
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    mask = torch.tril(torch.ones(T, T, dtype=torch.float64))
    return mask / mask.sum(dim=-1, keepdim=True)  # (T, T)


def head_scores(patterns: Tensor, tokens: Sequence) -> list[dict]:
    """Every score that applies to these patterns (n_layers, n_heads, T, T), each as
    ``{"name", "values" (n_layers, n_heads), "uniform"}``, "uniform" being a uniform causal head's
    score on the same tokens. Needs T >= 2; the induction score only when a token repeats.

    >>> A = uniform_causal_pattern(4).expand(1, 2, 4, 4)
    >>> [(s["name"], s["values"].shape, round(s["uniform"], 3)) for s in head_scores(A, list("abab"))]
    [('previous token', torch.Size([1, 2]), 0.361), ('first token', torch.Size([1, 2]), 0.361), ('induction', torch.Size([1, 2]), 0.292)]
    """
    T = patterns.shape[-1]
    if T < 2:
        return []
    U = uniform_causal_pattern(T)
    found = [("previous token", previous_token_score), ("first token", first_token_score)]
    scores = [{"name": name, "values": f(patterns), "uniform": float(f(U))} for name, f in found]
    induction = induction_score(patterns, tokens)
    if induction is not None:
        scores.append({"name": "induction", "values": induction, "uniform": float(induction_score(U, tokens))})
    return scores


def _as_nested(patterns):
    if hasattr(patterns, "detach"):
        patterns = patterns.detach().to("cpu").double()
    if hasattr(patterns, "tolist"):
        patterns = patterns.tolist()
    return patterns


class AttentionView(BookWidget):
    """Attention patterns of shape (n_layers, n_heads, T, T) with token strings on both axes.

    The view shows every head as a thumbnail (layers down, heads across) with its scores
    (:func:`head_scores`: previous token, first token, and induction when a token repeats); a
    click enlarges a head into a heatmap with a colour scale and its legend. Row i of a pattern is
    the distribution of query i over keys j <= i. Hovering a token of the text (or a query row)
    colours the text by where that token attends and lists the keys it attends to most. Patterns
    may be a torch tensor, a numpy array or nested lists; they are stored rounded to 6 decimals,
    the scores to 3.

    >>> AttentionView(["a", "b"], [[[[1.0, 0.0], [0.25, 0.75]]]])
    AttentionView(layers=1, heads=1, tokens=2)
    """

    _esm = read_asset("attention.js")
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
        tokens = [str(t) for t in tokens]
        p = _as_nested(patterns)
        try:
            n_layers, n_heads = len(p), len(p[0])
            shapes = {(len(p[l][h]), len(row)) for l in range(n_layers) for h in range(n_heads) for row in p[l][h]}
        except (TypeError, IndexError):
            raise ValueError("patterns must have shape (n_layers, n_heads, T, T)") from None
        T = len(tokens)
        if shapes != {(T, T)}:
            raise ValueError(f"patterns must have shape (n_layers, n_heads, T, T) with T = len(tokens) = {T}, got rows {sorted(shapes)}")
        layer_labels = [str(x) for x in (layer_labels or [f"layer {l}" for l in range(n_layers)])]
        head_labels = [str(x) for x in (head_labels or [f"head {h}" for h in range(n_heads)])]
        if len(layer_labels) != n_layers:
            raise ValueError(f"layer_labels must have {n_layers} entries, got {len(layer_labels)}")
        if len(head_labels) != n_heads:
            raise ValueError(f"head_labels must have {n_heads} entries, got {len(head_labels)}")
        p = rounded(p, 6)
        scores = [{"name": s["name"], "values": rounded(s["values"], 3), "uniform": round(s["uniform"], 3)}
                  for s in head_scores(torch.tensor(p, dtype=torch.float64), tokens)]
        super().__init__(tokens=tokens, patterns=p, title=title, layer_labels=layer_labels,
                         head_labels=head_labels, scores=scores)

    def _repr_facts(self):
        return {"layers": len(self.patterns), "heads": len(self.patterns[0]), "tokens": len(self.tokens)}
