"""The live step: one call of a model on new tokens, given the keys and values of the positions
before them, with a mask over the heads and the read-outs the page shows (Chapters 7 and 12).

:func:`step` composes the model's own modules (its attention layers append to a
:class:`~gptlib.kvcache.KVCache` that starts from ``past``; hooks read the patterns and the residual
streams), so the PyTorch model stays the only definition of the maths. It returns the next-token
logits, the keys and values with the new positions appended, every head's attention rows, the top
of the logit lens and each head's direct contribution to the target logits. The same function is
what a Jupyter kernel answers the book's live views with and what :func:`gptlib.export.to_onnx`
traces into the graph the HTML book runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .attention import repeat_kv
from .hooks import capture, capture_patterns
from .kvcache import KVCache
from .model import GPT
from .modern import ModernGPT, RMSNorm
from .runtime import check_finite_weights, check_ids, check_int

__all__ = ["OUTPUTS", "INPUTS", "LENS_TOP", "step", "step_inputs"]

OUTPUTS = ("logits", "present", "attn", "lens_ids", "lens_logits", "lens_lse", "direct")
INPUTS = ("ids", "past", "head_mask", "lens", "targets")
LENS_TOP = 10


# --- the step: one call of the model on new tokens, with its cache, masks and read-outs ----------
class _PastCache(KVCache):
    """A :class:`KVCache` that starts from ``past`` (n_layers, 2, n_kv, P, d_head) and appends by
    concatenation, so that a traced graph holds no buffers: the keys and values the model's own
    attention layers write, P + T positions per layer after the step."""

    def __init__(self, past: Tensor):
        super().__init__(past.shape[0])
        self._k = [past[layer, 0][None] for layer in range(self.n_layers)]  # (1, n_kv, P, d_head)
        self._v = [past[layer, 1][None] for layer in range(self.n_layers)]
        self._filled = [past.shape[3]] * self.n_layers

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self._k[layer] = torch.cat([self._k[layer], k], dim=2)  # (1, n_kv, P + T, d_head)
        self._v[layer] = torch.cat([self._v[layer], v], dim=2)
        self._filled[layer] += k.shape[2]
        return self._k[layer], self._v[layer]


def _shape(model: nn.Module) -> tuple[int, int, int, int, int, int]:
    """(n_layers, n_heads, n_kv, d_head, d_vocab, n_ctx) of a GPT or ModernGPT."""
    attn = model.blocks[0].attn
    n_kv = getattr(attn, "n_kv_heads", attn.n_heads)
    c = model.config
    return c.n_layers, attn.n_heads, n_kv, attn.d_head, c.d_vocab, c.n_ctx


def _ln_f_linear(model: nn.Module, o: Tensor, x_last: Tensor) -> Tensor:
    """ln_f's linear part with its normaliser frozen at x_last (d_model,), applied to rows o
    (..., d_model): RMSNorm o w / rms(x_last); LayerNorm (o - mean o) w / sigma(x_last)."""
    ln = model.ln_f
    if isinstance(ln, RMSNorm):
        scale = torch.rsqrt(x_last.pow(2).mean() + ln.eps)  # 1 / rms(X_L[-1])
        return o * ln.w * scale
    centred = x_last - x_last.mean()
    scale = torch.rsqrt(centred.pow(2).mean() + ln.eps)  # 1 / sigma(X_L[-1]), biased variance
    return (o - o.mean(dim=-1, keepdim=True)) * ln.w * scale


def _step(
    model: nn.Module, ids: Tensor, past: Tensor, head_mask: Tensor, lens: Tensor, targets: Tensor
) -> dict[str, Tensor]:
    """:func:`step` without the checks of its arguments (what the graph traces)."""
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    T, P = ids.shape[1], past.shape[3]
    torch._check(P + T <= n_ctx)  # the model raises beyond n_ctx; the trace learns the bound
    cache = _PastCache(past)
    # head h's output z_h W_O^h times its mask: the rows of W_O scaled, as ablate_heads zeroes them
    masked = {
        f"blocks.{layer}.attn.W_O": model.blocks[layer].attn.W_O
        * head_mask[layer][:, None].expand(H, d_head).reshape(H * d_head, 1)  # (H d_head, 1)
        for layer in range(L)
    }
    with capture(model, "hook_resid") as streams, capture_patterns(model) as patterns:
        functional_call(model, masked, (ids, cache), {"check_ids": False}, strict=False)
    resid = torch.stack([x[0, -1] for x in streams])  # (L + 1, d_model): X_0 .. X_L, last row
    attn = torch.stack([p[0] for p in patterns])  # (L, H, T, P + T)
    present = torch.stack(
        [torch.stack([cache.k[layer][0], cache.v[layer][0]]) for layer in range(L)]
    )  # (L, 2, n_kv, P + T, d_head)
    logits = model.read_out(resid[-1:])  # (1, V): ln_f(X_L[-1]) W_U
    # the logit lens at the last position, cut to its top K inside the step
    lens_rows = model.read_out(resid.index_select(0, lens))  # (n, V)
    top = torch.topk(lens_rows, min(LENS_TOP, V), dim=-1)  # (n, K), largest first
    # the direct contributions: head h's output at the last position, through ln_f's linear part
    v_last = repeat_kv(present[:, 1], H // n_kv)  # (L, H, P + T, d_head): head h reads h // G
    z = torch.einsum("lhs,lhsd->lhd", attn[:, :, -1], v_last)  # (L, H, d_head): z_h
    W_O = torch.stack([masked[f"blocks.{layer}.attn.W_O"] for layer in range(L)])
    out = torch.einsum("lhd,lhde->lhe", z, W_O.view(L, H, d_head, -1))  # (L, H, d_model)
    W_t = model.W_U.index_select(1, targets)  # (d_model, m)
    direct = _ln_f_linear(model, out, resid[-1]) @ W_t  # (L, H, m)
    return {
        "logits": logits,
        "present": present,
        "attn": attn,
        "lens_ids": top.indices,
        "lens_logits": top.values,
        "lens_lse": torch.logsumexp(lens_rows, dim=-1),
        "direct": direct,
    }


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


def _check_index_list(name: str, values: object, hi: int) -> list[int]:
    """``values`` as a list of ints in [0, hi): ints only (numpy's too; bool and float refused)."""
    if isinstance(values, Tensor):
        values = values.tolist() if values.dtype in (torch.int64, torch.int32) else values
    try:
        items = list(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a sequence of ints, got {type(values).__name__}"
        ) from None
    return [check_int(f"{name}[{k}]", v, 0, hi - 1) for k, v in enumerate(items)]


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
) -> dict[str, Tensor]:
    """One step of ``model`` (in eval mode) on new tokens, given the keys and values before them.

    Inputs (B = 1; L layers, H heads, n_kv key-value heads, d_vocab V):

    * ``ids`` int64 (1, T), T >= 1: the new tokens, at positions P .. P + T - 1;
    * ``past`` float32 (L, 2, n_kv, P, d_head), P >= 0: the cached keys (index 0; for a ModernGPT
      rotated, as :class:`~gptlib.kvcache.KVCache` holds them) and values (index 1);
    * ``head_mask`` float32 (L, H): head h's output z_h W_O^h is multiplied by it (0 removes the
      head exactly as :func:`gptlib.circuits.ablate_heads` does, 1 keeps it);
    * ``lens`` int64 (n,), 0 <= n: which residual streams X_0 .. X_L the logit lens reads at the
      last new position;
    * ``targets`` int64 (m,): the token ids whose logits ``direct`` decomposes.

    Outputs (float32 unless stated), in the order of :data:`OUTPUTS`:

    * ``logits`` (1, V): ln_f(X_L) W_U at the last new position;
    * ``present`` (L, 2, n_kv, P + T, d_head): ``past`` with the new positions appended;
    * ``attn`` (L, H, T, P + T): every head's attention rows for the new positions (zero beyond a
      query's position), masked heads included;
    * ``lens_ids`` int64 (n, K), ``lens_logits`` (n, K), ``lens_lse`` (n,): the top K =
      :data:`LENS_TOP` tokens of ln_f(X_l) W_U for each requested stream l, largest first, and
      the logsumexp of the whole row, so that p = exp(logit - lse);
    * ``direct`` (L, H, m): head h's output at the last position, z_h W_O^h (times its mask),
      through ln_f's linear part with the normaliser frozen at X_L's last row, dotted with
      W_U[:, t] for each target t.

    The model itself computes: a :class:`~gptlib.kvcache.KVCache` that starts from ``past``,
    its forward pass with W_O's rows scaled by the mask, hooks reading the patterns and the
    residual streams.

    >>> from gptlib.model import GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig.preset("tiny", n_ctx=8)).eval()
    >>> ids = torch.tensor([[5, 6, 7]])
    >>> first = step(model, ids[:, :2], *step_inputs(model, lens=[0, 2], targets=[7]))
    >>> {k: tuple(v.shape) for k, v in first.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'logits': (1, 512), 'present': (2, 2, 4, 2, 16), 'attn': (2, 4, 2, 2),
     'lens_ids': (2, 10), 'lens_logits': (2, 10), 'lens_lse': (2,), 'direct': (2, 4, 1)}
    >>> then = step(model, ids[:, 2:], first["present"], *step_inputs(model)[1:])
    >>> torch.allclose(then["logits"], model(ids)[:, -1], atol=1e-5)
    True

    Every argument is checked: a wrong dtype or shape, an id out of range, a stream beyond X_L or
    more positions than n_ctx raise ``ValueError`` naming the argument.
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    _check_tensor("ids", ids, torch.int64, (1, None))
    if ids.shape[1] < 1:
        raise ValueError("ids must hold at least one new token, got shape (1, 0)")
    check_ids(ids, V)
    _check_tensor("past", past, torch.float32, (L, 2, n_kv, None, d_head))
    P, T = past.shape[3], ids.shape[1]
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
    if targets.numel() and not bool(((targets >= 0) & (targets < V)).all()):
        raise ValueError(f"targets must be token ids in [0, {V}), got {targets.tolist()}")
    device = next(model.parameters()).device
    args = (ids, past, head_mask, lens, targets)
    if any(t.device != device for t in args):
        raise ValueError(f"ids, past, head_mask, lens and targets must be on {device}")
    was_training = model.training
    model.eval()
    try:
        return _check_outputs(model, _step(model, *args))
    finally:
        model.train(was_training)


def step_inputs(
    model: GPT | ModernGPT, lens: list[int] = (), targets: list[int] = (), P: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``past`` (zeros, P positions), ``head_mask`` (ones), ``lens`` and ``targets`` for
    :func:`step`, on the model's device: the arguments after ``ids`` of a step that removes no
    head.

    >>> from gptlib.modern import ModernConfig
    >>> model = ModernGPT(ModernConfig.preset("tiny"))
    >>> [tuple(t.shape) for t in step_inputs(model, lens=[2], targets=[1, 2])]
    [(2, 2, 2, 0, 8), (2, 4), (1,), (2,)]
    """
    _check_model(model)
    L, H, n_kv, d_head, V, n_ctx = _shape(model)
    P = check_int("P", P, 0, n_ctx - 1)
    lens, targets = _check_index_list("lens", lens, L + 1), _check_index_list("targets", targets, V)
    device = next(model.parameters()).device
    return (
        torch.zeros(L, 2, n_kv, P, d_head, device=device),
        torch.ones(L, H, device=device),
        torch.tensor(lens, dtype=torch.int64, device=device),
        torch.tensor(targets, dtype=torch.int64, device=device),
    )
