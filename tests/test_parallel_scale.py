"""Tests for Chapter 11's distributed pieces on gloo: ZeRO-1 and FSDP2 training against one
process, the ring all-reduce and its byte count, expert parallelism against the single-process MoE
layer, 1F1B beside GPipe.

Each spawn of processes costs seconds, so each worker runs once per test session (module fixtures)
and several tests read its result.
"""

from __future__ import annotations

import math

import pytest
import torch

from gptlib.model import GPT, GPTConfig
from gptlib.moe import MoE
from gptlib.parallel import pipeline as PP
from gptlib.parallel import run_distributed, timetable
from gptlib.parallel.experts import expert_parallel_forward, expert_parallel_worker
from gptlib.parallel.sharding import (
    local_numel,
    ring_bytes_per_rank,
    ring_worker,
    sharded_training_worker,
)
from gptlib.training import lm_loss

CONFIG = GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2)


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---- pure schedule arithmetic ---------------------------------------------------------------


def test_stage_orders():
    assert PP.stage_order("gpipe", 0, 2, 3) == ["F0", "F1", "F2", "B2", "B1", "B0"]
    assert PP.stage_order("1f1b", 0, 3, 4) == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert PP.stage_order("1f1b", 2, 3, 4) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    for p in range(1, 5):
        for m in range(1, 6):
            for s in range(p):
                order = PP.stage_order("1f1b", s, p, m)
                assert sorted(order) == sorted(PP.stage_order("gpipe", s, p, m))  # every op once
    for args, name in (
        (("pipedream", 0, 2, 2), "schedule"),
        (("1f1b", 2, 2, 2), "stage"),
        (("1f1b", 0, 0, 2), "n_stages"),
    ):
        with pytest.raises(ValueError, match=name):
            PP.stage_order(*args)


def test_1f1b_has_gpipes_bubble_and_bounded_activations():
    for p in range(1, 7):
        for m in range(1, 13):
            gpipe, ofob = PP.pipeline_timetable("gpipe", p, m), PP.pipeline_timetable("1f1b", p, m)
            assert gpipe == PP.gpipe_schedule(p, m)
            assert len(ofob[0]) == len(gpipe[0]) == 2 * (m + p - 1)
            assert math.isclose(PP.bubble_fraction(ofob), PP.gpipe_bubble(p, m))
            assert PP.peak_in_flight(gpipe) == [m] * p
            assert PP.peak_in_flight(ofob) == [min(p - s, m) for s in range(p)]


def test_local_numel():
    assert local_numel([torch.zeros(2, 3), None, torch.zeros(4)]) == 10


