"""Chapter 13.2: speculative sampling, and why every token it emits has the target's distribution.

A cheap draft model with next-token distribution q proposes gamma tokens x_1, ..., x_gamma; the
target model (distribution p) scores all of them in one pass. Left to right, x_i is kept with
probability min(1, p(x_i) / q(x_i)); at the first rejection a token is drawn from the residual

    r = max(0, p - q) / sum max(0, p - q)

and the round ends; if all gamma are kept, a last token is drawn from the target's next p. Each
emitted token then has exactly the target's distribution (Leviathan et al., 2023; Chen et al.,
2023): :func:`emitted_distribution` enumerates every draft outcome and shows it. Decoding a
whole text this way, with the two models' KV caches, is :mod:`gptlib.inference.decoding`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

import torch
from torch import Tensor

from ..runtime import check_float, check_ids, check_int

__all__ = [
    "acceptance_probability",
    "residual_distribution",
    "acceptance_rate",
    "accept_or_resample",
    "speculative_round",
    "emitted_distribution",
    "sequence_distribution",
    "expected_tokens_per_pass",
    "chi_square_power",
]


def _check_distributions(p: object, q: object, p_values: Tensor | None = None) -> None:
    """p and q: floating-point tensors of one shape (..., d_vocab), d_vocab >= 1, each row a
    probability distribution (entries >= 0, summing to 1 within 1e-4, or 8 units of rounding of a
    half-precision dtype). ``p_values``: more rows of the target's (..., d_vocab) whose values are
    checked with p's (:func:`speculative_round`'s last row of p, which has no q)."""
    for name, t in (("p", p), ("q", q)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < 1:
            raise ValueError(
                f"{name} must be a floating-point tensor of probabilities (..., d_vocab), got "
                f"{getattr(t, 'dtype', type(t).__name__)}"
            )
    if p.shape != q.shape or p.shape[-1] < 1:
        raise ValueError(
            f"p and q must have one shape (..., d_vocab), got {tuple(p.shape)}, {tuple(q.shape)}"
        )
    tol = max(1e-4, 8 * torch.finfo(p.dtype).eps)
    ps = (p,) if p_values is None else (p, p_values)

    def valid(t: Tensor) -> Tensor:  # NaN and -inf fail t >= 0, +inf fails the row sums
        return (t >= 0).all() & ((t.double().sum(-1) - 1).abs() <= tol).all()

    # all at once, in few operations and one sync (the check runs on every round of a sampling
    # loop): the smallest entry and the largest |row sum - 1|, which NaN and -inf make fail the
    # first comparison and +inf the second; named on failure
    rows = torch.cat([t.double().reshape(-1, p.shape[-1]) for t in (*ps, q)])  # (n, d_vocab)
    if rows.numel():
        lowest, worst = torch.stack((rows.amin(), (rows.sum(-1) - 1).abs().amax())).tolist()
        if lowest >= 0 and worst <= tol:
            return
    for name, ts in (("p", ps), ("q", (q,))):
        if not all(bool(valid(t)) for t in ts):
            raise ValueError(
                f"{name} must hold probability distributions (entries >= 0, each row summing to "
                "1): softmax logits first"
            )


def _check_tokens(name: str, x: object, d_vocab: int, shape: tuple) -> None:
    if not isinstance(x, Tensor) or tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} must be a tensor of token ids of shape {tuple(shape)}, got "
            f"{getattr(x, 'shape', type(x).__name__)}"
        )
    check_ids(x, d_vocab, name)


def acceptance_probability(p: Tensor, q: Tensor, x: Tensor) -> Tensor:
    """min(1, p(x) / q(x)) for distributions p, q (..., d_vocab) and draft tokens x (...).

    >>> p, q = torch.tensor([[0.2, 0.8], [0.2, 0.8]]), torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    >>> acceptance_probability(p, q, torch.tensor([0, 1]))
    tensor([0.4000, 1.0000])
    """
    _check_distributions(p, q)
    _check_tokens("x", x, p.shape[-1], p.shape[:-1])
    return _acceptance_probability(p, q, x)


def _acceptance_probability(p: Tensor, q: Tensor, x: Tensor) -> Tensor:
    px, qx = p.gather(-1, x[..., None])[..., 0], q.gather(-1, x[..., None])[..., 0]
    return torch.clamp(px / qx, max=1.0)


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """The residual r = max(0, p - q) / sum max(0, p - q), (..., d_vocab): where a rejected draft's
    replacement is drawn from. Where p = q (no draft is ever rejected) it is p.

    >>> residual_distribution(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0.4, 0.4, 0.2]))
    tensor([0., 0., 1.])
    """
    _check_distributions(p, q)
    return _residual_distribution(p, q)


def _residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    r = torch.clamp(p - q, min=0.0)
    z = r.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, r / torch.where(z > 0, z, torch.ones_like(z)), p)


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """beta = sum_x min(p(x), q(x)) = 1 - TV(p, q), (...): the probability that a draft x ~ q is
    kept.

    >>> acceptance_rate(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0.4, 0.4, 0.2]))
    tensor(0.7000)
    """
    _check_distributions(p, q)
    return _acceptance_rate(p, q)


def _acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    return torch.minimum(p, q).sum(dim=-1)


def accept_or_resample(
    p: Tensor, q: Tensor, x: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """One draft position, for N rows at once: p, q (N, d_vocab), drafts x (N,) drawn from q; or
    p, q (d_vocab,) shared by N independent drafts x (N,). Keep x_n with probability min(1, p/q);
    else draw from the residual. Returns (kept (N,) bool, token (N,)), the token x_n where kept.

    >>> p, q = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    >>> accept_or_resample(p, q, torch.tensor([0]))  # p(0) = 0: rejected, the residual is token 1
    (tensor([False]), tensor([1]))
    """
    _check_distributions(p, q)
    if p.dim() not in (1, 2):
        raise ValueError(f"p and q must be (N, d_vocab) or (d_vocab,), got {tuple(p.shape)}")
    shared = p.dim() == 1
    if not isinstance(x, Tensor) or x.dim() != 1 or (not shared and len(x) != len(p)):
        raise ValueError(
            f"x must be a tensor of N token ids (N,), got {getattr(x, 'shape', type(x).__name__)} "
            f"for p {tuple(p.shape)}"
        )
    check_ids(x, p.shape[-1], "x")
    return _accept_or_resample(p, q, x, generator, *_rules())


def _accept_or_resample(
    p: Tensor,
    q: Tensor,
    x: Tensor,
    generator: torch.Generator | None,
    accept: Callable = _acceptance_probability,
    residual: Callable = _residual_distribution,
) -> tuple[Tensor, Tensor]:
    """:func:`accept_or_resample` on checked arguments, with the rules ``accept`` and
    ``residual`` (unchecked by default: speculative decoding's loop, whose p and q are
    softmaxes)."""
    shared = p.dim() == 1
    if shared:
        r = residual(p, q)  # (d_vocab,): one residual for every draft
        # the rule once per distinct draft token (at most d_vocab rows, not N)
        drafted, where = torch.unique(x, return_inverse=True)  # (K,), (N,)
        rows = (len(drafted), -1)
        a = accept(p.expand(rows), q.expand(rows), drafted)[where]  # (N,), no copy of p, q
    else:
        a = accept(p, q, x)  # (N,)
    u = torch.rand(x.shape, generator=generator, dtype=p.dtype, device=p.device)
    kept = u < a
    if shared:
        replacement = (
            torch.multinomial(r, len(x), replacement=True, generator=generator)
            if len(x)
            else x.clone()  # no draft, nothing drawn
        )
    else:
        replacement = torch.multinomial(residual(p, q), 1, generator=generator)[:, 0]
    return kept, torch.where(kept, x, replacement)


def speculative_round(
    p: Tensor, q: Tensor, drafts: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """The tokens one round emits (1 to gamma + 1 of them): p (gamma + 1, d_vocab) the target's
    distributions after each draft prefix, q (gamma, d_vocab) the draft's, drafts (gamma,) ~ q.

    >>> p = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0]])
    >>> q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])  # q = p: both kept
    >>> speculative_round(p, q, torch.tensor([1, 0]))
    tensor([1, 0, 1])
    """
    for name, t in (("p", p), ("q", q)):
        if not isinstance(t, Tensor) or t.dim() != 2:
            raise ValueError(
                f"{name} must be a tensor (rows, d_vocab), got "
                f"{getattr(t, 'shape', type(t).__name__)}"
            )
    gamma = q.shape[0]
    if not isinstance(drafts, Tensor):
        raise ValueError(f"drafts must be a tensor of gamma ids, got {type(drafts).__name__}")
    if p.shape[0] != gamma + 1 or drafts.shape != (gamma,):
        raise ValueError(
            f"p must have gamma + 1 rows and drafts gamma entries; got p {tuple(p.shape)}, "
            f"q {tuple(q.shape)}, drafts {tuple(drafts.shape)}"
        )
    _check_distributions(p[:gamma], q, p[gamma:])  # every row of p and of q, at once
    check_ids(drafts, p.shape[-1], "drafts")
    return _round(p, q, drafts, generator, *_rules())


def _round(
    p: Tensor,
    q: Tensor,
    drafts: Tensor,
    generator: torch.Generator | None,
    accept: Callable = _acceptance_probability,
    residual: Callable = _residual_distribution,
) -> Tensor:
    """:func:`speculative_round` on checked arguments (see :func:`_accept_or_resample`)."""
    gamma = q.shape[0]
    if gamma == 0:
        return torch.multinomial(p[0], 1, generator=generator)
    kept, tokens = _accept_or_resample(p[:gamma], q, drafts, generator, accept, residual)
    rejected = (~kept).nonzero()
    if len(rejected) == 0:  # all kept: one more token from the target, free
        return torch.cat([drafts, torch.multinomial(p[gamma], 1, generator=generator)])
    j = int(rejected[0])
    return tokens[: j + 1]  # drafts[:j], then the replacement of draft j


_PUBLIC_RULES = (acceptance_probability, residual_distribution)


def _rules() -> tuple[Callable, Callable]:
    """The acceptance and residual rules as this module names them at this call: the public
    functions, looked up each time, since the tests and Chapter 13 replace them with broken ones to
    see the checks fail. While they are this module's own, their unchecked bodies (the caller has
    checked p, q and the tokens once: the same values, without checking them again on every round
    of a sampling loop)."""
    accept, residual = acceptance_probability, residual_distribution
    return (
        _acceptance_probability if accept is _PUBLIC_RULES[0] else accept,
        _residual_distribution if residual is _PUBLIC_RULES[1] else residual,
    )


def emitted_distribution(
    p_of: Callable[[tuple], Tensor], q_of: Callable[[tuple], Tensor], gamma: int, n: int
) -> Tensor:
    """The exact distribution of the first n tokens that speculative sampling emits, (d_vocab,) * n,
    by enumerating every draft, every accept/reject outcome and every replacement, round after
    round.

    ``p_of(prefix)`` and ``q_of(prefix)`` give the target's and the draft's next-token distributions
    (d_vocab,) after a tuple of tokens (any functions of the prefix). The theorem says the result is
    :func:`sequence_distribution` of ``p_of``:

    >>> p_of = lambda s: torch.tensor([0.6, 0.3, 0.1] if len(s) % 2 else [0.1, 0.2, 0.7],
    ...                               dtype=torch.float64)
    >>> q_of = lambda s: torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    >>> e = emitted_distribution(p_of, q_of, gamma=2, n=3)
    >>> float((e - sequence_distribution(p_of, 3, 3)).abs().max()) < 1e-15
    True
    """
    gamma, n = check_int("gamma", gamma, lo=0), check_int("n", n, lo=1)
    first = p_of(())
    if not isinstance(first, Tensor) or first.dim() != 1:
        raise ValueError(
            f"p_of(()) must be a distribution (d_vocab,), got {getattr(first, 'shape', first)}"
        )
    d_vocab = first.shape[-1]
    if d_vocab**n > 2**24:
        raise ValueError(f"d_vocab^n = {d_vocab}^{n} sequences are too many to enumerate")
    out = torch.zeros((d_vocab,) * n, dtype=torch.float64)

    def record(seq: tuple, prob: float) -> None:
        out[seq[:n]] += prob

    def start_round(seq: tuple, prob: float) -> None:
        if len(seq) >= n:
            record(seq, prob)
        else:
            draft(seq, 0, prob)

    def draft(seq: tuple, i: int, prob: float) -> None:  # i drafts of this round kept so far
        if len(seq) >= n:
            return record(seq, prob)
        p, q = p_of(seq), q_of(seq)
        if not isinstance(q, Tensor) or not isinstance(p, Tensor) or p.shape != (d_vocab,):
            raise ValueError(f"p_of and q_of must give distributions ({d_vocab},) after {seq}")
        _check_distributions(p, q)
        p, q = p.double(), q.double()
        if i == gamma:  # all kept: one token from p
            for t in range(d_vocab):
                start_round(seq + (t,), prob * float(p[t]))
            return
        accept, residual = _rules()  # p and q are checked above
        r = residual(p, q)
        for x in range(d_vocab):
            if q[x] == 0:
                continue  # never drafted
            a = float(accept(p, q, torch.tensor(x)))
            if a > 0:
                draft(seq + (x,), i + 1, prob * float(q[x]) * a)
            if a < 1:
                for t in range(d_vocab):
                    start_round(seq + (t,), prob * float(q[x]) * (1 - a) * float(r[t]))

    start_round((), 1.0)
    return out


def sequence_distribution(p_of: Callable[[tuple], Tensor], n: int, d_vocab: int) -> Tensor:
    """The target's own distribution of n tokens, prod_t p(x_t | x_{0:t}), (d_vocab,) * n.

    >>> sequence_distribution(lambda s: torch.tensor([0.25, 0.75]), 2, 2).tolist()
    [[0.0625, 0.1875], [0.1875, 0.5625]]
    """
    n, d_vocab = check_int("n", n, lo=1), check_int("d_vocab", d_vocab, lo=1)
    if d_vocab**n > 2**24:
        raise ValueError(f"d_vocab^n = {d_vocab}^{n} sequences are too many to enumerate")
    out = torch.zeros((d_vocab,) * n, dtype=torch.float64)
    for seq in torch.cartesian_prod(*[torch.arange(d_vocab)] * n).reshape(-1, n).tolist():
        out[tuple(seq)] = math.prod(_p_at(p_of, tuple(seq[:t]), d_vocab)[seq[t]] for t in range(n))
    return out


def _p_at(p_of: Callable[[tuple], Tensor], prefix: tuple, d_vocab: int) -> list[float]:
    """p_of(prefix) as a list of d_vocab probabilities, checked to be a distribution."""
    p = p_of(prefix)
    if not isinstance(p, Tensor) or p.shape != (d_vocab,):
        raise ValueError(
            f"p_of{prefix} must be a distribution of shape (d_vocab,) = ({d_vocab},), got "
            f"{getattr(p, 'shape', type(p).__name__)}"
        )
    _check_distributions(p, p)
    return p.tolist()


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """E[tokens per round] = 1 + alpha + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha),
    when every draft is kept with the same probability alpha, independently.

    >>> expected_tokens_per_pass(0.5, 3), expected_tokens_per_pass(1.0, 3)
    (1.875, 4.0)
    """
    alpha, gamma = check_float("alpha", alpha, 0.0, 1.0), check_int("gamma", gamma, lo=0)
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def chi_square_power(noncentrality: float, df: int, level: float = 0.001) -> tuple[float, float]:
    """(critical value, power) of Pearson's chi-square test with ``df`` degrees of freedom at
    ``level``, against an alternative of noncentrality lambda = N sum_k (p'_k - p_k)^2 / p_k.

    Wilson and Hilferty's cube-root normal approximation for chi-square quantiles, and Patnaik's
    for the noncentral law (a scaled chi-square with matched mean and variance).

    >>> crit, power = chi_square_power(0.0, 10, 0.05)
    >>> round(crit, 2), round(power, 3)  # the table value is 18.31
    (18.29, 0.05)
    """
    df = check_int("df", df, lo=1)
    level = check_float("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    lam = check_float("noncentrality", noncentrality, 0.0)
    z = NormalDist().inv_cdf(1 - level)
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    c = (df + 2 * lam) / (df + lam)
    h = (df + lam) / c  # chi2'(df, lam) ~ c chi2(h), h = (df + lam)^2 / (df + 2 lam) unsquared
    x = crit / c
    z_alt = ((x / h) ** (1 / 3) - (1 - 2 / (9 * h))) / math.sqrt(2 / (9 * h))
    return crit, 1 - NormalDist().cdf(z_alt)
