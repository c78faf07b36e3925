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
from collections.abc import Sequence

import torch
import traitlets

from ..runtime import check_float, check_ids, check_int
from ._base import (
    BookWidget,
    bundle,
    check_source,
    check_strings,
    check_title,
    read_asset,
    rounded,
    token_strings,
)
from .continuations import (
    TEMPERATURES,
    _check_logits,
    _nodes,
    _temperatures,
    continuation_tree,
    model_next_logits,
    rest_log_weights,
    sparse_table,
    table_logits,
    top_logits,
)
from .live import LiveKernel, weights_sha256

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


def _check_prompts(prompts) -> None:
    if (
        isinstance(prompts, str)
        or not prompts
        or not all(isinstance(p, str) and p for p in prompts)
    ):
        raise ValueError("prompts must be a non-empty list of non-empty strings")


def _trees(model, tokenizer, prompts, depth, branch, n_logits, n_logits_deep, temps):
    """Per prompt ``{"text", "ids", "root"}`` with its :func:`continuation_tree`, and d_vocab. A
    GPT runs in eval mode (its mode restored after), without gradients."""
    is_module = isinstance(model, torch.nn.Module)
    was_training = model.training if is_module else False
    if is_module:
        model.eval()
    try:
        next_logits = model_next_logits(model) if is_module else model
        trees = []
        for p in prompts:
            ids = tokenizer.encode(p)
            root = continuation_tree(
                next_logits, ids, depth, branch, n_logits, n_logits_deep, temperatures=temps
            )
            trees.append({"text": p, "ids": ids, "root": root})
    finally:
        if is_module:
            model.train(was_training)
    d_vocab = model.config.d_vocab if is_module else len(next_logits([trees[0]["ids"]])[0])
    return trees, d_vocab


def _tree_tokens(trees, token_str) -> dict[str, str]:
    """{str(id): token string} for every id a tree stores, by id."""
    ids = {i for t in trees for node in _nodes(t["root"]) for i in node["ids"]}
    return {str(i): token_str(i) for i in sorted(ids)}


class SamplingView(LiveKernel, BookWidget):
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
        _check_prompts(prompts)
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
        trees, d_vocab = _trees(
            model, tokenizer, prompts, depth, branch, n_logits, n_logits_deep, temps
        )
        _check_vocabulary(tokenizer, d_vocab)
        view = cls.__new__(cls)
        view._facts = {"prompts": len(prompts), "vocab": d_vocab, "depth": depth}
        live = {}
        if source is not None:
            view._facts["live"] = source
            live = {"source": source, "weights_sha256": weights_sha256(model)}
        view._setup(
            trees,
            _tree_tokens(trees, token_strings(tokenizer)),
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
            view._serve(model, tokenizer)  # the kernel's side of the live model (LiveKernel)
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
        _check_prompts(prompts)
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
        token_str = token_strings(tokenizer)
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

    def _repr_facts(self):
        return {
            **self._facts,
            "temperature": self.temperature,
            "top_k": self.top_k or None,
            "top_p": self.top_p,
        }
