"""Chapter 8: reading heads — attention scores on repeated sequences, composition of two heads,
copying.

The per-head scores of a pattern A (..., T, T), row i the distribution of query i over keys j <= i:

    previous-token score  = mean over i = 1..T-1 of A[i, i-1]
    first-token score     = mean over i = 1..T-1 of A[i, 0]
    induction score       = mean over the pairs (i, j) of :func:`induction_pairs` of A[i, j]
                            (query i, key after the previous occurrence of token i)

and the uniform causal head (A[i, j] = 1 / (i + 1)) that is their chance level; the attention view
(:mod:`gptlib.widgets.attention`) shows them, :func:`score_table` averages them over a batch. On [r,
r] with no token repeated inside r
the induction pairs are (t, t - L + 1) for t >= L: the token after the previous occurrence.

Composition, in the book's row-vector convention (x W, Chapter 4): a head's score is
x_q W_QK x_k^T and its output is A X W_OV. If an earlier head writes y W_OV^1 into the stream that a
later head reads, the later head's bilinear forms pick up

    K-composition (keys):     x_q W_QK^2 (y W_OV^1)^T = x_q (W_QK^2 (W_OV^1)^T) y^T
    Q-composition (queries):  (y W_OV^1) W_QK^2 x_k^T = y (W_OV^1 W_QK^2) x_k^T
    V-composition (values):   (y W_OV^1) W_OV^2      = y (W_OV^1 W_OV^2)

and the size of each product relative to its factors, ||W_A W_B||_F / (||W_A||_F ||W_B||_F),
measures
how much the second head reads what the first writes (Elhage et al. 2021, "A Mathematical Framework
for Transformer Circuits", who write column vectors: their W_OV is our W_OV^T, the same score).

Whether a behaviour needs a head is tested by removing the head: :func:`ablate_heads` zeroes
heads' outputs for the duration of a ``with`` block (Chapter 12 measures the loss on a repeated
text with its induction heads removed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from .runtime import check_positive_int

__all__ = [
    "previous_token_score",
    "first_token_score",
    "induction_pairs",
    "induction_score",
    "uniform_causal_pattern",
    "head_scores",
    "repeated_sequences",
    "score_table",
    "composition_score",
    "k_composition",
    "q_composition",
    "v_composition",
    "composition_scores",
    "copying_score",
    "diagonal_argmax_rate",
    "ablate_heads",
]


def _check_pattern(pattern: Tensor, min_T: int = 2) -> None:
    if (
        not isinstance(pattern, Tensor)
        or pattern.dim() < 2
        or pattern.shape[-1] != pattern.shape[-2]
    ):
        shape = tuple(pattern.shape) if isinstance(pattern, Tensor) else type(pattern).__name__
        raise ValueError(f"pattern must be a tensor of shape (..., T, T), got {shape}")
    if pattern.shape[-1] < min_T:
        raise ValueError(
            f"pattern needs T >= {min_T} positions for this score, got T = {pattern.shape[-1]}"
        )


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
    >>> induction_score(A, ["x", "y", "z", "x"])  # pair (3, 1): "x" again, look at what followed it
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
    check_positive_int("T", T)
    mask = torch.tril(torch.ones(T, T, dtype=torch.float64))
    return mask / mask.sum(dim=-1, keepdim=True)  # (T, T)


def head_scores(patterns: Tensor, tokens: Sequence) -> list[dict]:
    """Every score that applies to these patterns (n_layers, n_heads, T, T), each as
    ``{"name", "values" (n_layers, n_heads), "uniform"}``, "uniform" being a uniform causal head's
    score on the same tokens. Needs T >= 2; the induction score only when a token repeats.

    >>> A = uniform_causal_pattern(4).expand(1, 2, 4, 4)
    >>> for s in head_scores(A, list("abab")):
    ...     print(s["name"], tuple(s["values"].shape), round(s["uniform"], 3))
    previous token (1, 2) 0.361
    first token (1, 2) 0.361
    induction (1, 2) 0.292
    """
    T = patterns.shape[-1]
    if T < 2:
        return []
    U = uniform_causal_pattern(T)
    found = [("previous token", previous_token_score), ("first token", first_token_score)]
    scores = [{"name": name, "values": f(patterns), "uniform": float(f(U))} for name, f in found]
    induction = induction_score(patterns, tokens)
    if induction is not None:
        scores.append(
            {"name": "induction", "values": induction, "uniform": float(induction_score(U, tokens))}
        )
    return scores


def repeated_sequences(
    n: int,
    length: int,
    d_vocab: int,
    generator: torch.Generator | None = None,
    total: int | None = None,
) -> Tensor:
    """``n`` sequences of ``length`` uniformly random tokens, each followed by itself: (n,
    2*length).

    With ``total``, the random block is repeated until the sequence has ``total`` tokens (a period
    of
    ``length``; the last copy may be cut short).

    >>> ids = repeated_sequences(2, 3, 10, torch.Generator().manual_seed(0))
    >>> ids.shape, bool((ids[:, :3] == ids[:, 3:]).all())
    (torch.Size([2, 6]), True)
    >>> ids = repeated_sequences(1, 2, 10, torch.Generator().manual_seed(0), total=5)
    >>> bool((ids[0, 2:] == ids[0, :3]).all())
    True
    """
    total = 2 * length if total is None else total
    for name, value in (("n", n), ("length", length), ("d_vocab", d_vocab), ("total", total)):
        check_positive_int(name, value)
    r = torch.randint(0, d_vocab, (n, length), generator=generator)  # (n, length)
    return r.repeat(1, -(-total // length))[:, :total]  # (n, total)


def score_table(patterns: Tensor, ids: Tensor) -> dict[str, Tensor]:
    """Previous-token, induction and first-token scores of every head, averaged over a batch.

    ``patterns``: (B, n_layers, n_heads, T, T) as ``GPT.attention_patterns(ids)`` returns it,
    ``ids`` (B, T); or one sequence, (n_layers, n_heads, T, T) and (T,). Each entry of the result
    is (n_layers, n_heads). Every sequence needs a repeated token (else there is no induction
    pair). The chance level is the same table for a uniform causal head on the same ``ids``.

    >>> patterns = uniform_causal_pattern(4).expand(2, 3, 4, 4)
    >>> table = score_table(patterns, torch.tensor([1, 2, 1, 2]))
    >>> {k: round(float(v[1, 2]), 4) for k, v in table.items()}  # the pairs (2, 1) and (3, 2)
    {'previous-token': 0.3611, 'induction': 0.2917, 'first-token': 0.3611}
    """
    if not isinstance(patterns, Tensor) or patterns.dim() not in (4, 5):
        shape = tuple(patterns.shape) if isinstance(patterns, Tensor) else type(patterns).__name__
        raise ValueError(f"patterns must have shape ([B,] n_layers, n_heads, T, T), got {shape}")
    p = patterns if patterns.dim() == 5 else patterns[None]  # (B, n_layers, n_heads, T, T)
    ids = torch.as_tensor(ids)
    ids = ids if ids.dim() == 2 else ids[None]  # (B, T)
    if tuple(ids.shape) != (p.shape[0], p.shape[-1]):
        raise ValueError(
            f"ids must have shape (B, T) = {(p.shape[0], p.shape[-1])}, got {tuple(ids.shape)}"
        )
    induction = []
    for b, seq in enumerate(ids.tolist()):
        score = induction_score(p[b], seq)  # (n_layers, n_heads), or None without a repeat
        if score is None:
            raise ValueError(f"ids: sequence {b} repeats no token, so it has no induction score")
        induction.append(score)
    return {
        "previous-token": previous_token_score(p).mean(0),
        "induction": torch.stack(induction).mean(0),
        "first-token": first_token_score(p).mean(0),
    }


def composition_score(W_A: Tensor, W_B: Tensor) -> Tensor:
    """||W_A W_B||_F / (||W_A||_F ||W_B||_F): in [0, 1], 1 when W_A's rows lie where W_B reads.

    >>> e1, e2 = torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    >>> float(composition_score(e1, e1)), float(composition_score(e1, e2))
    (1.0, 0.0)
    """
    for name, W in (("W_A", W_A), ("W_B", W_B)):
        if not isinstance(W, Tensor) or W.dim() != 2:
            raise ValueError(
                f"{name} must be a matrix, got "
                f"{tuple(W.shape) if isinstance(W, Tensor) else type(W).__name__}"
            )
    if W_A.shape[1] != W_B.shape[0]:
        raise ValueError(
            f"W_A (m, n) and W_B (n, p) must agree, got {tuple(W_A.shape)} and {tuple(W_B.shape)}"
        )
    return torch.linalg.matrix_norm(W_A @ W_B) / (
        torch.linalg.matrix_norm(W_A) * torch.linalg.matrix_norm(W_B)
    )


def k_composition(W_QK2: Tensor, W_OV1: Tensor) -> Tensor:
    """How much a later head's keys read an earlier head's output: score of W_QK^2 (W_OV^1)^T."""
    return composition_score(W_QK2, W_OV1.T)


def q_composition(W_QK2: Tensor, W_OV1: Tensor) -> Tensor:
    """How much a later head's queries read an earlier head's output: score of W_OV^1 W_QK^2."""
    return composition_score(W_OV1, W_QK2)


def v_composition(W_OV2: Tensor, W_OV1: Tensor) -> Tensor:
    """How much a later head's values read an earlier head's output: score of W_OV^1 W_OV^2."""
    return composition_score(W_OV1, W_OV2)


_COMPOSITIONS = {"K": k_composition, "Q": q_composition, "V": v_composition}


def composition_scores(first, second, kind: str = "K") -> Tensor:
    """Composition of every head of attention layer ``first`` with every head of a later ``second``.

    ``first``, ``second``: :class:`gptlib.attention.MultiHeadAttention` (anything with ``n_heads``,
    ``W_QK(h)`` and ``W_OV(h)``). Returns (first.n_heads, second.n_heads); entry (i, j) scores head
    i of ``first`` feeding head j of ``second`` through the keys, queries or values (``kind``).
    """
    if kind not in _COMPOSITIONS:
        raise ValueError(f"kind must be one of {sorted(_COMPOSITIONS)}, got {kind!r}")
    score = _COMPOSITIONS[kind]
    with torch.no_grad():
        return torch.stack(
            [
                torch.stack(
                    [
                        score(second.W_OV(j) if kind == "V" else second.W_QK(j), first.W_OV(i))
                        for j in range(second.n_heads)
                    ]
                )
                for i in range(first.n_heads)
            ]
        )


def copying_score(M: Tensor) -> Tensor:
    """sum(eigenvalues) / sum(|eigenvalues|) of a square matrix: 1 for a copying map, -1 for an
    anti-copying one.

    Used on a head's token-to-token OV circuit W_E W_OV W_U (d_vocab, d_vocab): row a holds the
    logits the head adds when it attends to token a. Complex eigenvalues come in conjugate pairs,
    so the sum is real.

    >>> D = torch.diag(torch.tensor([2.0, 1.0]))
    >>> float(copying_score(D)), float(copying_score(-torch.eye(3)))
    (1.0, -1.0)
    >>> round(float(copying_score(torch.diag(torch.tensor([3.0, -1.0])))), 4)  # (3 - 1) / (3 + 1)
    0.5
    """
    if not isinstance(M, Tensor) or M.dim() != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(
            "M must be a square matrix, got "
            f"{tuple(M.shape) if isinstance(M, Tensor) else type(M).__name__}"
        )
    eig = torch.linalg.eigvals(M.detach().to(torch.float64))
    return (eig.sum().real / eig.abs().sum()).to(M.dtype)


def diagonal_argmax_rate(M: Tensor) -> Tensor:
    """Share of rows i whose largest entry is M[i, i] (chance for a random matrix: 1/n).

    >>> float(diagonal_argmax_rate(torch.tensor([[2.0, 1.0], [3.0, 0.0]])))
    0.5
    """
    if not isinstance(M, Tensor) or M.dim() != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(
            "M must be a square matrix, got "
            f"{tuple(M.shape) if isinstance(M, Tensor) else type(M).__name__}"
        )
    return (M.argmax(dim=-1) == torch.arange(M.shape[0], device=M.device)).float().mean()


# --- ablation (Chapter 12): does a behaviour need a head? ----------------------------------------
@contextmanager
def ablate_heads(model, heads: Iterable[tuple[int, int]]) -> Iterator[None]:
    """Zero-ablation: inside the ``with`` block, each head ``(layer, h)`` writes nothing into the
    residual stream; on leaving it (also on an error) the weights are as they were, bit for bit.

    Head h of a layer adds A^h X W_V^h W_O^h to the stream (Chapter 4), and W_O^h is rows
    h*d_head .. (h+1)*d_head - 1 of the layer's W_O: setting them to 0 removes that term and
    nothing else (the other heads, the bias b_O, the MLPs are untouched). Works for any model whose
    ``blocks[layer].attn`` has ``W_O`` (n_heads*d_head, d_model), ``n_heads`` and ``d_head``:
    :class:`gptlib.model.GPT` and :class:`gptlib.modern.ModernGPT` (in GQA, a query head).

    >>> from gptlib.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig.preset("tiny")).eval()
    >>> ids = torch.tensor([[1, 2, 3, 1, 2]])
    >>> with torch.no_grad(), ablate_heads(model, [(1, 0), (1, 3)]):
    ...     ablated = model(ids)
    >>> with torch.no_grad():
    ...     bool((ablated != model(ids)).any()), float(model.blocks[1].attn.W_O.abs().sum()) > 0
    (True, True)
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(
            f"model must have attention layers blocks[l].attn, got {type(model).__name__}"
        )
    chosen = []
    for pair in heads:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(type(v) is int for v in pair)):
            raise ValueError(f"heads must be (layer, head) pairs of ints, got {pair!r}")
        layer, h = pair
        if not 0 <= layer < len(blocks) or not 0 <= h < blocks[layer].attn.n_heads:
            raise ValueError(
                f"heads: ({layer}, {h}) is not a head of this model "
                f"({len(blocks)} layers of {blocks[0].attn.n_heads} heads)"
            )
        attn = blocks[layer].attn
        chosen.append((attn.W_O, slice(h * attn.d_head, (h + 1) * attn.d_head)))
    with torch.no_grad():
        saved = [(W_O, rows, W_O[rows].clone()) for W_O, rows in chosen]
    try:
        with torch.no_grad():
            for W_O, rows, _ in saved:
                W_O[rows] = 0.0  # (d_head, d_model): W_O^h
        yield
    finally:
        with torch.no_grad():
            for W_O, rows, kept in reversed(saved):
                W_O[rows] = kept
