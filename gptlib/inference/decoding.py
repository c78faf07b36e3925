"""Chapter 13.2: speculative decoding, the rounds of :mod:`gptlib.inference.speculative` run over a
whole text. A draft model (a small GPT, or :class:`BigramDraft`) proposes gamma tokens, the target
scores them in one pass, :func:`~gptlib.inference.speculative.speculative_round`'s rule keeps a
prefix of them and emits one more token; both models keep a KV cache that is cut back after a
rejection. :func:`speculative_generate` returns the tokens and what a round cost
(:class:`SpeculativeResult`: target passes, drafted and kept tokens, the acceptance rates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..runtime import check_finite_weights, check_float, check_ids, check_int
from ..sampling import new_cache
from .speculative import _acceptance_rate, _round

__all__ = ["BigramDraft", "SpeculativeResult", "speculative_generate"]


class BigramDraft(nn.Module):
    """A draft model that reads only the current token: P(next | current) from bigram counts, with
    ``smoothing`` added to every count. ``forward(ids)`` gives log-probabilities (B, T, d_vocab)
    for ids (B, T); the logits at a position depend on that position's token alone.

    >>> draft = BigramDraft(torch.tensor([0, 1, 0, 1, 0, 2]), d_vocab=3, smoothing=0.0)
    >>> draft(torch.tensor([[0]])).exp()  # after 0: 1 twice, 2 once
    tensor([[[0.0000, 0.6667, 0.3333]]])
    """

    def __init__(self, ids: Tensor, d_vocab: int, smoothing: float = 0.01):
        super().__init__()
        d_vocab = check_int("d_vocab", d_vocab, lo=1)
        smoothing = check_float("smoothing", smoothing, 0.0)
        if not isinstance(ids, Tensor):
            check_ids(ids, d_vocab)  # a list of ints
            ids = torch.as_tensor(ids, dtype=torch.long)
        check_ids(ids, d_vocab)
        ids = ids.flatten().long()
        if len(ids) < 1:
            raise ValueError("ids must hold at least one token to count bigrams from, got none")
        counts = torch.full((d_vocab, d_vocab), smoothing, dtype=torch.float64)
        counts.index_put_(
            (ids[:-1], ids[1:]), torch.ones(len(ids) - 1, dtype=torch.float64), accumulate=True
        )
        total = counts.sum(dim=-1, keepdim=True)
        uniform = torch.full_like(counts, 1 / d_vocab)  # a token never followed by another
        probs = torch.where(total > 0, counts / torch.where(total > 0, total, 1.0), uniform)
        self.register_buffer("log_probs", probs.log().float())  # (d_vocab, d_vocab)
        self.d_vocab = d_vocab

    def forward(self, ids: Tensor) -> Tensor:
        check_ids(ids, self.d_vocab)  # a negative id would index from the end
        return self.log_probs[ids]  # (B, T, d_vocab)


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` returns: the ids (T + max_new_tokens,), the number of
    target passes, drafted and kept tokens, and beta = sum min(p, q) at every judged draft position
    (the kept drafts and the first rejected one of each round: the later drafts of a round are
    never judged)."""

    ids: Tensor
    passes: int = 0
    drafted: int = 0
    kept: int = 0
    betas: list[float] = field(default_factory=list)

    @property
    def tokens_per_pass(self) -> float:
        return (len(self.ids) - self.prompt_len) / self.passes

    prompt_len: int = 0


def _probs(logits: Tensor, temperature: float) -> Tensor:
    """:func:`gptlib.sampling.next_token_probs` without top-k and top-p, for logits (n, d_vocab)
    whose values the model's checks already cover: one-hot on the first argmax at temperature 0."""
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0
        )
    return torch.softmax(logits.float() / temperature, dim=-1)


