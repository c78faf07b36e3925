"""Chapter 7's sampling view: the next-token distribution under temperature, top-k and top-p.

Three forms. ``SamplingView(logits, tokens)`` shows one distribution.
``SamplingView.from_table`` ships a whole bigram table of counts (its nonzero entries,
:func:`sparse_table`), from which the page computes the logits after any token exactly as
:func:`table_logits` does, so the reader draws as many tokens as they like, in the page or in a
kernel. ``SamplingView.from_model`` shows a model's distributions after several prompts, and
stores for each prompt a small tree of continuations (:func:`continuation_tree`), so that the page
can draw a few tokens in a row with no kernel: after each of the most probable tokens at each step
it knows the model's next distribution. Past the tree, a view that names the live model's files
(``source``, as :class:`~gptlib.widgets.PlaygroundView` does) hands over to it: the page starts
the live model (or asks the kernel) and computes every later distribution. Without a live model
the page says where the stored tree ends; it never makes up a distribution.

Where a distribution is stored only in part (its most probable tokens), the state also holds the
total weight of the other tokens at every temperature the page offers (:func:`rest_log_weights`),
so the probabilities the page shows are the model's own, the other tokens are one bar, and top-p
cuts the true cumulative mass. (The live model, :class:`~gptlib.widgets.PlaygroundView`, needs none
of this: it computes every distribution.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import traitlets
from torch import Tensor

from ..export import weights_sha256
from ..runtime import check_float, check_ids, check_int
from ..step import step, step_inputs
from ._base import (
    BookWidget,
    bundle,
    check_source,
    check_strings,
    check_title,
    read_asset,
    rounded,
)

__all__ = [
    "SamplingView",
    "top_logits",
    "rest_log_weights",
    "continuation_tree",
    "sparse_table",
    "table_logits",
    "TEMPERATURES",
]

MAX_FULL_VOCAB = 8192
KEPT_WHEN_LARGER = 4096
MASKED_LOGIT = -1e30  # stands for -inf in the (JSON) widget state
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


def _token_strings(tokenizer) -> Callable[[int], str]:
    if hasattr(tokenizer, "token_str"):
        return tokenizer.token_str
    return lambda i: tokenizer.decode([i])


def _model_next_logits(model) -> Callable[[list[list[int]]], Tensor]:
    n_ctx = model.config.n_ctx
    dev = next(model.parameters()).device

    @torch.no_grad()
    def next_logits(contexts):
        x = torch.tensor([c[-n_ctx:] for c in contexts], device=dev)  # (B, T)
        return model(x)[:, -1].double().cpu()  # (B, d_vocab)

    return next_logits


def _check_settings(temperature, top_k, top_p, n_show, seed) -> None:
    check_float("temperature", temperature, 0.0, 1e6)
    if top_k is not None:
        check_int("top_k", top_k, lo=1)
    if top_p is not None:
        check_float("top_p", top_p, 0.0, 1.0, lo_open=True)
    check_int("n_show", n_show, lo=1)
    check_int("seed", seed, 0, 2**32 - 1)


def _check_vocabulary(tokenizer, d_vocab: int) -> None:
    """A tokenizer that names tokens of the model's vocabulary, no more and no fewer."""
    size = getattr(tokenizer, "vocab_size", d_vocab)
    if size != d_vocab:
        raise ValueError(f"tokenizer has {size} tokens, the model d_vocab={d_vocab}")


def _nodes(node: dict):
    yield node
    for child in node["next"].values():
        yield from _nodes(child)


