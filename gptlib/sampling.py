"""Chapter 7: from logits to text — temperature, top-k, top-p and generation with a KV cache.

The next-token distribution after a context is the softmax of the last row of logits. Decoding
strategies reshape it before drawing:

    temperature tau:  P_tau = softmax(y / tau)           (tau -> 0: argmax; tau -> inf: uniform)
    top-k:            keep the k most probable tokens
    top-p (nucleus):  keep the smallest set of most probable tokens whose mass reaches p
    then renormalise what is kept.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .kvcache import KVCache
from .runtime import check_finite_weights, check_float, check_ids, check_int

__all__ = ["next_token_probs", "generate", "generate_with_logits", "Generation", "new_cache"]


def new_cache(model: nn.Module, capacity: int | None = None) -> KVCache:
    """An empty cache of the kind ``model``'s attention layers write: the ``cache_type`` of its
    first block's attention (a :class:`gptlib.mla.LatentCache` for latent attention), else a
    :class:`KVCache`; one per layer, for ``capacity`` positions.

    >>> from gptlib.model import GPT, GPTConfig
    >>> type(new_cache(GPT(GPTConfig.preset("tiny")), 8)).__name__
    'KVCache'
    """
    blocks = getattr(model, "blocks", None)
    attn = getattr(blocks[0], "attn", None) if blocks else None
    return getattr(attn, "cache_type", KVCache)(model.config.n_layers, capacity)


def _check_settings(
    temperature: float, top_k: int | None, top_p: float | None
) -> tuple[float, int | None, float | None]:
    """The decoding settings as numbers, each checked: tau finite >= 0, k int >= 1, p in (0, 1]."""
    temperature = check_float("temperature", temperature, 0.0)
    top_k = None if top_k is None else check_int("top_k", top_k, lo=1)
    top_p = None if top_p is None else check_float("top_p", top_p, 0.0, 1.0, lo_open=True)
    return temperature, top_k, top_p


def _check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or logits.dim() not in (1, 2) or logits.shape[-1] < 1:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(
            f"logits must be a tensor of shape (d_vocab,) or (B, d_vocab), got {shape}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if (logits == torch.inf).any() or (logits == -torch.inf).all(dim=-1).any():
        raise ValueError("logits must not contain +inf, and each row needs a finite value")


def _distribution(y: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """:func:`next_token_probs` of logits y (B, d_vocab) whose values and settings are already
    checked."""
    if temperature == 0:
        probs = torch.zeros_like(y)
        return probs.scatter_(-1, y.argmax(dim=-1, keepdim=True), 1.0)
    # Subtracting the max first keeps y / tau finite for tiny tau (ties at the max share the mass).
    # A tau outside the normal numbers of y's dtype (1e-46 rounds to 0 in float32, 1e300 to inf) is
    # applied in float64, where the ratio is exact: 0 / tau = 0 at the maxima, never 0 / 0 or
    # inf / inf.
    y_max = y.max(dim=-1, keepdim=True).values  # (B, 1)
    if not torch.finfo(y.dtype).tiny <= temperature <= torch.finfo(y.dtype).max:
        probs = torch.softmax((y - y_max).double() / temperature, dim=-1).to(y.dtype)
    else:
        probs = torch.softmax((y - y_max) / temperature, dim=-1)  # (B, d_vocab)
    if (top_k is None or top_k >= y.shape[-1]) and (top_p is None or top_p == 1):
        return probs / probs.sum(dim=-1, keepdim=True)  # nothing cut: renormalise only, as below
    order = torch.sort(y, dim=-1, descending=True, stable=True).indices  # most probable first
    keep_sorted = torch.ones_like(probs, dtype=torch.bool)  # in the order of `order`
    if top_k is not None and top_k < y.shape[-1]:
        keep_sorted[:, top_k:] = False
    if top_p is not None and top_p < 1:
        # renormalise what top-k kept, then keep while the mass before a token is below top_p
        p_sorted = probs.gather(-1, order) * keep_sorted
        p_sorted = p_sorted / p_sorted.sum(dim=-1, keepdim=True)
        cum = torch.cumsum(p_sorted, dim=-1)  # (B, d_vocab)
        before = torch.cat(
            [torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1
        )  # mass strictly before each token
        keep_sorted &= before < top_p  # keeps the token that crosses top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum(dim=-1, keepdim=True)


def next_token_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The distribution to sample the next token from: temperature, top-k, top-p, renormalise.

    ``temperature == 0`` puts all mass on the argmax (the first one on ties); a positive temperature
    too small for the logits' dtype gives the limit tau -> 0+, the maxima sharing the mass. The
    temperature must be finite: for tau -> inf take a large one (the limit is the uniform
    distribution over the tokens with a finite logit). Top-k keeps the k largest logits (ties
    broken by the lower id). Top-p keeps, in order of decreasing probability, tokens until their
    total reaches ``top_p``: the token that crosses it is kept, so at least one token always is.

    >>> next_token_probs(torch.tensor([10.0, 6.0, 4.0]))
    tensor([0.9796, 0.0179, 0.0024])
    >>> next_token_probs(torch.tensor([10.0, 6.0, 4.0]), temperature=10.0)
    tensor([0.4506, 0.3021, 0.2473])
    >>> next_token_probs(torch.tensor([1.0, 3.0, 2.0]), top_k=2).round(decimals=4)
    tensor([0.0000, 0.7311, 0.2689])
    """
    _check_logits(logits)
    settings = _check_settings(temperature, top_k, top_p)
    squeeze = logits.dim() == 1
    probs = _distribution(logits[None] if squeeze else logits, *settings)  # (B, d_vocab)
    return probs[0] if squeeze else probs