class _Stepper:
    """A model with its KV cache, kept to hold the keys of all but the last token of the text."""

    def __init__(self, model: nn.Module, capacity: int):
        self.model = model
        self.cache = None if isinstance(model, BigramDraft) else new_cache(model, capacity)

    def __call__(self, seq: Tensor, extra: Tensor | None = None) -> Tensor:
        """Logits (n, d_vocab) after the last token of seq (1, T) and after each of ``extra``
        (k,)."""
        if self.cache is None:  # a bigram reads one token per position
            new = seq[:, -1:] if extra is None else torch.cat([seq[:, -1:], extra[None]], dim=1)
            return self.model.log_probs[new][0]  # ids checked once, before the loop
        new = seq[:, len(self.cache) :]  # (1, n): what the cache lacks
        if extra is not None:
            new = torch.cat([new, extra[None]], dim=1)
        return self.model(new, cache=self.cache, check_ids=False)[
            0, -(1 + (0 if extra is None else len(extra))) :
        ]

    def keep(self, n: int) -> None:
        """Forget the cached positions from n on (rejected drafts)."""
        if self.cache is not None and len(self.cache) > n:
            self.cache.crop(n)


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    draft: nn.Module,
    ids: Tensor,
    max_new_tokens: int,
    gamma: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> SpeculativeResult:
    """Append ``max_new_tokens`` tokens to ids (T,) by speculative sampling: rounds of ``gamma``
    draft
    tokens scored by one target pass. The tokens have the distribution of
    :func:`gptlib.sampling.generate` from the target at this ``temperature``; at temperature 0
    (greedy) they are the target's greedy tokens. Both models keep a KV cache, cut back after a
    rejection; the text must fit the target's context (T + max_new_tokens <= n_ctx).

    >>> from gptlib.model import GPT, GPTConfig
    >>> from gptlib.sampling import generate
    >>> _ = torch.manual_seed(0)
    >>> target, draft = GPT(GPTConfig.preset("tiny")).eval(), GPT(GPTConfig.preset("tiny")).eval()
    >>> out = speculative_generate(target, draft, torch.tensor([1, 2, 3]), 20, 3, temperature=0.0)
    >>> torch.equal(out.ids, generate(target, torch.tensor([1, 2, 3]), 20, temperature=0.0))
    True
    """
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, lo=0)
    gamma = check_int("gamma", gamma, lo=0)
    temperature = check_float("temperature", temperature, 0.0)
    _check_pair(target, draft)
    if not isinstance(ids, Tensor) or ids.dim() != 1 or len(ids) < 1:
        raise ValueError(
            f"ids must have shape (T,) with T >= 1, got {getattr(ids, 'shape', type(ids).__name__)}"
        )
    c = target.config
    check_ids(ids, c.d_vocab)
    capacity = len(ids) + max_new_tokens
    for name, model in (("target", target), ("draft", draft)):
        n_ctx = getattr(getattr(model, "config", None), "n_ctx", None)
        if n_ctx is not None and capacity > n_ctx:
            raise ValueError(f"T + max_new_tokens = {capacity} exceeds the {name}'s n_ctx={n_ctx}")
    ids = ids.long().to(next(target.parameters()).device)
    modes = target.training, draft.training  # restored on the way out, as generate does
    target.eval()
    draft.eval()
    try:
        return _speculate(target, draft, ids, capacity, gamma, temperature, generator)
    finally:
        target.train(modes[0])
        draft.train(modes[1])


def _check_pair(target: object, draft: object) -> None:
    """target a gptlib model with a config; draft one too, or a :class:`BigramDraft`, of the
    target's vocabulary; every weight finite (a NaN would pass on as token 0 at temperature 0)."""
    if not isinstance(target, nn.Module) or not hasattr(getattr(target, "config", None), "d_vocab"):
        raise ValueError(f"target must be a gptlib model, got {type(target).__name__}")
    if isinstance(draft, BigramDraft):
        d_vocab = draft.d_vocab
        lp = draft.log_probs
        if not bool((~torch.isnan(lp) & (lp < float("inf"))).all()):
            raise ValueError("the draft's log_probs hold NaN or +inf")
    elif isinstance(draft, nn.Module) and hasattr(getattr(draft, "config", None), "d_vocab"):
        d_vocab = draft.config.d_vocab
        try:
            check_finite_weights(draft)
        except ValueError as e:
            raise ValueError(f"draft: {e}") from None
    else:
        raise ValueError(
            f"draft must be a gptlib model or a BigramDraft, got {type(draft).__name__}"
        )
    if d_vocab != target.config.d_vocab:
        raise ValueError(
            f"the draft's d_vocab={d_vocab} differs from the target's "
            f"d_vocab={target.config.d_vocab}"
        )
    check_finite_weights(target)


def _speculate(target, draft, ids, capacity, gamma, temperature, generator) -> SpeculativeResult:
    """:func:`speculative_generate`'s rounds, on checked arguments and models in eval mode."""
    tgt, drf = _Stepper(target, capacity), _Stepper(draft, capacity)
    seq = ids[None].clone()  # (1, T)
    res = SpeculativeResult(ids, prompt_len=len(ids))
    if len(ids) > 1:  # the prompt's keys, all but the last token's
        tgt.model(seq[:, :-1], cache=tgt.cache, check_ids=False)
        if drf.cache is not None:
            drf.model(seq[:, :-1], cache=drf.cache, check_ids=False)
    while seq.shape[1] < capacity:
        n = seq.shape[1]
        g = min(gamma, capacity - n - 1)  # the last round drafts no token past the end
        drafts, qs = [], []
        for _ in range(g):
            q = _probs(
                drf(torch.cat([seq, *[d.view(1, 1) for d in drafts]], dim=1))[-1:], temperature
            )[0]
            qs.append(q)
            drafts.append(torch.multinomial(q, 1, generator=generator)[0])
        drafts_t = torch.stack(drafts) if drafts else torch.zeros(0, dtype=torch.long)
        p = _probs(tgt(seq, drafts_t), temperature)  # (g + 1, d_vocab)
        q = torch.stack(qs) if qs else p[:0]
        out = _round(p, q, drafts_t, generator)
        res.passes, res.drafted, res.kept = res.passes + 1, res.drafted + g, res.kept + len(out) - 1
        judged = min(len(out), g)  # the drafts kept and the first rejected one, if any
        res.betas += _acceptance_rate(p[:judged], q[:judged]).tolist()
        seq = torch.cat([seq, out[None].to(seq.dtype)], dim=1)
        tgt.keep(seq.shape[1] - 1)
        drf.keep(seq.shape[1] - 1)
    res.ids = seq[0]
    return res