class SamplingView(BookWidget):
    """Bars for the most probable next tokens, recomputed live from the logits in JavaScript.

    The browser applies exactly :func:`gptlib.sampling.next_token_probs`: temperature, then top-k,
    then top-p, then renormalisation (temperature 0 = all mass on the argmax). The axis is fixed
    (probability 0 to 1); behind each bar is a ghost of the distribution at temperature 1; a line
    shows the cumulative mass that top-p cuts; a last bar holds all the tokens not drawn above.
    "Sample next token" draws from the shown distribution with a seeded generator (``seed``) and
    moves on to the distribution after the drawn token: computed from the table
    (:meth:`from_table`), stored in the tree (:meth:`from_model`), or past the tree computed by the
    live model when the view names one (``source``); where there is none, the page says so and
    stops. Undo removes the last token; reset starts the text again (the seeded generator goes
    on, so the draws differ).

    ``SamplingView(logits, tokens)`` shows one distribution: for vocabularies of at most 8192
    tokens the state holds every logit; above that it holds the 4096 largest and the other
    tokens' total weight at each temperature of the slider (:func:`rest_log_weights`), so the
    probabilities are still the model's own (top-k is then limited to the stored tokens). Logits
    are stored rounded to 6 decimals; a logit of -inf (a token that can never be drawn) is stored
    as -1e30, since JSON has no infinities, and keeps probability 0. :meth:`from_model` shows a
    model's distributions after several prompts.

    >>> SamplingView([10.0, 6.0, 4.0], ["a", "b", "c"], temperature=0.5, top_k=2)
    SamplingView(vocab=3, temperature=0.5, top_k=2, top_p=1.0)
    """

    _esm = bundle("sampling")
    _css = read_asset("widgets.css")
    prompts = traitlets.List(traitlets.Dict()).tag(sync=True)  # [{"text", "root": node}]
    tokens = traitlets.Dict().tag(sync=True)  # {str(id): token string} for every stored id
    vocab_size = traitlets.Int(0).tag(sync=True)
    temperatures = traitlets.List(traitlets.Float()).tag(
        sync=True
    )  # where nodes store the others' weight
    prompt = traitlets.Int(0).tag(sync=True)
    temperature = traitlets.Float(1.0).tag(sync=True)
    top_k = traitlets.Int(0).tag(sync=True)  # 0 = off
    top_p = traitlets.Float(1.0).tag(sync=True)
    n_show = traitlets.Int(20).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    seed = traitlets.Int(0).tag(sync=True)
    table = traitlets.Dict().tag(sync=True)  # from_table: sparse_table(counts); else {}
    source = traitlets.Unicode("").tag(sync=True)  # the live model's manifest; "" for none
    weights_sha256 = traitlets.Unicode("").tag(sync=True)  # of the model the live files must be

    def __init__(
        self,
        logits,
        tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        n_show=20,
        title="",
        *,
        seed=0,
    ):
        if hasattr(logits, "detach"):
            logits = logits.detach().to("cpu").double()
        raw = logits.tolist() if hasattr(logits, "tolist") else list(logits)
        if not raw or any(isinstance(v, (list, tuple)) or hasattr(v, "__len__") for v in raw):
            raise ValueError("logits must be a non-empty 1-D sequence (one logit per token)")
        values = [float(v) for v in raw]
        _check_logits(torch.tensor(values, dtype=torch.float64))
        tokens = check_strings("tokens", tokens)
        if len(tokens) != len(values):
            raise ValueError(
                f"tokens must have one string per logit ({len(values)}), got {len(tokens)}"
            )
        _check_settings(temperature, top_k, top_p, n_show, seed)
        temps = _temperatures(temperature)
        y = torch.tensor(values, dtype=torch.float64)
        ids, _, mass = top_logits(y, min(len(values), KEPT_WHEN_LARGER))
        ids = sorted(ids) if len(values) > MAX_FULL_VOCAB else list(range(len(values)))
        # JSON has no -inf: a logit this far below the others has probability exactly 0 anyway.
        kept = rounded([values[i] if values[i] != -math.inf else MASKED_LOGIT for i in ids], 6)
        full = len(ids) == len(values)
        root = {
            "ids": ids,
            "logits": kept,
            "mass": 1.0 if full else round(mass, 4),
            "rest": rest_log_weights(y, ids, temps, reference=max(kept)),
            "next": {},
        }
        self._facts = {"vocab": len(ids)}
        self._setup(
            [{"text": "", "root": root}],
            {str(i): tokens[i] for i in ids},
            len(values),
            temps,
            temperature,
            top_k,
            top_p,
            n_show,
            title,
            seed,
        )

    @classmethod
    def from_model(
        cls,
        model,
        tokenizer,
        prompts: Sequence[str],
        *,
        depth: int = 3,
        branch: int = 3,
        n_logits: int = 1024,
        n_logits_deep: int = 64,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        n_show: int = 20,
        title: str = "",
        seed: int = 0,
        source: str | None = None,
    ) -> SamplingView:
        """The model's next-token distributions after each prompt, with a tree of continuations.

        ``model`` is a GPT (``config.n_ctx``, ``forward(ids) -> logits``) or any function that maps
        a
        list of contexts (lists of ids, all of one length) to their next-token logits (B, d_vocab),
        a bigram table's rows for instance. For each prompt the state holds the ``n_logits``
        largest logits after it, and
        :func:`continuation_tree` below it: the distributions (``n_logits_deep`` logits each, and
        the others' weight) after each of the ``branch`` most probable tokens at each step,
        ``depth`` steps deep. ``tokenizer`` needs ``encode`` and ``token_str`` (or ``decode``). A
        GPT runs once per tree level, in eval mode, without gradients; a context longer than
        ``n_ctx`` is cropped to its last ``n_ctx`` tokens, as in :func:`gptlib.sampling.generate`.

        ``source`` (a GPT only) names the live model's manifest under the book's ``_static/``, as
        in :class:`~gptlib.widgets.PlaygroundView` (``"live/english.json"``): when a draw leaves
        the stored tree, the page starts that model, if its weights are this model's
        (:func:`gptlib.export.weights_sha256`), or in Jupyter and Colab asks this object, which
        answers with ``model``; from there on every distribution is computed, over the whole
        vocabulary.
        """
        if (
            isinstance(prompts, str)
            or not prompts
            or not all(isinstance(p, str) and p for p in prompts)
        ):
            raise ValueError("prompts must be a non-empty list of non-empty strings")
        _check_settings(temperature, top_k, top_p, n_show, seed)
        temps = _temperatures(temperature)
        is_module = isinstance(model, torch.nn.Module)
        if not is_module and not callable(model):
            raise ValueError(
                f"model must be a GPT or a function of contexts, got {type(model).__name__}"
            )
        if is_module:
            _check_vocabulary(tokenizer, model.config.d_vocab)
        if source is not None:
            if not is_module:
                raise ValueError(
                    "source needs a model (a GPT whose weights the live files hold), not a "
                    "function of contexts"
                )
            source = check_source(source)
        was_training = model.training if is_module else False
        if is_module:
            model.eval()
        try:
            next_logits = _model_next_logits(model) if is_module else model
            trees = [
                {
                    "text": p,
                    "ids": tokenizer.encode(p),
                    "root": continuation_tree(
                        next_logits,
                        tokenizer.encode(p),
                        depth,
                        branch,
                        n_logits,
                        n_logits_deep,
                        temperatures=temps,
                    ),
                }
                for p in prompts
            ]
        finally:
            if is_module:
                model.train(was_training)
        d_vocab = (
            model.config.d_vocab
            if is_module
            else len(next_logits([tokenizer.encode(prompts[0])])[0])
        )
        _check_vocabulary(tokenizer, d_vocab)
        token_str = _token_strings(tokenizer)
        vocab: dict[str, str] = {}
        for t in trees:
            for node in _nodes(t["root"]):
                for i in node["ids"]:
                    vocab.setdefault(str(i), token_str(i))
        view = cls.__new__(cls)
        view._facts = {"prompts": len(prompts), "vocab": d_vocab, "depth": depth}
        live = {}
        if source is not None:
            view._facts["live"] = source
            live = {"source": source, "weights_sha256": weights_sha256(model)}
        view._setup(
            trees,
            dict(sorted(vocab.items(), key=lambda kv: int(kv[0]))),
            d_vocab,
            temps,
            temperature,
            top_k,
            top_p,
            n_show,
            title,
            seed,
            **live,
        )
        if source is not None:
            view._live = (model, tokenizer)
            view.on_msg(view._answer)
        return view

    @classmethod
    def from_table(
        cls,
        counts,
        tokenizer,
        prompts: Sequence[str],
        *,
        smoothing: float = 0.01,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        n_show: int = 20,
        title: str = "",
        seed: int = 0,
    ) -> SamplingView:
        """A bigram model, whole: ``counts[a, b]`` is how often token b follows token a, and the
        logits after a text that ends with token a are log(counts[a, b] + smoothing)
        (:func:`table_logits`).

        The state holds the table's nonzero counts (:func:`sparse_table`) and every token's
        string (``tokenizer.token_str`` or ``decode``); the page computes the row after the last
        token of the text, in the page or in a kernel alike, so the reader draws as many tokens
        as they like, seeded, with undo and reset. Each prompt must give at least one token.

        >>> from gptlib.tokenizers import CharTokenizer
        >>> tok = CharTokenizer.train("abc")
        >>> n = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
        >>> view = SamplingView.from_table(n, tok, ["ab"], top_p=0.9)
        >>> view
        SamplingView(prompts=1, vocab=3, nonzero=3, temperature=1.0, top_k=None, top_p=0.9)
        >>> view.prompts, view.table["indices"]
        ([{'text': 'ab', 'ids': [0, 1]}], [1, 2, 0])
        """
        if (
            isinstance(prompts, str)
            or not prompts
            or not all(isinstance(p, str) and p for p in prompts)
        ):
            raise ValueError("prompts must be a non-empty list of non-empty strings")
        _check_settings(temperature, top_k, top_p, n_show, seed)
        table = sparse_table(counts, smoothing)
        d_vocab = len(table["indptr"]) - 1
        _check_vocabulary(tokenizer, d_vocab)
        texts = []
        for p in prompts:
            ids = tokenizer.encode(p)
            if not ids:
                raise ValueError(f"prompts must each give at least one token, got {p!r}")
            check_ids(ids, d_vocab, "prompts")
            texts.append({"text": p, "ids": list(ids)})
        token_str = _token_strings(tokenizer)
        view = cls.__new__(cls)
        view._facts = {"prompts": len(prompts), "vocab": d_vocab, "nonzero": len(table["counts"])}
        view._setup(
            texts,
            {str(i): token_str(i) for i in range(d_vocab)},
            d_vocab,
            _temperatures(temperature),
            temperature,
            top_k,
            top_p,
            n_show,
            title,
            seed,
            table=table,
        )
        return view

    def _setup(
        self,
        prompts,
        vocab,
        vocab_size,
        temps,
        temperature,
        top_k,
        top_p,
        n_show,
        title,
        seed,
        *,
        table=None,
        source="",
        weights_sha256="",
    ) -> None:
        _check_settings(temperature, top_k, top_p, n_show, seed)
        check_title(title)
        if table is None:
            partial = [
                len(n["ids"]) for p in prompts for n in _nodes(p["root"]) if n["rest"] is not None
            ]
            if top_k is not None and partial and top_k > min(partial):
                raise ValueError(
                    f"top_k must be <= {min(partial)}, the fewest tokens a stored distribution "
                    f"holds (beyond them the page cannot tell which tokens top-k keeps), got "
                    f"{top_k}"
                )
            longest = max(len(p["root"]["ids"]) for p in prompts)
        else:
            longest = vocab_size  # every row holds every token
        if top_k is not None and top_k > vocab_size:
            raise ValueError(f"top_k must be <= d_vocab={vocab_size}, got {top_k}")
        BookWidget.__init__(
            self,
            table=table or {},
            source=source,
            weights_sha256=weights_sha256,
            prompts=prompts,
            tokens=vocab,
            vocab_size=int(vocab_size),
            temperatures=list(temps),
            prompt=0,
            temperature=float(temperature),
            top_k=int(top_k or 0),
            top_p=float(top_p if top_p is not None else 1.0),
            n_show=int(min(n_show, longest)),
            title=title,
            seed=int(seed),
        )

    # --- the kernel's side of the live model (from_model with a source) ------------------------
    def _logits(self, ids: list[int]) -> torch.Tensor:
        """The model's next-token logits after ``ids`` (cropped to its last n_ctx tokens, as
        :func:`gptlib.sampling.generate` does): :func:`gptlib.export.step`, as the page's graph
        computes them, float32 (d_vocab,) on the CPU."""
        model, _ = self._live
        c = model.config
        check_ids(ids, c.d_vocab)
        if not ids:
            raise ValueError("ids must hold at least one token")
        dev = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:  # the step the page's graph computes, from an empty cache, every head kept
            window = torch.tensor([ids[-c.n_ctx :]], device=dev)  # (1, T)
            y = step(model, window, *step_inputs(model))["logits"][0]  # (d_vocab,)
        finally:
            model.train(was_training)
        if not torch.isfinite(y).all():
            raise ValueError("the model gives non-finite logits (NaN or inf) after this text")
        return y.float().cpu()

    def _answer(self, _widget, content: dict, _buffers) -> None:
        """Answers the page in Jupyter and Colab: ``ping``; ``start`` (n_ctx, d_vocab and every
        token's string); ``logits`` of ``ids`` (one float32 buffer). An error is answered with its
        message, which the page shows."""
        if not isinstance(content, dict) or "req" not in content:
            return
        req, kind = content["req"], content.get("kind")
        try:
            model, tokenizer = self._live
            if kind == "ping":
                self.send({"kind": "pong", "req": req})
            elif kind == "start":
                c, token_str = model.config, _token_strings(tokenizer)
                self.send(
                    {
                        "kind": "started",
                        "req": req,
                        "config": {"n_ctx": c.n_ctx, "d_vocab": c.d_vocab},
                        "tokens": [token_str(i) for i in range(c.d_vocab)],
                    }
                )
            elif kind == "logits":
                y = self._logits(list(content.get("ids", [])))
                self.send({"kind": "logits", "req": req}, buffers=[y.numpy().tobytes()])
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as e:  # the page shows the message; nothing is silent
            self.send({"kind": "error", "req": req, "message": f"{type(e).__name__}: {e}"})

    def _repr_facts(self):
        return {
            **self._facts,
            "temperature": self.temperature,
            "top_k": self.top_k or None,
            "top_p": self.top_p,
        }