class Generation(NamedTuple):
    """The result of :func:`generate_with_logits`: the ids and the logits of every step."""

    ids: Tensor  # (B, T + max_new_tokens), or (T + max_new_tokens,)
    logits: Tensor  # (B, max_new_tokens, d_vocab), or (max_new_tokens, d_vocab)


MAX_NEW_TOKENS = (
    2**20
)  # a bound on one call, far past any context here: more is a mistake, not a request


@torch.no_grad()
def _decode(
    model, ids, max_new_tokens, temperature, top_k, top_p, generator, use_cache, keep_logits
) -> Generation:
    """The generation loop of :func:`generate`; every argument is checked here, once per call."""
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0, MAX_NEW_TOKENS)
    temperature, top_k, top_p = _check_settings(temperature, top_k, top_p)
    if (
        not isinstance(ids, Tensor)
        or ids.dim() not in (1, 2)
        or ids.shape[-1] < 1
        or ids.numel() < 1
    ):
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must have shape (T,) or (B, T) with B, T >= 1, got {shape}")
    c = model.config
    check_ids(
        ids, c.d_vocab
    )  # the only read of the ids: the new ones come from the model's d_vocab
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be True or False, got {use_cache!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if isinstance(model, nn.Module):
        check_finite_weights(model)
    squeeze = ids.dim() == 1
    ids = ids[None] if squeeze else ids  # (B, T)
    B, T0, n_ctx = ids.shape[0], ids.shape[1], c.n_ctx
    out = torch.empty(
        B, T0 + max_new_tokens, dtype=torch.long, device=ids.device
    )  # written in place
    out[:, :T0] = ids
    cache = new_cache(model, capacity=min(n_ctx, T0 + max_new_tokens)) if use_cache else None
    finite = torch.ones(
        (), dtype=torch.bool, device=ids.device
    )  # all logits finite so far (no sync)
    steps: list[Tensor] = []
    was_training = model.training
    model.eval()
    try:
        for t in range(T0, T0 + max_new_tokens):  # out[:, :t] is the text so far
            window = out[:, max(0, t - n_ctx) : t]  # the last n_ctx tokens
            if cache is None:
                logits = model(window, check_ids=False)[:, -1]  # (B, d_vocab)
            elif (
                len(cache) == 0 or len(cache) >= n_ctx
            ):  # first step, or the window moved: (re)fill
                cache.clear()
                logits = model(window, cache=cache, check_ids=False)[:, -1]
            else:
                logits = model(window[:, -1:], cache=cache, check_ids=False)[
                    :, -1
                ]  # one new position
            finite &= torch.isfinite(logits).all()
            if keep_logits:
                steps.append(logits)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1), the first maximum
            else:
                probs = _distribution(logits.float(), temperature, top_k, top_p)
                dev = generator.device if generator is not None else probs.device
                try:
                    nxt = torch.multinomial(probs.to(dev), 1, generator=generator).to(out.device)
                except RuntimeError:
                    if not bool(finite):
                        break  # reported below
                    raise
            out[:, t : t + 1] = nxt
    finally:
        model.train(was_training)
    if not bool(finite):
        raise ValueError(
            "the model's logits became NaN or infinite during generation: its outputs are "
            "meaningless"
        )
    logits = torch.stack(steps, dim=1) if steps else torch.zeros(B, 0, c.d_vocab, device=ids.device)
    return Generation(out[0] if squeeze else out, logits[0] if squeeze else logits)


def generate(
    model,
    ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Append ``max_new_tokens`` tokens to ``ids`` ((T,) or (B, T)), drawn from the model; returns
    the ids, (T + max_new_tokens,) or (B, T + max_new_tokens).

    The model always sees at most its last ``n_ctx`` tokens (the context is cropped, as in 004).
    With ``use_cache`` the keys and values of earlier positions are kept (:class:`KVCache`), so a
    step costs one position instead of the whole context. Once the context is full, every step
    shifts the window, which changes the absolute position of every kept token: the cache is then
    rebuilt from the cropped window (the last ``n_ctx - 1`` tokens and the newest one), exactly what
    the uncached computation does, so past ``n_ctx`` a step costs a full forward pass of ``n_ctx``
    positions, as without the cache. Both paths give the same tokens (and logits up to rounding).

    Checked once per call, off the per-token path: the settings (:func:`next_token_probs`), the ids
    (ints in [0, d_vocab)), ``max_new_tokens`` (at most :data:`MAX_NEW_TOKENS`) and the weights
    (finite, so the error names the parameter). Logits that turn non-finite are a ``ValueError``
    too.
    :func:`generate_with_logits` also returns the logits of every step.

    >>> from gptlib.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8))
    >>> a = generate(model, torch.tensor([1, 2, 3]), 10, temperature=0.0)
    >>> b = generate(model, torch.tensor([1, 2, 3]), 10, temperature=0.0, use_cache=False)
    >>> a.shape, torch.equal(a, b)
    (torch.Size([13]), True)
    """
    return _decode(
        model,
        ids,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        generator,
        use_cache,
        keep_logits=False,
    ).ids


def generate_with_logits(
    model,
    ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Generation:
    """:func:`generate`, also returning the logits each step drew from: ``Generation(ids, logits)``,
    logits (B, max_new_tokens, d_vocab) (or (max_new_tokens, d_vocab) for ids of shape (T,)).

    >>> from gptlib.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny"))
    >>> ids, logits = generate_with_logits(model, torch.tensor([[1, 2]]), 3, temperature=0.0)
    >>> tuple(ids.shape), tuple(logits.shape), torch.equal(ids[:, 2:], logits.argmax(-1))
    ((1, 5), (1, 3, 512), True)
    """
    return _decode(
        model,
        ids,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        generator,
        use_cache,
        keep_logits=True,
    )
