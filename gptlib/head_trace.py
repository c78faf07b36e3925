"""One head, step by step (Chapters 4 and 12): every stage of head h's computation for one query.

For a query at position t of a context, head h of block ell (code: ``layer`` = ell - 1, heads from
0) reads the rows X (T, d_model) that enter its attention layer (ln_1 of the stream in a pre-LN
block) and computes, in Chapter 4's notation (eq. ch04-head, ch04-attention; for a ModernGPT
Chapter 12's ch12-rope and ch12-gqa):

    q = X[t] W_Q^h + b_Q^h,  K = X W_K^g + b_K^g,  V = X W_V^g + b_V^g     g = h // G (GQA)
    ModernGPT: q <- rope(q, t) = q rho_t,  K[n] <- rope(K[n], n) = K[n] rho_n
    s = q K^T  (T,),  s / sqrt(d_head),  M[t] (0 for n <= t, -inf after),
    a = softmax(s / sqrt(d_head) + M[t])       row t of the pattern A^h, sums to 1
    z = a V  (d_head,),  o = z W_O^h  (d_model,)
    c = N(o) . W_U[:, v]   its direct contribution to the logit of token v

where N is ln_f's linear part with its normaliser frozen at X_L[t] (RMSNorm: o w / rms(X_L[t]);
LayerNorm: (o - mean o) w / sigma(X_L[t])), the attribution :func:`gptlib.step.step` returns
(there at the last position). For rotary models the chosen coordinate pair i shows why the score
depends on t - n only: its part of q K[n]^T is q_i rho_(t-n) K_i[n]^T, an angle (t - n) theta_i.

The trace reads the model's own modules: one forward pass, a hook on the attention layer's input
and on the residual streams; the per-head weights come from ``attn.head_weights(h)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .attention import causal_mask, softmax
from .block import LayerNorm
from .hooks import capture
from .model import GPT
from .modern import ModernGPT, RMSNorm, apply_rope, rope_angles
from .positional import sinusoidal_frequencies
from .runtime import check_finite_weights, check_ids, check_int
from .step import frozen_scale

__all__ = ["HeadTrace", "head_trace", "ln_f_frozen"]


@dataclass(frozen=True)
class HeadTrace:
    """The stages of one head at one query (T positions in the context; float tensors).

    Rotary fields (``theta`` .. ``pair_scores``) are None for a GPT (no RoPE: ``q`` equals
    ``q_raw``, ``k`` equals ``k_raw``)."""

    layer: int  # block index in code (0-based): the book's ell - 1
    head: int  # query head h (0-based)
    kv_head: int  # the key-value head g = h // group it reads
    group: int  # G = n_heads / n_kv_heads query heads per key-value head (1: multi-head)
    position: int  # the query position t
    target: int  # the token v whose logit the contribution is to
    pair: int | None  # the RoPE coordinate pair i shown (None: no RoPE)
    q_raw: Tensor  # (d_head,) X[t] W_Q^h (+ b_Q^h), before RoPE
    k_raw: Tensor  # (T, d_head) X W_K^g (+ b_K^g), before RoPE
    q: Tensor  # (d_head,) rope(q_raw, t)
    k: Tensor  # (T, d_head) rope(K[n], n), as the KV cache holds them
    v: Tensor  # (T, d_head) X W_V^g (+ b_V^g)
    theta: float | None  # theta_i = base^(-2i / d_head), radians per position
    angle_q: float | None  # t theta_i
    angle_k: Tensor | None  # (T,) n theta_i
    angle_rel: Tensor | None  # (T,) (t - n) theta_i
    pair_scores: Tensor | None  # (T,) pair i's part of q K[n]^T
    scores: Tensor  # (T,) q K[n]^T
    scaled: Tensor  # (T,) q K[n]^T / sqrt(d_head)
    mask: Tensor  # (T,) M[t]: 0 for n <= t, -inf for n > t
    pattern: Tensor  # (T,) softmax(scaled + mask): row t of A^h
    z: Tensor  # (d_head,) sum_n A[t, n] V[n]
    W_O: Tensor  # (d_head, d_model) W_O^h
    out: Tensor  # (d_model,) z W_O^h: head h's output at t
    ln_w: Tensor  # (d_model,) ln_f's gain w
    ln_scale: float  # 1 / rms(X_L[t]) (RMSNorm) or 1 / sigma(X_L[t]) (LayerNorm)
    ln_centred: bool  # LayerNorm: N subtracts the mean of its argument
    ln_out: Tensor  # (d_model,) N(out)
    W_U_v: Tensor  # (d_model,) W_U[:, target]
    contribution: float  # N(out) . W_U[:, target]

    def as_lists(self) -> dict:
        """Every field as JSON-ready Python values (tensors as nested lists, -inf as None)."""

        def plain(x):
            if isinstance(x, Tensor):
                return [plain(y) for y in x.tolist()] if x.dim() else plain(x.item())
            if isinstance(x, list):
                return [plain(y) for y in x]
            if isinstance(x, float) and math.isinf(x):
                return None
            return x

        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


def ln_f_frozen(ln: LayerNorm | RMSNorm, o: Tensor, x: Tensor) -> tuple[Tensor, float]:
    """ln_f's linear part with its normaliser frozen at the stream row x (d_model,), applied to
    rows o (..., d_model), and that normaliser: RMSNorm o w / rms(x); LayerNorm
    (o - mean o) w / sigma(x) (biased variance; the bias b is no head's). The logit of token v is
    ln_f(x) . W_U[:, v], and this is the part of it that a term o of x contributes, the others
    fixed.

    >>> ln = RMSNorm(2, eps=0.0)  # rms([3, 4]) = sqrt(12.5)
    >>> o, scale = ln_f_frozen(ln, torch.tensor([1.0, 0.0]), torch.tensor([3.0, 4.0]))
    >>> [round(x, 4) for x in o.tolist()], round(scale, 4)
    ([0.2828, 0.0], 0.2828)
    """
    if not isinstance(ln, (LayerNorm, RMSNorm)):
        raise ValueError(f"ln must be a LayerNorm or RMSNorm, got {type(ln).__name__}")
    scale = frozen_scale(ln, x)  # step's own normaliser: 1 / rms(x) or 1 / sigma(x)
    if isinstance(ln, RMSNorm):
        return o * ln.w * scale, float(scale)
    return (o - o.mean(dim=-1, keepdim=True)) * ln.w * scale, float(scale)


def _check(model: object, ids: object) -> tuple[Tensor, int]:
    """The model (a GPT or ModernGPT with per-head keys) and ids as a (T,) int64 tensor."""
    if not isinstance(model, (GPT, ModernGPT)):
        raise ValueError(f"model must be a gptlib GPT or ModernGPT, got {type(model).__name__}")
    attn = type(model.blocks[0].attn).__name__
    if attn not in ("MultiHeadAttention", "GroupedQueryAttention"):
        raise ValueError(f"model's attention is {attn}: head_trace takes multi-head or GQA")
    c = model.config
    if isinstance(ids, Tensor):
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be int ids of shape (T,) or (1, T), got {tuple(ids.shape)}")
        ids = ids.tolist()
    check_ids(ids, c.d_vocab)
    if not 1 <= len(ids) <= c.n_ctx:
        raise ValueError(f"ids must hold 1 to n_ctx={c.n_ctx} tokens, got {len(ids)}")
    device = next(model.parameters()).device
    return torch.tensor(ids, dtype=torch.int64, device=device), len(ids)


def _stream_rows(model: GPT | ModernGPT, ids: Tensor, layer: int) -> tuple[Tensor, Tensor]:
    """X (T, d_model), the rows the attention layer of block ``layer`` reads, and X_L (T,
    d_model), the last residual stream: one forward pass of the model itself."""
    seen: list[Tensor] = []
    hook = model.blocks[layer].attn.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach())
    )
    was_training = model.training
    model.eval()
    try:
        with capture(model, "hook_resid") as streams:
            model(ids[None])
    finally:
        hook.remove()
        model.train(was_training)
    return seen[0][0], streams[-1][0]


@torch.no_grad()
def head_trace(
    model: GPT | ModernGPT,
    ids: Tensor | list[int],
    layer: int,
    head: int,
    position: int,
    target: int,
    pair: int | None = None,
) -> HeadTrace:
    """Every stage of head ``head`` of block ``layer`` (both from 0) at the query ``position``
    of the context ``ids`` ((T,) or (1, T) ints), down to its direct contribution to the logit
    of token ``target`` (-1: the model's most probable token at ``position``, the first argmax of
    its logits there); ``pair`` (a ModernGPT's RoPE coordinate pair, default 0) is the pair whose
    angles are shown. The module docstring lists the stages.

    Worked example: the tiny GPT, head 1 of block 0 at the last of three positions. The pattern
    row is a distribution over the three keys, z its average of the value rows, and the
    contributions of all heads add up with the rest of the stream to the logit:

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny")).eval()
    >>> tr = head_trace(model, [5, 6, 7], layer=0, head=1, position=2, target=9)
    >>> tuple(tr.q.shape), tuple(tr.k.shape), tr.kv_head, tr.pair
    ((16,), (3, 16), 1, None)
    >>> round(float(tr.pattern.sum()), 6), tr.mask.tolist()
    (1.0, [0.0, 0.0, 0.0])
    >>> torch.allclose(tr.z, tr.pattern @ tr.v), torch.allclose(tr.out, tr.z @ tr.W_O)
    (True, True)

    At position 0 the query sees only its own key (M[0] = [0, -inf, -inf]), and in a ModernGPT
    head 3 reads key-value head 1 (G = 2); its pair 0 turns by t theta_0 = 2 radians at t = 2:

    >>> from gptlib.modern import ModernConfig
    >>> modern = ModernGPT(ModernConfig.preset("tiny")).eval()
    >>> tr = head_trace(modern, [5, 6, 7], layer=1, head=3, position=0, target=9)
    >>> tr.mask.tolist(), tr.pattern.tolist(), tr.kv_head
    ([0.0, -inf, -inf], [1.0, 0.0, 0.0], 1)
    >>> head_trace(modern, [5, 6, 7], 1, 3, 2, 9).angle_q
    2.0

    Invalid arguments raise ``ValueError`` naming them, and a NaN or infinite pattern or
    contribution raises it too (naming the weight at fault, if one is):

    >>> head_trace(model, [5, 6, 7], layer=0, head=4, position=2, target=9)
    Traceback (most recent call last):
    ...
    ValueError: head must be in [0, 3], got 4
    """
    ids, T = _check(model, ids)
    c = model.config
    layer = check_int("layer", layer, 0, c.n_layers - 1)
    head = check_int("head", head, 0, c.n_heads - 1)
    position = check_int("position", position, 0, T - 1)
    target = check_int("target", target, -1, c.d_vocab - 1)
    attn = model.blocks[layer].attn
    rotary = isinstance(model, ModernGPT)
    d_head = attn.d_head
    if rotary:
        pair = check_int("pair", 0 if pair is None else pair, 0, d_head // 2 - 1)
    elif pair is not None:
        raise ValueError(f"pair is a RoPE coordinate pair; a GPT has no RoPE, got pair={pair!r}")
    group = getattr(attn, "group", 1)
    kv_head = head // group
    X, X_L = _stream_rows(model, ids, layer)  # (T, d_model) each
    W_Q, W_K, W_V, W_O = attn.head_weights(head)  # (d_model, d_head) x3, (d_head, d_model)
    q_raw, k_raw, v = X[position] @ W_Q, X @ W_K, X @ W_V  # (d_head,), (T, d_head), (T, d_head)
    if getattr(attn, "b_Q", None) is not None:  # GPT's biases, sliced like the weights
        s = slice(head * d_head, (head + 1) * d_head)
        q_raw, k_raw, v = q_raw + attn.b_Q[s], k_raw + attn.b_K[s], v + attn.b_V[s]
    rope = dict.fromkeys(("theta", "angle_q", "angle_k", "angle_rel", "pair_scores"))
    q, k = q_raw, k_raw
    if rotary:
        angles = rope_angles(T, d_head, attn.rope_base, device=X.device)  # (T, d_head/2), float64
        q = apply_rope(q_raw[None], angles[position : position + 1])[0]  # (d_head,) q rho_t
        k = apply_rope(k_raw, angles)  # (T, d_head): K[n] rho_n
        i = slice(2 * pair, 2 * pair + 2)
        theta = float(sinusoidal_frequencies(d_head, attn.rope_base)[pair])  # theta_i
        n = torch.arange(T, dtype=torch.float64, device=X.device)
        rope.update(
            theta=theta,
            angle_q=position * theta,
            angle_k=n * theta,
            angle_rel=(position - n) * theta,
            pair_scores=k[:, i] @ q[i],  # (T,)
        )
    scores = k @ q  # (T,): q K[n]^T
    scaled = scores / math.sqrt(d_head)
    mask = causal_mask(T, device=X.device)[position]  # (T,)
    pattern = softmax(scaled + mask)  # (T,)
    z = pattern @ v  # (d_head,)
    out = z @ W_O  # (d_model,)
    ln_out, ln_scale = ln_f_frozen(model.ln_f, out, X_L[position])
    if target == -1:  # the most probable token at the query: ln_f(X_L[t]) W_U's first argmax
        target = int(model.read_out(X_L[position][None])[0].argmax())
    W_U_v = model.W_U[:, target]  # (d_model,)
    contribution = ln_out @ W_U_v
    if not bool(torch.isfinite(pattern).all() & torch.isfinite(contribution)):
        check_finite_weights(model)  # names the weight at fault
        raise ValueError("the head's pattern or contribution is NaN or infinite on these ids")
    return HeadTrace(
        layer=layer,
        head=head,
        kv_head=kv_head,
        group=group,
        position=position,
        target=target,
        pair=pair,
        q_raw=q_raw,
        k_raw=k_raw,
        q=q,
        k=k,
        v=v,
        **rope,
        scores=scores,
        scaled=scaled,
        mask=mask,
        pattern=pattern,
        z=z,
        W_O=W_O.detach(),
        out=out,
        ln_w=model.ln_f.w.detach(),
        ln_scale=ln_scale,
        ln_centred=not isinstance(model.ln_f, RMSNorm),
        ln_out=ln_out,
        W_U_v=W_U_v.detach(),
        contribution=float(contribution),
    )
