"""Chapter 11: mixture of experts — a top-k routed MLP and its load-balancing loss.

    router     p(x) = softmax(x W_r)                       W_r: (d_model, n_experts)
    top-k      S(x) = the k experts with the largest p_i(x)
    output     y(x) = sum_{i in S(x)} g_i(x) MLP_i(x),     g_i = p_i (k = 1) or p_i / sum_{j in S}
    p_j (k > 1)
    balance    L_aux = n_experts sum_i f_i P_i,  f_i = share of routed slots sent to i,
                                                 P_i = mean router probability of i
    capacity   each expert takes at most ceil(capacity_factor k n / n_experts) of the k n slots of
               a batch of n tokens, first come first served; the others are dropped (Switch)

Each expert is a :class:`gptlib.mlp.MLP`. A token touches k of the n_experts MLPs, so the layer
holds n_experts times the weights of one MLP but costs about k MLPs' FLOPs per token
(:func:`gptlib.flops.moe_flops_per_token`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .embedding import init_normal_
from .mlp import MLP
from .runtime import check_float, check_ids, check_int, check_positive_int

__all__ = [
    "route",
    "load_balancing_loss",
    "sort_by_expert",
    "expert_capacity",
    "kept_slots",
    "MoE",
    "moe_parameters",
]


def route(x: Tensor, W_r: Tensor, top_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Router probabilities (n, n_experts), gates (n, k) and expert indices (n, k) for rows x (n,
    d_model).

    Indices are in decreasing order of probability. With k = 1 the gate is the probability itself
    (Switch Transformer), so the router still gets a gradient; with k > 1 the k probabilities are
    renormalised to sum to 1 (GShard, Mixtral).

    >>> W_r = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    >>> p, g, i = route(torch.tensor([[1.0, 0.0]]), W_r, 2)
    >>> i.tolist(), [round(v, 4) for v in g[0].tolist()]
    ([[2, 1]], [0.7311, 0.2689])
    """
    if x.dim() != 2 or W_r.dim() != 2 or x.shape[1] != W_r.shape[0]:
        raise ValueError(
            f"x (n, d_model) and W_r (d_model, n_experts) must agree, got {tuple(x.shape)}, "
            f"{tuple(W_r.shape)}"
        )
    check_int("top_k", top_k, 1, W_r.shape[1])
    probs = torch.softmax((x @ W_r).float(), dim=-1)  # (n, n_experts), in fp32 even under autocast
    top, idx = probs.topk(top_k, dim=-1)  # (n, k) each
    gates = top if top_k == 1 else top / top.sum(dim=-1, keepdim=True)
    return probs, gates, idx


def load_balancing_loss(probs: Tensor, idx: Tensor, n_experts: int) -> Tensor:
    """n_experts * sum_i f_i P_i: 1 when routing is uniform, n_experts when every token goes to one
    expert.

    f_i is the fraction of the n k routed slots that chose expert i (piecewise constant: no
    gradient), P_i the mean of the router probabilities p_i over the n tokens (differentiable).
    Its gradient, d L_aux / d p_ti = n_experts f_i / n, lowers the probabilities of each expert in
    proportion to the load it already has.

    >>> p = torch.full((4, 2), 0.5)
    >>> float(load_balancing_loss(p, torch.tensor([[0], [1], [0], [1]]), 2))
    1.0
    """
    check_positive_int("n_experts", n_experts)
    check_ids(idx, n_experts, "idx")  # ints in [0, n_experts)
    if probs.dim() != 2 or probs.shape[1] != n_experts:
        raise ValueError(
            f"probs must have shape (n, n_experts={n_experts}), got {tuple(probs.shape)}"
        )
    if idx.dim() != 2 or idx.shape[0] != probs.shape[0]:
        raise ValueError(
            f"idx must have shape (n, k) with n = {probs.shape[0]}, got {tuple(idx.shape)}"
        )
    f = (
        torch.bincount(idx.flatten(), minlength=n_experts).to(probs.dtype) / idx.numel()
    )  # (n_experts,)
    P = probs.mean(dim=0)  # (n_experts,)
    return n_experts * (f * P).sum()


def sort_by_expert(idx: Tensor, n_experts: int) -> tuple[Tensor, Tensor]:
    """The routed slots grouped by expert: (order, counts).

    ``order`` lists the flat slot numbers t k + j of ``idx`` (n, k) expert by expert (stable, so
    tokens keep their order within an expert); ``counts[e]`` is how many slots chose expert e.
    Slot s belongs to token s // k.

    >>> sort_by_expert(torch.tensor([[1, 0], [0, 2]]), 3)
    (tensor([1, 2, 0, 3]), tensor([2, 1, 1]))
    """
    check_ids(idx, n_experts, "idx")  # ints in [0, n_experts)
    flat = idx.flatten()
    return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=n_experts)


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """The most slots one expert processes per batch: ceil(capacity_factor k n / n_experts).

    With ``capacity_factor = 1`` the k n slots of n tokens fit exactly when the routing is
    uniform; a larger factor leaves room for imbalance, at the price of padding on hardware that
    needs fixed shapes (Switch Transformer).

    >>> expert_capacity(32, 8, 2, 1.0), expert_capacity(32, 8, 2, 1.25)
    (8, 10)
    >>> expert_capacity(10, 4, 1, 1.0)
    3
    """
    check_positive_int("n_tokens", n_tokens)
    check_positive_int("n_experts", n_experts)
    check_int("top_k", top_k, 1, n_experts)
    check_float("capacity_factor", capacity_factor, 0.0, lo_open=True)
    # - 1e-9: a product that rounds up past a whole number (1.1 * 10 = 11.000000000000002) is
    # that number
    return math.ceil(capacity_factor * top_k * n_tokens / n_experts - 1e-9)


