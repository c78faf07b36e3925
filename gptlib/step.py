"""The live step: one call of a model on new tokens, given the keys and values of the positions
before them, with a mask over the heads and the read-outs the page shows (Chapters 7 and 12).

:func:`step` composes the model's own modules (its attention layers append to a
:class:`~gptlib.kvcache.KVCache` that starts from ``past``; hooks read the patterns and the residual
streams), so the PyTorch model stays the only definition of the maths. It returns the next-token
logits, the keys and values with the new positions appended, every head's attention rows, the top
of the logit lens and each head's direct contribution to the target logits. The same function is
what a Jupyter kernel answers the book's live views with and what :func:`gptlib.export.to_onnx`
traces into the graph the HTML book runs.

Each read-out costs only what is asked of it: the lens reads the streams listed in ``lens`` (none:
no projection onto the vocabulary), ``direct`` the targets listed (none: nothing), ``attn`` the
rows of the queries listed (none: no rows copied out), ``head`` the heads listed (none: nothing
gathered); so a step that asks for nothing costs the model's forward pass and the final read-out.
The cache is position-major, (P, L, 2, n_kv, d_head), and the step returns only the new
positions' keys and values: a caller keeps one buffer of n_ctx positions, hands its first P as
``past`` and appends ``kv``, and copies no whole cache per step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .hooks import capture, capture_patterns
from .kvcache import KVCache
from .model import GPT
from .modern import ModernGPT, RMSNorm
from .runtime import check_finite_weights, check_ids, check_int

__all__ = ["OUTPUTS", "INPUTS", "HEAD_OUTPUTS", "LENS_TOP", "frozen_scale", "step", "step_inputs"]
__all__ += ["head_input"]

# what one head at one query needs beyond the cache's keys and values (head.js, gptlib.head_trace)
HEAD_OUTPUTS = ("head_q", "head_W_O", "head_ln_scale", "head_ln_w", "head_W_U")
OUTPUTS = ("logits", "kv", "attn", "lens_ids", "lens_logits", "lens_lse", "direct", *HEAD_OUTPUTS)
INPUTS = ("ids", "past", "head_mask", "lens", "targets", "queries", "head")
LENS_TOP = 10


# --- the step: one call of the model on new tokens, with its cache, masks and read-outs ----------
class _PastCache(KVCache):
    """A :class:`KVCache` that starts from ``past`` (P, n_layers, 2, n_kv, d_head) and appends by
    concatenation, so that a traced graph holds no buffers: the keys and values the model's own
    attention layers write, P + T positions per layer after the step; ``new`` holds each layer's
    appended keys and values, (1, n_kv, T, d_head) each."""

    def __init__(self, past: Tensor):
        super().__init__(past.shape[1])
        # (L, 2, n_kv, P, d_head), a view, cut into its layers once and each into its keys and
        # values (1, n_kv, P, d_head), views: a graph splits ``past`` instead of selecting and
        # unsqueezing 2 L times
        pairs = [kv.split(1) for kv in past.permute(1, 2, 3, 0, 4).unbind(0)]
        self._k = [k for k, _ in pairs]
        self._v = [v for _, v in pairs]
        self._filled = [past.shape[0]] * self.n_layers
        self.new: list[Tensor] = []  # k_0, v_0, k_1, v_1, ... in the order the layers append

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._k[layer] = torch.cat([self._k[layer], k], dim=2)  # (1, n_kv, P + T, d_head)
        self._v[layer] = torch.cat([self._v[layer], v], dim=2)
        self._filled[layer] += k.shape[2]
        self.new += [k, v]
        return self._k[layer], self._v[layer]


def _shape(model: nn.Module) -> tuple[int, int, int, int, int, int]:
    """(n_layers, n_heads, n_kv, d_head, d_vocab, n_ctx) of a GPT or ModernGPT."""
    attn = model.blocks[0].attn
    n_kv = getattr(attn, "n_kv_heads", attn.n_heads)
    c = model.config
    return c.n_layers, attn.n_heads, n_kv, attn.d_head, c.d_vocab, c.n_ctx


def frozen_scale(ln: nn.Module, x: Tensor) -> Tensor:
    """ln_f's normaliser at the stream rows x (..., d_model), the factor that the direct
    attribution freezes: 1 / rms(x) for an RMSNorm, 1 / sigma(x) (biased variance) for a
    LayerNorm; one number per row, shape (...).

    >>> round(float(frozen_scale(RMSNorm(2, eps=0.0), torch.tensor([3.0, 4.0]))), 4)
    0.2828
    """
    if isinstance(ln, RMSNorm):
        return torch.rsqrt(x.pow(2).mean(dim=-1) + ln.eps)  # 1 / rms(x)
    centred = x - x.mean(dim=-1, keepdim=True)
    return torch.rsqrt(centred.pow(2).mean(dim=-1) + ln.eps)  # 1 / sigma(x)


def _ln_f_dual(model: nn.Module, W: Tensor, x_last: Tensor) -> Tensor:
    """The columns W (d_model, m) pulled back through ln_f's linear part with its normaliser frozen
    at x_last (d_model,): the u with o . u = N(o) . w_t for every row o, N(o) = o w / rms(x_last)
    (RMSNorm) or (o - mean o) w / sigma(x_last) (LayerNorm, whose centring moves onto u)."""
    ln = model.ln_f
    scale = frozen_scale(ln, x_last)  # at X_L[-1]
    u = W * ln.w[:, None]
    if isinstance(ln, RMSNorm):
        return u * scale
    return (u - u.mean(dim=0, keepdim=True)) * scale


def _read_out(model: nn.Module, x: Tensor) -> Tensor:
    """ln_f(x) W_U for the rows x (n, d_model) -> (n, d_vocab), as (W_U^T ln_f(x)^T)^T: the
    model's read_out, multiplied by the rows ``model.W_U_rows`` (W_E itself where W_U is tied to
    it), so that the graph holds W_E once: given W_E^T, onnxruntime folds the transpose into a
    second matrix of the vocabulary's size (113 MB for SmolLM2). The export then stores that one
    matrix as W_E^T (:func:`gptlib.export.graph._vocab_columns`), the layout in which
    onnxruntime-web multiplies one row by it fast."""
    return (model.W_U_rows @ model.ln_f(x).T).T


def _step(
    model: nn.Module,
    ids: Tensor,
    past: Tensor,
    head_mask: Tensor,
    lens: Tensor,
    targets: Tensor,
    queries: Tensor,
    head: Tensor,
) -> dict[str, Tensor]:
    """:func:`step` without the checks of its arguments (what the graph traces)."""
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    T, P = ids.shape[1], past.shape[0]
    torch._check(P + T <= n_ctx)  # the model raises beyond n_ctx; the trace learns the bound
    cache = _PastCache(past)
    layers, heads, at, tokens = head.unbind(1)  # (s,) each: the asked heads, s = 0 for none
    with (
        capture(model, "hook_resid") as streams,
        capture_patterns(model) as patterns,
        _queries_of(model, heads, at) as picked,
        _masked_heads(model, head_mask),
    ):
        model(ids, cache, check_ids=False)
    # (L + 1, d_model): X_0 .. X_L, last row; one gather a layer and one concatenation (as
    # everywhere below, the fewest nodes a layer in the graph, whose T and P are symbolic)
    resid = torch.cat([x[:, -1] for x in streams])
    # the asked rows only: r = len(queries) of the T new queries' rows, each layer's cut first
    attn = torch.cat([p.index_select(2, queries) for p in patterns])  # (L, H, r, P + T)
    # (T, L, 2, n_kv, d_head): the new positions only, as the layers appended them (-1: T)
    kv = torch.cat(cache.new).view(L, 2, n_kv, -1, d_head).permute(3, 0, 1, 2, 4)
    logits = _read_out(model, resid[-1:])  # (1, V): ln_f(X_L[-1]) W_U
    # the logit lens at the last position, cut to its top K inside the step; n = 0 streams make
    # an empty projection, and the top K of a row of zeros stands in for the rows (no row is kept)
    lens_rows = _read_out(model, resid.index_select(0, lens))  # (n, V)
    n = lens.shape[0]
    padded = torch.cat([lens_rows, logits.new_zeros(1, V)])  # (n + 1, V): top-k never sees 0 rows
    top = torch.topk(padded, min(LENS_TOP, V), dim=-1)  # (n + 1, K), largest first
    lse = torch.logsumexp(padded, dim=-1)  # (n + 1,)
    # the direct contributions: head h's output at the last position through ln_f's linear part,
    # dotted with W_U[:, t]; the targets are projected first, so that m = 0 costs nothing.
    # A target -1 is the step's own most probable token (the argmax of its logits).
    top1 = logits[0].argmax().reshape(1)
    chosen = torch.where(targets < 0, top1.expand_as(targets), targets)  # (m,)
    W_t = model.W_U_rows.index_select(0, chosen).T  # (d_model, m): W_U[:, chosen]
    u = _ln_f_dual(model, W_t, resid[-1])  # (d_model, m)
    # (W_O^h u_t)^T as u_t^T W_O^T, F.linear's product of rows with the stored W_O (a Gemm that
    # reads W_O transposed: onnxruntime's WebAssembly kernels multiply a matrix by one column
    # several times slower), times head h's mask: a layer at a time from the weights themselves
    # (no masked copy of them), the mask multiplied once for all the layers
    m, d_model = u.shape[1], u.shape[0]
    W_Ou = (
        torch.cat(
            [
                F.linear(u.T, model.blocks[layer].attn.W_O).view(1, m, H, d_head)
                for layer in range(L)
            ]
        )
        * head_mask[:, None, :, None]
    )  # (L, m, H, d_head)
    # z_h at the last position, a layer at a time: its last row of each group of heads times the
    # group's values (no stack of every layer's values: half the cache again, 190 MB for SmolLM2
    # at 8,192 positions)
    z = torch.cat(
        [
            (p[:, :, -1].view(n_kv, H // n_kv, -1) @ cache.v[layer]).reshape(1, H, d_head)
            for layer, p in enumerate(patterns)
        ]
    )  # (L, H, d_head)
    direct = torch.einsum("lhd,lhdm->lhm", z, W_Ou.permute(0, 2, 3, 1))  # (L, H, m)
    # one head at one query, for each of the s asked (head.js): its query, the gathers of its
    # slice W_O^h (times the head's mask), ln_f's normaliser at X_L[t] and gain, and
    # W_U[:, v]; each layer's rows gathered first, then the asked layer's picked, so that s = 0
    # gathers nothing
    s = head.shape[0]
    pick = lambda per_layer: per_layer[layers, torch.arange(s)]  # noqa: E731 (L, s, ..) -> (s, ..)
    offsets = torch.arange(d_head, device=heads.device)
    rows = (heads[:, None] * d_head + offsets).reshape(-1)  # (s d_head,): the rows of W_O^h
    W_Oh = pick(
        torch.cat([model.blocks[layer].attn.W_O.index_select(0, rows) for layer in range(L)]).view(
            L, s, d_head, d_model
        )
        * head_mask.index_select(1, heads)[:, :, None, None]
    )  # (s, d_head, d_model): the rows of W_O^h times its mask, as the forward pass uses them
    X_L = streams[-1][0].index_select(0, at)  # (s, d_model): X_L at the asked queries
    return {
        "logits": logits,
        "kv": kv,
        "attn": attn,
        "lens_ids": top.indices[:n],
        "lens_logits": top.values[:n],
        "lens_lse": lse[:n],
        "direct": direct,
        "head_q": pick(torch.stack(picked)),  # (s, d_head)
        "head_W_O": W_Oh,  # (s, d_head, d_model)
        # (s,), from s + 1 rows: onnxruntime's ReduceMean of 0 rows gives a (0, d_model) tensor,
        # which it then warns of on every step without a head
        "head_ln_scale": frozen_scale(model.ln_f, torch.cat([X_L, X_L.new_ones(1, d_model)]))[:s],
        "head_ln_w": model.ln_f.w[None].expand(s, -1).clone(),  # (s, d_model)
        "head_W_U": model.W_U_rows.index_select(0, tokens),  # (s, d_model)
    }


@contextmanager
def _masked_heads(model: nn.Module, head_mask: Tensor) -> Iterator[None]:
    """Each head's attention pattern A_h times its mask m_h (``head_mask`` (L, H)) where its layer
    multiplies the values, so that the head's output is (m_h A_h) V = m_h z_h: for a mask of 0
    and 1 exactly what zeroing the head's rows of W_O gives (:func:`gptlib.circuits.ablate_heads`),
    without a masked copy of every W_O on each step. Entered after the hooks that record the
    patterns, which see them unmasked."""
    masks = head_mask[:, None, :, None, None]  # (L, 1, H, 1, 1): one unsqueeze for all layers
    handles = [
        blk.attn.hook_pattern.register_forward_hook(lambda m, args, p, mask=masks[layer]: p * mask)
        for layer, blk in enumerate(model.blocks)
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _queries_of(model: nn.Module, heads: Tensor, at: Tensor) -> Iterator[list[Tensor]]:
    """Each layer's queries (after RoPE, as its attention layer computes them) of the heads
    ``heads`` (s,) at the new positions ``at`` (s,), gathered in the layer's forward pass: a list
    of L tensors (s, d_head), filled during the ``with`` block."""
    picked: list[Tensor] = []
    handles = [
        blk.attn.hook_q.register_forward_hook(
            lambda m, args, q: picked.append(q[0][heads, at])  # (s, d_head)
        )
        for blk in model.blocks
    ]
    try:
        yield picked
    finally:
        for h in handles:
            h.remove()


def _check_model(model: object) -> None:
    """A GPT or ModernGPT with multi-head or grouped-query attention and float32 weights (the step
    and its graph compute in float32; :class:`_PastCache` holds keys and values per head)."""
    if not isinstance(model, (GPT, ModernGPT)):
        raise ValueError(f"model must be a gptlib GPT or ModernGPT, got {type(model).__name__}")
    attn = type(model.blocks[0].attn)
    if attn.__name__ not in ("MultiHeadAttention", "GroupedQueryAttention"):
        raise ValueError(
            f"model's attention is {attn.__name__} (latent attention keeps no keys and values per "
            "head): the step and its graph take multi-head or grouped-query attention"
        )
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes - {torch.float32}:
        raise ValueError(
            f"model's weights are {', '.join(sorted(map(str, dtypes)))}; the step computes in "
            "torch.float32: pass model.float()"
        )
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ValueError("model's weights are on the meta device (no values): load them first")


def _check_index_list(name: str, values: object, lo: int, hi: int) -> list[int]:
    """``values`` as a list of ints in [lo, hi): ints only (numpy's too; bool and float refused)."""
    if isinstance(values, Tensor):
        values = values.tolist() if values.dtype in (torch.int64, torch.int32) else values
    try:
        items = list(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a sequence of ints, got {type(values).__name__}"
        ) from None
    return [check_int(f"{name}[{k}]", v, lo, hi - 1) for k, v in enumerate(items)]


def _check_outputs(model: nn.Module, out: dict[str, Tensor]) -> dict[str, Tensor]:
    """``out`` if its logits are finite; else the weight at fault named, or the overflow said."""
    if not bool(torch.isfinite(out["logits"]).all()):
        check_finite_weights(model)
        raise ValueError("the step's logits are NaN or infinite: the model overflows on this text")
    return out


def _check_tensor(name: str, t: object, dtype: torch.dtype, shape: tuple) -> Tensor:
    """``t`` must be a tensor of ``dtype`` whose shape matches ``shape`` (None: any size)."""
    if (
        not isinstance(t, Tensor)
        or t.dtype != dtype
        or t.dim() != len(shape)
        or any(s is not None and s != n for s, n in zip(shape, t.shape))
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        got = (t.dtype, tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dtype} tensor of shape {want}, got {got}")
    return t


@torch.no_grad()
def step(
    model: GPT | ModernGPT,
    ids: Tensor,
    past: Tensor,
    head_mask: Tensor,
    lens: Tensor,
    targets: Tensor,
    queries: Tensor,
    head: Tensor | None = None,
) -> dict[str, Tensor]:
    """One step of ``model`` (in eval mode) on new tokens, given the keys and values before them.

    Inputs (B = 1; L layers, H heads, n_kv key-value heads, d_vocab V):

    * ``ids`` int64 (1, T), T >= 1: the new tokens, at positions P .. P + T - 1;
    * ``past`` float32 (P, L, 2, n_kv, d_head), P >= 0: the cached keys (index 0; for a ModernGPT
      rotated, as :class:`~gptlib.kvcache.KVCache` holds them) and values (index 1), position
      first;
    * ``head_mask`` float32 (L, H): head h's output z_h W_O^h is multiplied by it (0 removes the
      head exactly as :func:`gptlib.circuits.ablate_heads` does, 1 keeps it);
    * ``lens`` int64 (n,), 0 <= n: which residual streams X_0 .. X_L the logit lens reads at the
      last new position (none: no lens);
    * ``targets`` int64 (m,), 0 <= m: the token ids whose logits ``direct`` decomposes; -1 stands
      for the step's most probable token (the first argmax of ``logits``);
    * ``queries`` int64 (r,), 0 <= r: which of the T new queries' attention rows ``attn`` holds;
    * ``head`` int64 (s, 4), 0 <= s (None: s = 0): rows (layer, h, t, v), each one head h of block
      ``layer`` (both from 0) at the new query t (of the T) and a token id v, for the
      ``head_*`` outputs (:func:`head_input` makes it).

    Outputs (float32 unless stated), in the order of :data:`OUTPUTS`:

    * ``logits`` (1, V): ln_f(X_L) W_U at the last new position;
    * ``kv`` (T, L, 2, n_kv, d_head): the new positions' keys and values (``past`` of the next
      step is ``past`` and ``kv`` concatenated along the first axis);
    * ``attn`` (L, H, r, P + T): the attention rows of the queries ``queries`` (zero beyond a
      query's position), masked heads included;
    * ``lens_ids`` int64 (n, K), ``lens_logits`` (n, K), ``lens_lse`` (n,): the top K =
      :data:`LENS_TOP` tokens of ln_f(X_l) W_U for each requested stream l, largest first, and
      the logsumexp of the whole row, so that p = exp(logit - lse);
    * ``direct`` (L, H, m): head h's output at the last position, z_h W_O^h (times its mask),
      through ln_f's linear part with the normaliser frozen at X_L's last row, dotted with
      W_U[:, t] for each target t;
    * for each row (layer, h, t, v) of ``head`` (what :mod:`gptlib.widgets.head`'s view needs
      beyond the cache's keys and values, :func:`gptlib.head_trace.head_trace`'s inputs):
      ``head_q`` (s, d_head) head h's query at t (after RoPE for a ModernGPT), ``head_W_O``
      (s, d_head, d_model) its slice W_O^h times its mask, ``head_ln_scale`` (s,) ln_f's
      normaliser 1 / rms or 1 / sigma of X_L at t, ``head_ln_w`` (s, d_model) ln_f's gain and
      ``head_W_U`` (s, d_model) W_U[:, v].

    The model itself computes: a :class:`~gptlib.kvcache.KVCache` that starts from ``past``,
    its forward pass with each head's pattern scaled by its mask, hooks reading the patterns and
    the residual streams.

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8)).eval()
    >>> ids = torch.tensor([[5, 6, 7]])
    >>> first = step(model, ids[:, :2], *step_inputs(model, [0, 2], [7, -1], queries=[0, 1]))
    >>> {k: tuple(v.shape) for k, v in first.items() if k[:5] != "head_"}
    ... # doctest: +NORMALIZE_WHITESPACE
    {'logits': (1, 512), 'kv': (2, 2, 2, 4, 16), 'attn': (2, 4, 2, 2),
     'lens_ids': (2, 10), 'lens_logits': (2, 10), 'lens_lse': (2,), 'direct': (2, 4, 2)}
    >>> then = step(model, ids[:, 2:], first["kv"], *step_inputs(model)[1:])
    >>> torch.allclose(then["logits"], model(ids)[:, -1], atol=1e-5), tuple(then["attn"].shape)
    (True, (2, 4, 0, 3))
    >>> one = step(model, ids, *step_inputs(model), head_input(model, [(1, 3, 2, 9)]))
    >>> [tuple(one[k].shape) for k in HEAD_OUTPUTS]
    [(1, 16), (1, 16, 64), (1,), (1, 64), (1, 64)]

    Every argument is checked: a wrong dtype or shape, an id out of range, a stream beyond X_L, a
    query beyond T or more positions than n_ctx raise ``ValueError`` naming the argument.
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    _check_tensor("ids", ids, torch.int64, (1, None))
    if ids.shape[1] < 1:
        raise ValueError("ids must hold at least one new token, got shape (1, 0)")
    check_ids(ids, V)
    _check_tensor("past", past, torch.float32, (None, L, 2, n_kv, d_head))
    P, T = past.shape[0], ids.shape[1]
    if P + T > n_ctx:
        raise ValueError(
            f"past ({P} positions) and ids ({T}) exceed n_ctx={n_ctx}; crop the context first"
        )
    _check_tensor("head_mask", head_mask, torch.float32, (L, H))
    for name, t in (("past", past), ("head_mask", head_mask)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite")
    _check_tensor("lens", lens, torch.int64, (None,))
    if lens.numel() and not bool(((lens >= 0) & (lens <= L)).all()):
        raise ValueError(f"lens must be stream indices in [0, {L}], got {lens.tolist()}")
    _check_tensor("targets", targets, torch.int64, (None,))
    if targets.numel() and not bool(((targets >= -1) & (targets < V)).all()):
        raise ValueError(
            f"targets must be token ids in [0, {V}) or -1 (the argmax), got {targets.tolist()}"
        )
    _check_tensor("queries", queries, torch.int64, (None,))
    if queries.numel() and not bool(((queries >= 0) & (queries < T)).all()):
        raise ValueError(f"queries must be new positions in [0, {T}), got {queries.tolist()}")
    device = next(model.parameters()).device
    if head is None:
        head = torch.zeros(0, 4, dtype=torch.int64, device=device)
    _check_tensor("head", head, torch.int64, (None, 4))
    hi = torch.tensor([L, H, T, V], device=head.device)
    if head.numel() and not bool(((head >= 0) & (head < hi)).all()):
        raise ValueError(
            f"head must hold rows (layer, h, t, v) in [0, {L}) x [0, {H}) x [0, {T}) x [0, {V}), "
            f"got {head.tolist()}"
        )
    args = (ids, past, head_mask, lens, targets, queries, head)
    if any(t.device != device for t in args):
        raise ValueError(
            f"ids, past, head_mask, lens, targets, queries and head must be on {device}"
        )
    was_training = model.training
    model.eval()
    try:
        return _check_outputs(model, _step(model, *args))
    finally:
        model.train(was_training)


def step_inputs(
    model: GPT | ModernGPT,
    lens: list[int] = (),
    targets: list[int] = (),
    P: int = 0,
    queries: list[int] = (),
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``past`` (zeros, P positions), ``head_mask`` (ones), ``lens``, ``targets`` and ``queries``
    for :func:`step`, on the model's device: the arguments after ``ids`` of a step that removes no
    head (``queries`` are not checked against T, which the step knows; ``targets`` may hold -1).

    >>> from gptlib.modern import ModernConfig
    >>> model = ModernGPT(ModernConfig.preset("tiny"))
    >>> [tuple(t.shape) for t in step_inputs(model, lens=[2], targets=[1, -1], queries=[0])]
    [(0, 2, 2, 2, 8), (2, 4), (1,), (2,), (1,)]
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    P = check_int("P", P, 0, n_ctx - 1)
    lens = _check_index_list("lens", lens, 0, L + 1)
    targets = _check_index_list("targets", targets, -1, V)
    queries = _check_index_list("queries", queries, 0, n_ctx)
    device = next(model.parameters()).device
    i64 = {"dtype": torch.int64, "device": device}
    return (
        torch.zeros(P, L, 2, n_kv, d_head, device=device),
        torch.ones(L, H, device=device),
        torch.tensor(lens, **i64),
        torch.tensor(targets, **i64),
        torch.tensor(queries, **i64),
    )


def head_input(model: GPT | ModernGPT, heads: list[tuple[int, int, int, int]] = ()) -> Tensor:
    """:func:`step`'s ``head`` (s, 4) int64 on the model's device: one row (layer, h, t, v) per
    head asked (t, the new query, is checked against T by the step, which knows it).

    >>> from gptlib.model import GPTConfig
    >>> model = GPT(GPTConfig.preset("tiny"))
    >>> head_input(model, [(1, 3, 0, 9)]).tolist(), tuple(head_input(model).shape)
    ([[1, 3, 0, 9]], (0, 4))
    """
    _check_model(model)
    L, H, _, _, V, n_ctx = _shape(model)
    rows = []
    for k, row in enumerate(heads):
        if not isinstance(row, (tuple, list)) or len(row) != 4:
            raise ValueError(f"heads[{k}] must be (layer, h, t, v), got {row!r}")
        rows.append(
            [
                check_int(f"heads[{k}] layer", row[0], 0, L - 1),
                check_int(f"heads[{k}] h", row[1], 0, H - 1),
                check_int(f"heads[{k}] t", row[2], 0, n_ctx - 1),
                check_int(f"heads[{k}] v", row[3], 0, V - 1),
            ]
        )
    device = next(model.parameters()).device
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(rows), 4)
