"""The distributions a sampling view stores (:class:`~gptlib.widgets.SamplingView`).

A model's next-token distribution over a large vocabulary is stored in part: its most probable
logits (:func:`top_logits`) and the total weight of the other tokens at every temperature the page
offers (:func:`rest_log_weights`), so that the probabilities the page shows are the model's own.
:func:`continuation_tree` stores such distributions after a text and after its most probable
continuations, a few tokens deep, so that the page can draw a few tokens with no model. A bigram
model is stored whole, as its nonzero counts (:func:`sparse_table`), from which the page computes
any row (:func:`table_logits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..runtime import check_float, check_ids, check_int
from ._base import rounded

__all__ = [
    "top_logits",
    "rest_log_weights",
    "continuation_tree",
    "sparse_table",
    "table_logits",
    "model_next_logits",
    "TEMPERATURES",
]

# The temperatures the page's slider offers (0.05 to 3 in steps of 0.05; 0 needs no weights).
TEMPERATURES = tuple(round(0.05 * k, 2) for k in range(1, 61))


def _temperatures(temperature: float) -> list[float]:
    """The slider's temperatures, and the view's own if it is not one of them (and not 0)."""
    extra = (
        [float(temperature)]
        if temperature > 0 and all(abs(t - temperature) > 1e-9 for t in TEMPERATURES)
        else []
    )
    return sorted([*TEMPERATURES, *extra])


def top_logits(logits: Tensor, n: int) -> tuple[list[int], list[float], float]:
    """The ids and values of the ``n`` largest logits, largest first (ties: the lower id first),
    and the probability mass those tokens hold at temperature 1.

    >>> ids, values, mass = top_logits(torch.tensor([1.0, 3.0, 2.0, 3.0]), 2)
    >>> ids, values, round(mass, 4)
    ([1, 3], [3.0, 3.0], 0.799)
    """
    _check_vector(logits)
    check_int("n", n, lo=1)
    _check_logits(logits)
    order = torch.sort(logits, descending=True, stable=True).indices[:n]  # (n,)
    mass = float(torch.softmax(logits.double(), dim=-1)[order].sum())
    return order.tolist(), logits[order].double().tolist(), mass


def _check_vector(logits: object) -> None:
    if not isinstance(logits, Tensor) or logits.dim() != 1:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a tensor of shape (d_vocab,), got {shape}")


def _check_temperatures(temperatures: Sequence[float]) -> list[float]:
    return [check_float("temperatures", t, 0.0, lo_open=True) for t in temperatures]


def _check_logits(logits: Tensor) -> None:
    if torch.isnan(logits).any():
        raise ValueError("logits must not contain NaN")
    if (logits == math.inf).any() or not (logits > -math.inf).any():
        raise ValueError(
            "logits must be finite, apart from -inf for tokens that can never be drawn"
        )


def rest_log_weights(
    logits: Tensor,
    stored: Sequence[int],
    temperatures: Sequence[float] = TEMPERATURES,
    ndigits: int = 4,
    reference: float | None = None,
) -> list[float | None] | None:
    """For the tokens *not* in ``stored``: log sum exp((y_i - m) / t) at each temperature t, m the
    largest logit (or ``reference``: the largest logit as the page stores it, rounded); ``None``
    for a temperature where they have no weight (all -inf), and ``None`` instead of the list when
    ``stored`` holds every token. With it the page knows the true probability of each stored
    token, p_i = exp((y_i - m)/t) / (sum over stored + exp(rest)). Rounded to ``ndigits`` decimals,
    the others' weight is right to a relative 5e-5 (for 4 decimals).

    >>> y = torch.tensor([2.0, 1.0, 0.0, 0.0])
    >>> rest = rest_log_weights(y, [0, 1], [1.0])  # two tokens at 0, two below the max
    >>> rest, round(math.log(2 * math.exp(-2.0)), 4)
    ([-1.3069], -1.3069)
    >>> rest_log_weights(y, [0, 1, 2, 3]) is None
    True
    """
    _check_vector(logits)
    logits = logits.detach().to("cpu").double()
    _check_logits(logits)
    stored = list(stored)
    check_ids(
        stored, logits.shape[-1], "stored"
    )  # a negative id would wrap around to the last tokens
    temperatures = _check_temperatures(temperatures)
    check_int("ndigits", ndigits, lo=0)
    if reference is not None:
        reference = check_float("reference", reference)
    others = torch.ones(logits.shape[-1], dtype=torch.bool)
    others[stored] = False
    if not others.any():
        return None
    tail, m = (
        logits[others],
        (logits.max() if reference is None else torch.tensor(reference, dtype=torch.float64)),
    )
    out: list[float | None] = []
    for t in temperatures:
        v = float(torch.logsumexp((tail - m) / float(t), dim=0))
        out.append(None if v == -math.inf else round(v, ndigits))
    return out


def continuation_tree(
    next_logits: Callable[[list[list[int]]], Tensor],
    context: Sequence[int],
    depth: int = 3,
    branch: int = 3,
    n_logits: int = 256,
    n_logits_deep: int = 64,
    ndigits: int = 4,
    temperatures: Sequence[float] = TEMPERATURES,
) -> dict:
    """The next-token distributions after ``context`` and after each of its ``branch`` most
    probable continuations, step after step, ``depth`` tokens deep.

    ``next_logits`` maps a list of contexts (lists of ids, all of one length) to their next-token
    logits, shape (B, d_vocab). A node is ``{"ids", "logits", "mass", "rest", "next"}``: the ids of
    its stored logits, largest first (``n_logits`` at the root, ``n_logits_deep`` below), the
    logits rounded to ``ndigits``, the probability mass the stored tokens hold at temperature 1,
    the other tokens' weight at each of ``temperatures`` (:func:`rest_log_weights`; ``None`` when
    every token is stored), and ``next``, the child node of each of the ``branch`` most probable
    ids (keys are ids as strings, as in JSON). A tree has 1 + branch + ... + branch**depth nodes.
    NaN or +inf logits are an error.

    >>> table = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # a bigram model
    >>> bigram = lambda contexts: table[[c[-1] for c in contexts]]
    >>> tree = continuation_tree(bigram, [0], depth=2, branch=1, n_logits=2, n_logits_deep=3)
    >>> tree["ids"], tree["logits"], round(tree["mass"], 4), list(tree["next"])
    ([1, 2], [2.0, 1.0], 0.91, ['1'])
    >>> child = tree["next"]["1"]  # after 0, 1: the distribution table[1]
    >>> child["ids"], list(child["next"]), child["next"]["0"]["next"]
    ([0, 1, 2], ['0'], {})
    """
    for name, value, low in (
        ("depth", depth, 0),
        ("branch", branch, 1),
        ("n_logits", n_logits, 1),
        ("n_logits_deep", n_logits_deep, 1),
    ):
        check_int(name, value, lo=low)
    if branch > n_logits or (depth >= 2 and branch > n_logits_deep):
        raise ValueError(
            f"branch ({branch}) must not exceed n_logits ({n_logits}) and n_logits_deep "
            f"({n_logits_deep})"
        )
    check_int("ndigits", ndigits, lo=0)
    temperatures = _check_temperatures(temperatures)
    check_ids(context, 2**63 - 1, "context")  # ints >= 0 (bools, floats and strings refused)
    context = [int(t) for t in context]
    if not context:
        raise ValueError("context must hold at least one token id")
    root: dict = {}
    frontier = [(root, context)]
    root_vocab = None  # the root's d_vocab, which every level must keep
    for level in range(depth + 1):
        logits = next_logits([c for _, c in frontier])  # (B, d_vocab)
        if (
            not isinstance(logits, Tensor)
            or logits.dim() != 2
            or len(logits) != len(frontier)
            or logits.shape[1] < 1
        ):
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(
                f"next_logits must return a tensor ({len(frontier)}, d_vocab) for "
                f"{len(frontier)} contexts, got {got}"
            )
        if root_vocab is None:
            root_vocab = logits.shape[1]
        elif logits.shape[1] != root_vocab:
            raise ValueError(
                f"next_logits returned {logits.shape[1]} logits per context at depth {level}, "
                f"{root_vocab} at the root"
            )
        grown = []
        for (node, c), row in zip(frontier, logits):
            row = row.detach().to("cpu").double()
            if torch.isnan(row).any() or (row == math.inf).any():
                raise ValueError(
                    f"next_logits gave NaN or +inf logits after the context {c[-8:]} (last 8 ids)"
                )
            ids, values, mass = top_logits(row, n_logits if level == 0 else n_logits_deep)
            values = rounded(values, ndigits)
            node.update(
                ids=ids,
                logits=values,
                mass=round(mass, 4),
                rest=rest_log_weights(row, ids, temperatures, reference=values[0]),
                next={},
            )
            if level < depth:
                for t in ids[:branch]:
                    node["next"][str(t)] = {}
                    grown.append((node["next"][str(t)], c + [t]))
        frontier = grown
    return root


def sparse_table(counts, smoothing: float = 0.01) -> dict:
    """A table of counts (d_vocab, d_vocab) as its nonzero entries, row by row (compressed sparse
    rows), with the ``smoothing`` that :func:`table_logits` adds to every count.

    Row ``a`` holds ``counts[a, b]``, how often token ``b`` follows token ``a``; its nonzero
    entries are ``indices[indptr[a]:indptr[a + 1]]`` (columns, increasing) and the same slice of
    ``counts`` (ints where a count is whole). Counts must be finite and >= 0, ``smoothing``
    finite and > 0 (so that every logit is finite).

    >>> n = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> sparse_table(n)
    {'indptr': [0, 2, 3, 3], 'indices': [1, 2, 0], 'counts': [2, 1, 3], 'smoothing': 0.01}
    """
    if not isinstance(counts, Tensor):
        try:
            counts = torch.as_tensor(counts, dtype=torch.float64)  # nested lists, NumPy
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"counts must be a table of numbers (d_vocab, d_vocab): {e}") from e
    counts = counts.detach().to("cpu", torch.float64)
    if counts.dim() != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] < 1:
        raise ValueError(
            f"counts must be a square table (d_vocab, d_vocab), got shape {tuple(counts.shape)}"
        )
    if not torch.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("counts must be finite and >= 0")
    smoothing = check_float("smoothing", smoothing, 0.0, lo_open=True)
    rows, cols = counts.nonzero(as_tuple=True)  # row-major order: rows, then columns, increasing
    values = counts[rows, cols].tolist()
    indptr = torch.zeros(len(counts) + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=len(counts)), 0)
    return {
        "indptr": indptr.tolist(),
        "indices": cols.tolist(),
        "counts": [int(v) if v.is_integer() else v for v in values],
        "smoothing": smoothing,
    }


def table_logits(table: dict, a: int) -> Tensor:
    """The next-token logits after token ``a`` of a :func:`sparse_table`: log(n_ab + smoothing)
    for every token b, float64, shape (d_vocab,). The page computes the same numbers
    (``tableLogits`` in distribution.js).

    >>> n = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> y = table_logits(sparse_table(n, smoothing=0.5), 0)
    >>> torch.equal(y, torch.log(n[0].double() + 0.5))
    True
    >>> table_logits(sparse_table(n), 2).tolist() == [math.log(0.01)] * 3  # a row never seen
    True
    """
    d_vocab = len(table["indptr"]) - 1
    check_int("a", a, 0, d_vocab - 1)
    lo, hi = table["indptr"][a], table["indptr"][a + 1]
    counts = torch.zeros(d_vocab, dtype=torch.float64)  # (d_vocab,)
    counts[table["indices"][lo:hi]] = torch.tensor(table["counts"][lo:hi], dtype=torch.float64)
    return torch.log(counts + table["smoothing"])


def model_next_logits(model) -> Callable[[list[list[int]]], Tensor]:
    n_ctx = model.config.n_ctx
    dev = next(model.parameters()).device

    @torch.no_grad()
    def next_logits(contexts):
        x = torch.tensor([c[-n_ctx:] for c in contexts], device=dev)  # (B, T)
        return model(x)[:, -1].double().cpu()  # (B, d_vocab)

    return next_logits


def _nodes(node: dict):
    yield node
    for child in node["next"].values():
        yield from _nodes(child)
