"""Tests for gptlib.moe: routing, the load-balancing loss, the MoE layer against a per-token loop,
and its parameter and FLOP counts against the module and PyTorch's FLOP counter."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gptlib.flops import moe_flops_per_token
from gptlib.mlp import MLP
from gptlib.moe import (
    MoE,
    expert_capacity,
    kept_slots,
    load_balancing_loss,
    moe_parameters,
    route,
    sort_by_expert,
)


def _x(n: int = 12, d: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_route_picks_the_top_k_probabilities(top_k):
    x, W_r = _x(), torch.randn(8, 5, generator=torch.Generator().manual_seed(1))
    probs, gates, idx = route(x, W_r, top_k)
    torch.testing.assert_close(probs, torch.softmax(x @ W_r, dim=-1))
    top = probs.sort(dim=-1, descending=True)
    assert torch.equal(idx, top.indices[:, :top_k])
    if top_k == 1:
        torch.testing.assert_close(gates, top.values[:, :1])
    else:
        torch.testing.assert_close(gates.sum(-1), torch.ones(len(x)))
        torch.testing.assert_close(
            gates, top.values[:, :top_k] / top.values[:, :top_k].sum(-1, keepdim=True)
        )
    with pytest.raises(ValueError, match="top_k"):
        route(x, W_r, 6)
    with pytest.raises(ValueError, match="W_r"):
        route(x, W_r.T, 1)


def test_load_balancing_loss_extremes_and_formula():
    n, E = 8, 4
    uniform = torch.full((n, E), 1 / E)
    spread = torch.arange(n)[:, None] % E  # each expert gets n / E tokens
    assert float(load_balancing_loss(uniform, spread, E)) == pytest.approx(1.0)
    collapsed = torch.zeros(n, E)
    collapsed[:, 0] = 1.0
    assert float(
        load_balancing_loss(collapsed, torch.zeros(n, 1, dtype=torch.long), E)
    ) == pytest.approx(E)
    probs = torch.softmax(_x(n, E), dim=-1).requires_grad_(True)
    idx = probs.topk(2, dim=-1).indices
    f = torch.stack([(idx == e).float().sum() for e in range(E)]) / idx.numel()
    loss = load_balancing_loss(probs, idx, E)
    torch.testing.assert_close(loss, E * (f * probs.mean(0)).sum())
    loss.backward()  # only P carries a gradient: d loss / d p_ti = E f_i / n
    torch.testing.assert_close(probs.grad, (E * f / n).expand(n, E))
    with pytest.raises(ValueError, match="probs"):
        load_balancing_loss(probs, idx, E + 1)
    with pytest.raises(ValueError, match="idx"):
        load_balancing_loss(probs, idx[:-1], E)


def test_sort_by_expert_groups_slots():
    idx = torch.randint(0, 5, (20, 2), generator=torch.Generator().manual_seed(0))
    order, counts = sort_by_expert(idx, 5)
    assert sorted(order.tolist()) == list(range(40))
    flat = idx.flatten()[order]
    assert torch.equal(flat, flat.sort().values)
    assert counts.tolist() == [int((idx == e).sum()) for e in range(5)]
    with pytest.raises(ValueError, match="idx"):
        sort_by_expert(idx, 3)


@pytest.mark.parametrize("n_experts,top_k", [(4, 1), (4, 2), (3, 3)])
def test_moe_equals_a_per_token_sum_over_chosen_experts(n_experts, top_k):
    torch.manual_seed(0)
    moe = MoE(8, 16, n_experts, top_k)
    x = torch.randn(2, 5, 8)  # (B, T, d_model)
    y = moe(x)
    aux = moe.aux_loss  # the loss of the routing this forward pass made
    x2 = x.reshape(-1, 8)
    probs, gates, idx = route(x2, moe.W_r, top_k)
    expected = torch.stack(
        [
            sum(gates[t, j] * moe.experts[int(idx[t, j])](x2[t : t + 1])[0] for j in range(top_k))
            for t in range(len(x2))
        ]
    ).view_as(x)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(aux, load_balancing_loss(probs, idx, n_experts))
    (y.sum() + aux).backward()
    assert moe.W_r.grad is not None and moe.W_r.grad.abs().sum() > 0


def test_one_expert_is_the_mlp():
    torch.manual_seed(0)
    moe = MoE(8, 16, n_experts=1, top_k=1)
    mlp = MLP(8, 16)
    mlp.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(moe(x), mlp(x))  # the router's single probability is exactly 1


def test_moe_arguments():
    for kwargs, name in (
        ({"n_experts": 0}, "n_experts"),
        ({"top_k": 5}, "top_k"),
        ({"top_k": 0}, "top_k"),
    ):
        with pytest.raises(ValueError, match=name):
            MoE(**({"d_model": 8, "d_mlp": 16, "n_experts": 4, "top_k": 2} | kwargs))
    with pytest.raises(ValueError, match="d_model"):
        MoE(8, 16, 4)(torch.randn(2, 7))


@pytest.mark.parametrize("n_experts,top_k", [(8, 2), (4, 1)])
def test_parameter_and_flop_counts(n_experts, top_k):
    d, d_mlp, n = 16, 64, 40
    torch.manual_seed(0)
    moe = MoE(d, d_mlp, n_experts, top_k)
    total, active = moe_parameters(d, d_mlp, n_experts, top_k)
    assert total == sum(p.numel() for p in moe.parameters())
    one_mlp = sum(p.numel() for p in moe.experts[0].parameters())
    assert active == top_k * one_mlp + moe.W_r.numel()
    x = torch.randn(n, d)
    with FlopCounterMode(display=False) as fc:
        moe(x)
    assert fc.get_total_flops() == n * moe_flops_per_token(d, d_mlp, n_experts, top_k)
    with pytest.raises(ValueError, match="top_k"):
        moe_parameters(d, d_mlp, n_experts, n_experts + 1)
    with pytest.raises(ValueError, match="d_mlp"):
        moe_flops_per_token(d, 0, n_experts, top_k)


def test_expert_indices_must_be_ints_in_range():
    probs = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="idx"):
        load_balancing_loss(probs, torch.tensor([[0], [3]]), 3)
    with pytest.raises(ValueError, match="idx"):
        sort_by_expert(torch.tensor([[0.0], [1.0]]), 3)


@pytest.mark.parametrize("top_k,factor", [(1, 1.0), (2, 1.0), (2, 0.5), (1, 1.25)])
def test_capacity_drops_the_overflow_in_token_order(top_k, factor):
    torch.manual_seed(0)
    moe = MoE(8, 16, n_experts=4, top_k=top_k, capacity_factor=factor)
    x = _x(n=20)
    cap = expert_capacity(20, 4, top_k, factor)
    assert cap == -(-int(factor * top_k * 20 * 4) // 16)  # ceil(factor k n / n_e), in integers
    _, gates, idx = route(x, moe.W_r, top_k)
    # brute force: walk the slots in token order, each expert takes them until it is full
    taken, expected, dropped = [0] * 4, torch.zeros_like(x), 0
    for t in range(20):
        for j in range(top_k):
            e = int(idx[t, j])
            if taken[e] < cap:
                taken[e] += 1
                expected[t] += gates[t, j] * moe.experts[e](x[t : t + 1])[0]
            else:
                dropped += 1
    torch.testing.assert_close(moe(x), expected)
    keep = kept_slots(idx, 4, cap)
    load = torch.bincount(idx.flatten(), minlength=4)
    assert int((~keep).sum()) == dropped == int((load - cap).clamp(min=0).sum())
    moe.capacity_factor = None  # no capacity: nothing dropped
    expected = torch.stack(
        [
            sum(gates[t, j] * moe.experts[int(idx[t, j])](x[t : t + 1])[0] for j in range(top_k))
            for t in range(20)
        ]
    )
    torch.testing.assert_close(moe(x), expected)


def test_capacity_arguments():
    assert expert_capacity(64, 8, 2, 1.0) == 16 and expert_capacity(10, 4, 1, 1.1) == 3
    for kwargs, name in (
        ({"capacity_factor": 0.0}, "capacity_factor"),
        ({"n_tokens": 0}, "n_tokens"),
        ({"top_k": 9}, "top_k"),
        ({"capacity_factor": float("inf")}, "capacity_factor"),
    ):
        with pytest.raises(ValueError, match=name):
            expert_capacity(
                **({"n_tokens": 64, "n_experts": 8, "top_k": 2, "capacity_factor": 1.0} | kwargs)
            )
    with pytest.raises(ValueError, match="capacity_factor"):
        MoE(8, 16, 4, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="capacity"):
        kept_slots(torch.zeros(3, 1, dtype=torch.long), 2, -1)