# ---- ZeRO-1 and FSDP2 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded():
    model = _model()
    ids = torch.randint(
        0, CONFIG.d_vocab, (3, 4, CONFIG.n_ctx + 1), generator=torch.Generator().manual_seed(1)
    )
    x, y = ids[..., :-1], ids[..., 1:]  # 3 steps of (B=4, T=16)
    results = run_distributed(sharded_training_worker, CONFIG, _state(model), x, y, 1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for xb, yb in zip(x, y):
        loss = lm_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return results, losses, model


@pytest.mark.parametrize("method", ["zero1", "fsdp"])
def test_sharded_training_equals_one_process(sharded, method):
    results, losses, model = sharded
    for r in results:
        assert r[method]["losses"] == pytest.approx(losses, rel=1e-5)
        for name, w in model.state_dict().items():
            # atol: b_K's exact gradient is 0 (softmax ignores it); Adam rescales its rounding noise
            torch.testing.assert_close(r[method]["state"][name], w, rtol=1e-4, atol=1e-4, msg=name)


def test_sharded_state_sizes(sharded):
    results, _, model = sharded
    N = model.num_parameters()
    zero1 = [r["zero1"]["held"] for r in results]
    fsdp = [r["fsdp"]["held"] for r in results]
    assert all(h["weights"] == h["gradients"] == N for h in zero1)  # replicated
    assert (
        sum(h["optimizer"] for h in zero1) == 2 * N and max(h["optimizer"] for h in zero1) < 2 * N
    )  # moments split
    assert all(
        h["weights"] == h["gradients"] == N // 2 and h["optimizer"] == N for h in fsdp
    )  # all halved


# ---- expert parallelism -----------------------------------------------------------------------


@pytest.mark.slow
def test_expert_parallel_equals_the_moe_layer():
    torch.manual_seed(0)
    args = (16, 32, 4, 2)  # d_model, d_mlp, n_experts, top_k
    moe = MoE(*args)
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(1))
    probe = torch.randn(24, 16, generator=torch.Generator().manual_seed(2))
    results = run_distributed(
        expert_parallel_worker, args, {k: v.clone() for k, v in moe.state_dict().items()}, x, probe
    )
    y = moe(x)
    (y * probe).sum().backward()
    torch.testing.assert_close(torch.cat([r["y"] for r in results]), y.detach())
    params = dict(moe.named_parameters())
    seen = set()
    for r in results:
        for name, g in r["grads"].items():
            torch.testing.assert_close(g, params[name].grad, msg=name)
            seen.add(name)
    assert seen == set(params)  # every expert's gradient came back from its owner
    sent = torch.tensor([r["sent"] for r in results])  # sent[a][b]: slots from rank a to rank b
    received = torch.tensor([r["received"] for r in results])
    assert torch.equal(sent.T, received) and int(sent.sum()) == 24 * 2


# ---- 1F1B and GPipe on two stages -------------------------------------------------------------


@pytest.mark.slow
def test_1f1b_and_gpipe_on_gloo():
    model = _model()
    ids = torch.randint(
        0, CONFIG.d_vocab, (4, CONFIG.n_ctx + 1), generator=torch.Generator().manual_seed(2)
    )
    x, y = ids[:, :-1], ids[:, 1:]
    results = run_distributed(PP.compare_schedules_worker, CONFIG, _state(model), x, y, 4)
    logits = model(x)
    loss = lm_loss(logits, y)
    loss.backward()
    params = dict(model.named_parameters())
    for name in PP.SCHEDULES:
        stages = [r[name] for r in results]
        assert timetable([s["log"] for s in stages]) == PP.pipeline_timetable(name, 2, 4)
        assert [s["peak_in_flight"] for s in stages] == ([4, 4] if name == "gpipe" else [2, 1])
        for s in stages:
            assert s["peak_saved_bytes"] == s["peak_in_flight"] * s["saved_bytes"][0]
            for n, g in s["grads"].items():
                torch.testing.assert_close(g, params[n].grad, msg=n)
        assert stages[-1]["loss"] == pytest.approx(loss.item(), rel=1e-6)
        torch.testing.assert_close(stages[-1]["logits"], logits.detach())
    with pytest.raises(ValueError, match="schedule"):
        PP.pipeline_timetable("interleaved", 2, 2)


@pytest.mark.slow
def test_ring_all_reduce_is_reduce_scatter_then_all_gather():
    R, n = 3, 30
    xs = torch.randn(R, n, generator=torch.Generator().manual_seed(0))
    out = run_distributed(ring_worker, xs, world_size=R)
    expected = ring_bytes_per_rank(4 * n, R)
    for o in out:
        torch.testing.assert_close(o["ring"], xs.sum(0))
        torch.testing.assert_close(o["ring"], o["all_reduce"])
        assert o["sent"] == {
            "reduce-scatter": expected["reduce-scatter"],
            "all-gather": expected["all-gather"],
        }
    assert (
        sum(o["sent"]["reduce-scatter"] for o in out) == (R - 1) * 4 * n
    )  # every chunk crosses R - 1 links
    assert ring_bytes_per_rank(100, 1)["all-reduce"] == 0
    with pytest.raises(ValueError, match="world_size"):
        ring_bytes_per_rank(100, 0)


def test_expert_parallelism_refuses_a_capacity():
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_parallel_forward(MoE(8, 16, 4, capacity_factor=1.0), torch.randn(4, 8))