def kept_slots(idx: Tensor, n_experts: int, capacity: int) -> Tensor:
    """Which routed slots an expert of ``capacity`` processes: (n, k) booleans.

    Each expert takes the slots that chose it in token order (slot t k + j before t' k + j' when
    t < t', or t = t' and j < j') until it is full; the rest are dropped, and a dropped slot adds
    nothing to its token's output (the token still passes on through the residual stream).

    >>> kept_slots(torch.tensor([[0], [1], [0], [0]]), 2, 2).flatten().tolist()
    [True, True, True, False]
    """
    check_int("capacity", capacity, 0)
    order, counts = sort_by_expert(idx, n_experts)
    rank = torch.empty_like(order)  # each slot's place in its expert's queue
    rank[order] = torch.cat([torch.arange(int(c)) for c in counts])
    return (rank < capacity).view(idx.shape)


class MoE(nn.Module):
    """A mixture-of-experts MLP: ``n_experts`` :class:`MLP` experts, each token sent to ``top_k`` of
    them.

    ``forward(x)`` maps (..., d_model) to (..., d_model) and keeps, in ``aux_loss``, the
    load-balancing loss of the routing it made (:func:`load_balancing_loss`), to be added (times a
    small coefficient, 0.01 in Switch) to the language-model loss. With a ``capacity_factor``, each
    expert processes at most :func:`expert_capacity` slots of a batch and drops the rest
    (:func:`kept_slots`).

    >>> moe = MoE(8, 32, n_experts=4, top_k=1)
    >>> x = torch.randn(5, 8)
    >>> _, g, i = route(x, moe.W_r, 1)
    >>> torch.allclose(moe(x)[0], g[0, 0] * moe.experts[int(i[0, 0])](x[:1])[0])
    True
    """

    def __init__(
        self,
        d_model: int,
        d_mlp: int,
        n_experts: int,
        top_k: int = 2,
        activation: str = "gelu_tanh",
        bias: bool = True,
        capacity_factor: float | None = None,
    ):
        super().__init__()
        check_positive_int("n_experts", n_experts)
        check_int("top_k", top_k, 1, n_experts)
        if capacity_factor is not None:
            check_float("capacity_factor", capacity_factor, 0.0, lo_open=True)
        self.d_model, self.d_mlp, self.n_experts, self.top_k = d_model, d_mlp, n_experts, top_k
        self.capacity_factor = capacity_factor
        self.experts = nn.ModuleList(
            MLP(d_model, d_mlp, activation, bias) for _ in range(n_experts)
        )
        self.W_r = nn.Parameter(torch.empty(d_model, n_experts))
        init_normal_(self.W_r, 0.02)
        self.aux_loss: Tensor | None = None  # the last forward pass's load-balancing loss

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.d_model,):
            raise ValueError(f"x must end in d_model={self.d_model}, got shape {tuple(x.shape)}")
        x2 = x.reshape(-1, self.d_model)  # (n, d_model), n = B*T tokens
        probs, gates, idx = route(x2, self.W_r, self.top_k)  # (n, E), (n, k), (n, k)
        self.aux_loss = load_balancing_loss(probs, idx, self.n_experts)
        order, counts = sort_by_expert(idx, self.n_experts)
        cap = (
            None
            if self.capacity_factor is None
            else expert_capacity(x2.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        )
        y = torch.zeros_like(x2)  # (n, d_model)
        for e, slots in enumerate(order.split(counts.tolist())):
            slots = slots if cap is None else slots[:cap]  # in token order: the first cap are kept
            if slots.numel() == 0:
                continue
            tokens = slots // self.top_k  # which rows of x2 expert e processes
            out = self.experts[e](x2[tokens])  # (n_e, d_model)
            y.index_add_(0, tokens, out * gates.flatten()[slots, None].to(out.dtype))
        return y.view(x.shape)  # (..., d_model)

    def extra_repr(self) -> str:
        cap = "" if self.capacity_factor is None else f", capacity_factor={self.capacity_factor}"
        return (
            f"d_model={self.d_model}, d_mlp={self.d_mlp}, n_experts={self.n_experts}, "
            f"top_k={self.top_k}{cap}"
        )


def moe_parameters(
    d_model: int, d_mlp: int, n_experts: int, top_k: int, bias: bool = True
) -> tuple[int, int]:
    """(all parameters, parameters a token uses) of an MoE layer: the router plus n_experts or top_k
    MLPs.

    >>> moe_parameters(8, 32, 4, 2)  # one MLP: 2*8*32 + 32 + 8 = 552; router 8*4 = 32
    (2240, 1136)
    """
    for name, v in (("d_model", d_model), ("d_mlp", d_mlp), ("n_experts", n_experts)):
        check_positive_int(name, v)
    check_int("top_k", top_k, 1, n_experts)
    mlp = 2 * d_model * d_mlp + (d_mlp + d_model if bias else 0)
    router = d_model * n_experts
    return router + n_experts * mlp, router + top_k * mlp
