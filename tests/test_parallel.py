"""Chapter 10: data, tensor, pipeline and context parallelism, each against one process.

The distributed tests start real gloo process groups on 127.0.0.1 through run_distributed.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gptlib import parallel as P
from gptlib.attention import MultiHeadAttention, attention, causal_mask
from gptlib.block import Block
from gptlib.kvcache import KVCache
from gptlib.model import GPT, GPTConfig

pytestmark = pytest.mark.skipif(
    not dist.is_available(), reason="torch.distributed is not available"
)


def _model(**overrides):
    cfg = GPTConfig.preset("tiny", **overrides)
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():  # non-zero biases and LayerNorm parameters, so that each one is tested
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return cfg, model, {k: v.clone() for k, v in model.state_dict().items()}


def _batch(cfg, B=4, T=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.d_vocab, (B, T), generator=g), torch.randint(
        0, cfg.d_vocab, (B, T), generator=g
    )


def _full_grads(model, ids, targets):
    model.zero_grad()
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return logits.detach(), loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------------------------
# workers used only by the tests (module level, so the ranks' processes can import them)
# --------------------------------------------------------------------------------------------


def _rank_worker(rank, world_size, scale):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {"rank": rank, "world": world_size, "sum": t * scale}


def _failing_worker(rank, world_size, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.recv(torch.empty(1), src=1)  # would wait forever: rank 1 never sends
    return None


def _sleeping_worker(rank, world_size):
    time.sleep(600)


def _parent_worker(rank, world_size):
    return os.getppid()


# --------------------------------------------------------------------------------------------
# run_distributed: results, errors, clean-up
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_distributed_failure_cleans_up_then_the_port_works_again(tmp_path):
    port = P.free_port()
    with pytest.raises(P.DistributedError) as e:
        P.run_distributed(_failing_worker, str(tmp_path), port=port, timeout=120)
    msg = str(e.value)
    assert "rank 1" in msg and "ValueError: boom from rank 1" in msg and "Traceback" in msg
    # no child left: neither the failed rank nor rank 0, which was blocked in recv
    assert multiprocessing.active_children() == []
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # and the port is free again: a new group can be set up on it at once, and results come in
    # rank order
    out = P.run_distributed(_rank_worker, 10.0, port=port)
    assert [o["rank"] for o in out] == [0, 1]
    assert [o["world"] for o in out] == [2, 2]
    assert all(torch.equal(o["sum"], torch.tensor([30.0])) for o in out)


@pytest.mark.slow
def test_run_distributed_timeout_stops_workers():
    P.run_distributed(_rank_worker, 1.0)  # the forkserver's start (its imports) is not timed
    t0 = time.monotonic()
    with pytest.raises(P.DistributedError, match="timed out"):
        P.run_distributed(_sleeping_worker, timeout=2)
    assert time.monotonic() - t0 < 30
    assert multiprocessing.active_children() == []


def test_ranks_are_forked_from_one_server():
    # Not spawned (a fresh interpreter importing PyTorch per rank): every rank of every call is a
    # child of the same forkserver, not of this process.
    assert P.launch.START_METHOD == "forkserver"
    parents = P.run_distributed(_parent_worker) + P.run_distributed(_parent_worker)
    assert len(set(parents)) == 1 and parents[0] != os.getpid()


def test_run_distributed_rejects_bad_arguments():
    with pytest.raises(ValueError, match="fn"):
        P.run_distributed(lambda rank, ws: None)
    with pytest.raises(ValueError, match="world_size"):
        P.run_distributed(_rank_worker, 1.0, world_size=0)
    with pytest.raises(ValueError, match="backend"):
        P.run_distributed(_rank_worker, 1.0, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        P.run_distributed(_rank_worker, 1.0, timeout=0)


def test_run_distributed_checks_every_number_before_starting_a_process():
    """A bool is not a world size, a timeout is finite, a port an int in [1, 65535]; each is
    refused before any process starts (world_size=True would run one rank, a NaN timeout fail
    inside multiprocessing, a bad port kill the ranks with an error of their own)."""
    cases = [
        ({"world_size": True}, "world_size"),
        ({"world_size": 2.0}, "world_size"),
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": "5"}, "timeout"),
        ({"port": "x"}, "port"),
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"port": True}, "port"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=f"^{name} must"):
            P.run_distributed(_rank_worker, 1.0, **kwargs)
    with pytest.raises(ValueError, match="^timeout must"):
        P.run_together({"a": (_rank_worker, (1.0,))}, timeout=-1.0)
    assert multiprocessing.active_children() == []


# --------------------------------------------------------------------------------------------
# the four equivalences
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_data_parallel_equals_full_batch():
    cfg, model, state = _model()
    ids, targets = _batch(cfg)
    out = P.run_distributed(P.ddp_worker, cfg, state, ids, targets, 0.1)
    _, loss, grads = _full_grads(model, ids, targets)
    assert sum(o["loss"] for o in out) / 2 == pytest.approx(loss, rel=1e-6)
    for n, g in grads.items():
        assert torch.equal(out[0]["grads"][n], out[1]["grads"][n]), (
            n
        )  # identical after the all-reduce
        torch.testing.assert_close(out[0]["grads"][n], g)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for k, w in model.state_dict().items():
        assert torch.equal(out[0]["state"][k], out[1]["state"][k]), k
        torch.testing.assert_close(out[0]["state"][k], w)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pre_ln"])
def test_tensor_parallel_equals_unsplit(kind):
    cfg, model, state = _model(block=kind)
    x = torch.randn(2, 16, cfg.d_model, generator=torch.Generator().manual_seed(3))
    out = P.run_distributed(P.tensor_parallel_worker, cfg, state, x, 1)
    blk = model.blocks[1]
    probe = torch.linspace(-1, 1, x.numel()).view_as(x)
    for name, module in (("mlp", blk.mlp), ("attn", blk.attn), ("block", blk)):
        model.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        (y * probe).sum().backward()
        for o in out:
            torch.testing.assert_close(o[name]["y"], y.detach())
            torch.testing.assert_close(o[name]["dx"], xi.grad)
        full = dict(module.named_parameters())
        for rank, o in enumerate(out):  # each shard's gradient is its slice of the full gradient
            g = o[name]["grads"]
            mlp_name = "W_in" if name == "mlp" else "mlp.W_in" if name == "block" else None
            if mlp_name:
                torch.testing.assert_close(
                    g[mlp_name], full[mlp_name].grad[:, P.shard_range(cfg.d_mlp, rank, 2)]
                )
                out_name = mlp_name.replace("W_in", "W_out")
                torch.testing.assert_close(
                    g[out_name], full[out_name].grad[P.shard_range(cfg.d_mlp, rank, 2), :]
                )
            if name == "attn":
                cols = P.shard_range(cfg.n_heads * cfg.d_head, rank, 2)
                for w in ("W_Q", "W_K", "W_V"):
                    torch.testing.assert_close(g[w], full[w].grad[:, cols])
                torch.testing.assert_close(g["W_O"], full["W_O"].grad[cols, :])
                torch.testing.assert_close(g["b_O"], full["b_O"].grad)
            if name == "block":  # replicated LayerNorms get the whole gradient on every rank
                torch.testing.assert_close(g["ln_1.w"], full["ln_1.w"].grad)
                torch.testing.assert_close(g["ln_2.b"], full["ln_2.b"].grad)


@pytest.mark.parametrize("kind", ["pre_ln", "post_ln", "parallel"])
def test_tensor_parallel_single_process_is_the_module(kind):
    cfg, model, _ = _model(block=kind)
    x = torch.randn(1, 5, cfg.d_model, generator=torch.Generator().manual_seed(4))
    blk = model.blocks[0]
    tp = P.TensorParallelBlock(blk, 0, 1)
    assert isinstance(tp, Block) and type(tp).forward is Block.forward  # the block's own equations
    assert tp.kind == kind and tp.ln_1 is not blk.ln_1  # LayerNorms replicated: copies, not shared
    torch.testing.assert_close(tp(x), blk(x))
    assert (
        P.TensorParallelMLP(blk.mlp, 0, 1).phi is blk.mlp.phi
    )  # the same activation (fused kernel)
    with pytest.raises(ValueError, match="world_size"):
        P.TensorParallelMLP(blk.mlp, 0, 3)  # 3 does not divide d_mlp = 256


def test_tensor_parallel_attention_rejects_a_cache_and_dropout():
    cfg, model, _ = _model()
    tp = P.TensorParallelAttention(model.blocks[0].attn, 0, 1)
    x = torch.randn(1, 3, cfg.d_model)
    with pytest.raises(ValueError, match="cache"):
        tp(x, cache=KVCache(cfg.n_layers))
    with pytest.raises(ValueError, match="dropout"):
        P.TensorParallelAttention(MultiHeadAttention(cfg.d_model, cfg.n_heads, dropout=0.1), 0, 1)


@pytest.mark.parametrize("training", [False, True])
def test_pipeline_stages_compose_to_the_model(training):
    cfg, model, _ = _model(dropout=0.1)
    model.train(training)
    ids, _ = _batch(cfg)
    torch.manual_seed(11)
    expect = model(ids)
    torch.manual_seed(11)  # the same dropout masks, drawn in the same order (embedding first)
    x = model.input_stream(ids)  # stage 0
    x = P.apply_blocks(model, P.stage_layers(cfg.n_layers, 0, 2), x)
    x = P.apply_blocks(model, P.stage_layers(cfg.n_layers, 1, 2), x)
    torch.testing.assert_close(model.read_out(x), expect, rtol=0, atol=0)  # the last stage
    if training:  # dropout really acted: another seed gives other logits
        torch.manual_seed(12)
        assert not torch.equal(model(ids), expect)


@pytest.mark.slow
def test_pipeline_parallel_equals_one_process_and_measures_the_bubble():
    cfg, model, state = _model()
    ids, targets = _batch(cfg)
    out = P.run_distributed(P.pipeline_worker, cfg, state, ids, targets, 4)
    logits, loss, grads = _full_grads(model, ids, targets)
    torch.testing.assert_close(out[1]["logits"], logits)
    assert out[1]["loss"] == pytest.approx(loss, rel=1e-6)
    assert set(out[0]["grads"]) | set(out[1]["grads"]) == set(grads)
    for o in out:
        for n, g in o["grads"].items():
            torch.testing.assert_close(g, grads[n])
    grid = P.timetable([o["log"] for o in out])
    assert grid == P.gpipe_schedule(2, 4)
    assert P.bubble_fraction(grid) == pytest.approx(P.gpipe_bubble(2, 4)) == pytest.approx(0.2)


@pytest.mark.slow
def test_context_parallel_ring_attention_equals_full_attention():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 12, 8, generator=g) for _ in range(3))
    out = P.run_distributed(P.ring_attention_worker, q, k, v)
    z, _ = attention(q, k, v, causal_mask(12))
    assert [o["positions"] for o in out] == [[0, 6], [6, 12]]
    torch.testing.assert_close(torch.cat([o["z"] for o in out], dim=-2), z)
    peer = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(torch.cat([o["z"] for o in out], dim=-2), peer)


@pytest.mark.slow
def test_four_ranks_pipeline_and_ring():
    cfg, model, state = _model(n_layers=4)
    ids, targets = _batch(cfg, B=4, T=8)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
    out = P.run_together(
        {
            "pipe": (P.pipeline_worker, (cfg, state, ids, targets, 2)),
            "ring": (P.ring_attention_worker, (q, k, v)),
        },
        world_size=4,
    )
    assert list(out) == ["pipe", "ring"] and all(len(results) == 4 for results in out.values())
    logits, _, grads = _full_grads(model, ids, targets)
    torch.testing.assert_close(out["pipe"][3]["logits"], logits)
    for o in out["pipe"]:
        for n, gr in o["grads"].items():
            if n == "embed.W_E" and not o["grads"].get(n, torch.ones(1)).any():
                continue  # middle stages never touch the embedding
            torch.testing.assert_close(gr, grads[n])
    grid = P.timetable([o["log"] for o in out["pipe"]])
    assert grid == P.gpipe_schedule(4, 2)
    assert P.bubble_fraction(grid) == pytest.approx(3 / 5)
    z, _ = attention(q, k, v, causal_mask(16))
    torch.testing.assert_close(torch.cat([o["z"] for o in out["ring"]], dim=-2), z)


@pytest.mark.slow
def test_run_together_returns_what_separate_runs_return():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    out = P.run_together(
        {"sum": (_rank_worker, (10.0,)), "ring": (P.ring_attention_worker, (q, k, v))}
    )
    alone = P.run_distributed(P.ring_attention_worker, q, k, v)
    assert [o["rank"] for o in out["sum"]] == [0, 1]
    assert all(torch.equal(o["sum"], torch.tensor([30.0])) for o in out["sum"])
    for together, separate in zip(out["ring"], alone):
        assert together["positions"] == separate["positions"]
        assert torch.equal(together["z"], separate["z"])  # the same computation, bit for bit


@pytest.mark.slow
def test_run_together_names_the_failing_job_and_cleans_up(tmp_path):
    jobs = {"fine": (_rank_worker, (1.0,)), "broken": (_failing_worker, (str(tmp_path),))}
    with pytest.raises(P.DistributedError) as e:
        P.run_together(jobs, timeout=120)
    msg = str(e.value)
    assert (
        "job 'broken' (_failing_worker) failed on rank 1" in msg
        and "ValueError: boom from rank 1" in msg
    )
    assert multiprocessing.active_children() == []


def test_run_together_rejects_bad_jobs():
    with pytest.raises(ValueError, match="jobs"):
        P.run_together({})
    with pytest.raises(ValueError, match=r"jobs\['a'\] must be a pair"):
        P.run_together({"a": _rank_worker})
    with pytest.raises(ValueError, match=r"jobs\['a'\] must be a pair"):
        P.run_together({"a": (_rank_worker, 1.0)})
    with pytest.raises(ValueError, match=r"jobs\['a'\] must be a module-level function"):
        P.run_together({"a": (lambda rank, ws: None, ())})
    with pytest.raises(ValueError, match="world_size"):
        P.run_together({"a": (_rank_worker, (1.0,))}, world_size=0)


# --------------------------------------------------------------------------------------------
# pure functions (no processes)
# --------------------------------------------------------------------------------------------


def test_shard_range():
    assert [P.shard_range(6, r, 3) for r in range(3)] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert P.shard_range(5, 0, 1) == slice(0, 5)
    with pytest.raises(ValueError, match="world_size"):
        P.shard_range(5, 0, 2)
    with pytest.raises(ValueError, match="rank"):
        P.shard_range(4, 2, 2)
    with pytest.raises(ValueError, match="world_size"):
        P.shard_range(4, 0, 0)
    # floats, bools and negative sizes are refused, not turned into a float or negative slice
    for args, name in (
        ((8.0, 1, 2), "n"),
        ((-4, 1, 2), "n"),
        ((8, True, 2), "rank"),
        ((8, 0, 2.0), "world_size"),
        ((8, 0, True), "world_size"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must"):
            P.shard_range(*args)
    assert P.shard_range(0, 1, 2) == slice(0, 0)  # nothing to share: every rank gets nothing


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 16])
def test_gpipe_schedule_bubble_matches_formula(p, m):
    grid = P.gpipe_schedule(p, m)
    assert len(grid) == p and all(len(row) == 2 * (m + p - 1) for row in grid)
    for row in grid:  # every stage runs each forward and each backward exactly once
        assert sorted(op for op in row if op) == sorted(
            [f"F{j}" for j in range(m)] + [f"B{j}" for j in range(m)]
        )
    assert P.bubble_fraction(grid) == pytest.approx(P.gpipe_bubble(p, m))


def test_gpipe_errors():
    with pytest.raises(ValueError, match="n_stages"):
        P.gpipe_schedule(0, 2)
    with pytest.raises(ValueError, match="n_micro"):
        P.gpipe_schedule(2, 0)
    with pytest.raises(ValueError, match="n_stages"):
        P.gpipe_bubble(True, 4)  # a bool is not a count
    with pytest.raises(ValueError, match="stage"):
        P.stage_order("gpipe", 2, 2, 4)
    with pytest.raises(ValueError, match="grid"):
        P.bubble_fraction([])
    with pytest.raises(ValueError, match="logs"):
        P.timetable([[("F0", 0), ("F1", 0)]])
    with pytest.raises(ValueError, match="logs"):
        P.timetable([])
    assert list(P.stage_layers(6, 2, 3)) == [4, 5]


@pytest.mark.parametrize("n_blocks", [1, 2, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_blockwise_attention_equals_attention(n_blocks, causal):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g) * 3 for _ in range(3))
    z, _ = attention(q, k, v, causal_mask(8) if causal else None)
    torch.testing.assert_close(P.blockwise_attention(q, k, v, n_blocks, causal=causal), z)


def test_online_softmax_handles_fully_masked_blocks_and_large_scores():
    scores = torch.tensor([[float("-inf"), float("-inf")], [1000.0, 999.0]])
    v = torch.tensor([[1.0], [2.0]])
    state = P.online_softmax_update(None, scores, v)  # row 0 has seen nothing yet
    state = P.online_softmax_update(state, torch.tensor([[0.0, 0.0], [1000.0, 0.0]]), v)
    _, l, acc = state
    out = acc / l
    torch.testing.assert_close(out[0], torch.tensor([1.5]))
    expect = torch.softmax(torch.tensor([1000.0, 999.0, 1000.0, 0.0]), 0) @ torch.tensor(
        [1.0, 2.0, 1.0, 2.0]
    )
    torch.testing.assert_close(out[1, 0], expect)


@pytest.mark.slow
def test_fsdp_shards_the_weights_and_keeps_the_gradients():
    cfg, model, state = _model()
    ids, targets = _batch(cfg)
    out = P.run_distributed(P.fsdp_worker, cfg, state, ids, targets)
    _, _, grads = _full_grads(model, ids, targets)
    assert sum(o["held"] for o in out) == model.num_parameters()
    assert all(o["held"] == model.num_parameters() // 2 for o in out)
    for n, g in grads.items():
        torch.testing.assert_close(out[0]["grads"][n], g)
        assert torch.equal(out[0]["grads"][n], out[1]["grads"][n])
