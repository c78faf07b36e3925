"""Chapter 7: from logits to text — temperature, top-k, top-p and generation with a KV cache.

The next-token distribution after a context is the softmax of the last row of logits. Decoding
strategies reshape it before drawing:

    temperature tau:  P_tau = softmax(y / tau)           (tau -> 0: argmax; tau -> inf: uniform)
    top-k:            keep the k most probable tokens
    top-p (nucleus):  keep the smallest set of most probable tokens whose mass reaches p
    then renormalise what is kept.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from .attention import KVCache

__all__ = ["next_token_probs", "generate"]


def _check(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(logits, Tensor) or logits.dim() not in (1, 2) or logits.shape[-1] < 1:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a tensor of shape (d_vocab,) or (B, d_vocab), got {shape}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    if (logits == math.inf).any() or (logits == -math.inf).all(dim=-1).any():
        raise ValueError("logits must not contain +inf, and each row needs a finite value")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")


def next_token_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The distribution to sample the next token from: temperature, top-k, top-p, renormalise.

    ``temperature == 0`` puts all mass on the argmax (the first one on ties). Top-k keeps the k
    largest logits (ties broken by the lower id). Top-p keeps, in order of decreasing probability,
    tokens until their total reaches ``top_p``: the token that crosses it is kept, so at least one
    token always is.

    >>> next_token_probs(torch.tensor([10.0, 6.0, 4.0]))
    tensor([0.9796, 0.0179, 0.0024])
    >>> next_token_probs(torch.tensor([10.0, 6.0, 4.0]), temperature=10.0)
    tensor([0.4506, 0.3021, 0.2473])
    >>> next_token_probs(torch.tensor([1.0, 3.0, 2.0]), top_k=2).round(decimals=4)
    tensor([0.0000, 0.7311, 0.2689])
    """
    _check(logits, temperature, top_k, top_p)
    squeeze = logits.dim() == 1
    y = logits[None] if squeeze else logits  # (B, d_vocab)
    if temperature == 0:
        probs = torch.zeros_like(y)
        probs.scatter_(-1, y.argmax(dim=-1, keepdim=True), 1.0)
        return probs[0] if squeeze else probs
    # Subtracting the max first keeps y / tau finite for tiny tau (ties at the max share the mass).
    y_max = y.max(dim=-1, keepdim=True).values  # (B, 1)
    probs = torch.softmax((y - y_max) / float(temperature), dim=-1)  # (B, d_vocab)
    order = torch.sort(y, dim=-1, descending=True, stable=True).indices  # most probable first
    keep_sorted = torch.ones_like(probs, dtype=torch.bool)  # in the order of `order`
    if top_k is not None and top_k < y.shape[-1]:
        keep_sorted[:, int(top_k):] = False
    if top_p is not None and top_p < 1:
        # renormalise what top-k kept, then keep while the mass before a token is below top_p
        p_sorted = probs.gather(-1, order) * keep_sorted
        p_sorted = p_sorted / p_sorted.sum(dim=-1, keepdim=True)
        cum = torch.cumsum(p_sorted, dim=-1)  # (B, d_vocab)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)  # mass strictly before each token
        keep_sorted &= before < top_p  # keeps the token that crosses top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs[0] if squeeze else probs


@torch.no_grad()
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
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Append ``max_new_tokens`` tokens to ``ids`` ((T,) or (B, T)), drawn from the model.

    The model always sees at most its last ``n_ctx`` tokens (the context is cropped, as in 004).
    With ``use_cache`` the keys and values of earlier positions are kept (:class:`KVCache`), so a
    step costs one position instead of the whole context. Once the context is full, every step
    shifts the window, which changes the absolute position of every kept token: the cache is then
    rebuilt from the cropped window (the last ``n_ctx - 1`` tokens and the newest one), exactly what
    the uncached computation does, so past ``n_ctx`` a step costs a full forward pass of ``n_ctx``
    positions, as without the cache. Both paths give the same tokens (and logits up to rounding).
    ``return_logits`` also returns the logits of every step, (B, max_new_tokens, d_vocab).

    >>> from gptlib.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8))
    >>> a = generate(model, torch.tensor([1, 2, 3]), 10, temperature=0.0)
    >>> b = generate(model, torch.tensor([1, 2, 3]), 10, temperature=0.0, use_cache=False)
    >>> a.shape, torch.equal(a, b)
    (torch.Size([13]), True)
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if ids.dim() not in (1, 2) or ids.shape[-1] < 1:
        raise ValueError(f"ids must have shape (T,) or (B, T) with T >= 1, got {tuple(ids.shape)}")
    _check(torch.zeros(1), temperature, top_k, top_p)
    squeeze = ids.dim() == 1
    ids = ids[None] if squeeze else ids  # (B, T)
    n_ctx, n_layers = model.config.n_ctx, model.config.n_layers
    was_training = model.training
    model.eval()
    steps: list[Tensor] = []
    cache: KVCache | None = None
    try:
        for step in range(max_new_tokens):
            if not use_cache:
                logits = model(ids[:, -n_ctx:])[:, -1]  # (B, d_vocab)
            elif cache is None or len(cache) >= n_ctx:
                cache = KVCache(n_layers)  # (re)build from the cropped window
                logits = model(ids[:, -n_ctx:], cache=cache)[:, -1]
            else:
                logits = model(ids[:, -1:], cache=cache)[:, -1]  # one new position
            if return_logits:
                steps.append(logits)
            probs = next_token_probs(logits.float(), temperature, top_k, top_p)
            if temperature == 0:
                nxt = probs.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                dev = generator.device if generator is not None else probs.device
                nxt = torch.multinomial(probs.to(dev), 1, generator=generator).to(ids.device)
            ids = torch.cat([ids, nxt], dim=1)  # (B, T + step + 1)
    finally:
        model.train(was_training)
    out = ids[0] if squeeze else ids
    if not return_logits:
        return out
    all_logits = torch.stack(steps, dim=1) if steps else ids.new_zeros((ids.shape[0], 0, model.config.d_vocab), dtype=torch.float32)
    return out, (all_logits[0] if squeeze else all_logits)
