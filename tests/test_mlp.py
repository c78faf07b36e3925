"""gptlib.mlp: activations, the DAG network, layered MLPs, the transformer MLP."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlib.mlp import (
    ACTIVATIONS,
    MLP,
    bias_as_input,
    dag_activations,
    dag_forward,
    dag_vertices,
    gelu,
    gelu_tanh,
    layered_forward,
    layered_to_dag,
    mlp_to_dag,
    relu,
    topological_order,
)


def test_activations_known_values_and_torch_peers():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert torch.equal(relu(x), F.relu(x))
    torch.testing.assert_close(gelu(x), F.gelu(x))
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"))
    assert float(gelu(torch.tensor(0.0))) == 0.0
    assert float(gelu(torch.tensor(1.0, dtype=torch.float64))) == pytest.approx(
        0.5 * (1 + math.erf(1 / math.sqrt(2)))
    )
    c = math.sqrt(2 / math.pi) * (1 + 0.044715)
    assert float(gelu_tanh(torch.tensor(1.0, dtype=torch.float64))) == pytest.approx(
        0.5 * (1 + math.tanh(c))
    )
    assert relu(torch.tensor([-2.0, 0.0, 3.0])).tolist() == [0.0, 0.0, 3.0]
    assert 4e-4 < float((gelu(x) - gelu_tanh(x)).abs().max()) < 5e-4


def test_gelu_tanh_is_bit_identical_to_hf_gelu_new():
    activations = pytest.importorskip("transformers.activations")
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 4
    assert torch.equal(gelu_tanh(x), activations.ACT2FN["gelu_new"](x))
    torch.testing.assert_close(gelu(x), activations.ACT2FN["gelu"](x), atol=2e-6, rtol=0)


def test_gelu_keeps_relative_precision_in_the_left_tail():
    x = torch.linspace(-12, -3, 200)
    exact = 0.5 * x.double() * torch.erfc(-x.double() / math.sqrt(2))
    rel = ((gelu(x).double() - exact) / exact).abs().max()
    assert float(rel) < 1e-5
    assert float(gelu(torch.tensor(-10.0))) < 0  # 1 + erf(-10/sqrt 2) rounds to 0 in float32


def test_activations_keep_dtype_and_relu_keeps_integers():
    for f in ACTIVATIONS.values():
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            assert f(torch.ones(3, dtype=dtype)).dtype == dtype
    assert (
        relu(torch.tensor([-3, 4])).tolist() == [0, 4]
        and relu(torch.tensor([-3, 4])).dtype == torch.int64
    )


def test_dag_vertices_and_topological_order():
    edges = {("h", "y"): 1.0, ("x1", "h"): 1.0, ("x2", "h"): 1.0, ("x2", "y"): 1.0, ("h", "z"): 1.0}
    assert dag_vertices(edges) == (["x1", "x2"], ["h"], ["y", "z"])
    order = topological_order(edges)
    assert all(order.index(u) < order.index(v) for u, v in edges)
    with pytest.raises(ValueError, match="cycle"):
        topological_order({("x", "a"): 1.0, ("a", "b"): 1.0, ("b", "a"): 1.0})
    with pytest.raises(ValueError, match="edges"):
        topological_order({})


def test_dag_forward_skip_connection_and_known_value():
    x = torch.tensor(2.0)
    edges = {("x", "h"): 1.0, ("h", "y"): 2.0, ("x", "y"): -1.0}
    y = dag_forward(edges, {"h": 0.5, "y": 1.0}, {"x": x})
    assert y.tolist() == [2 * 2.5 - 2 + 1]
    z, a = dag_activations(edges, {"h": -5.0, "y": 1.0}, {"x": x})
    assert float(z["h"]) == -3.0 and float(a["h"]) == 0.0 and float(a["y"]) == float(z["y"]) == -1.0


def test_dag_forward_per_vertex_activation_batch_and_dtype():
    edges = {("x", "h1"): 1.0, ("x", "h2"): 1.0, ("h1", "y"): 1.0, ("h2", "y"): 1.0}
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)  # a batch of three inputs
    y = dag_forward(
        edges, {"h1": 0.0, "h2": 0.0, "y": 0.0}, {"x": x}, activation={"h1": relu, "h2": torch.tanh}
    )
    torch.testing.assert_close(y, (relu(x) + torch.tanh(x))[:, None])
    assert y.shape == (3, 1) and y.dtype == torch.float64


def test_dag_forward_rejects_bad_input():
    x = torch.tensor(1.0)
    edges = {("x", "h"): 1.0, ("h", "y"): 1.0}
    with pytest.raises(ValueError, match="cycle"):
        dag_forward(
            {("x", "a"): 1.0, ("a", "b"): 1.0, ("b", "a"): 1.0, ("b", "y"): 1.0},
            {"a": 0.0, "b": 0.0, "y": 0.0},
            {"x": x},
        )
    with pytest.raises(ValueError, match="inputs"):
        dag_forward(edges, {"h": 0.0, "y": 0.0}, {"h": x})
    with pytest.raises(ValueError, match="biases"):
        dag_forward(edges, {"h": 0.0}, {"x": x})
    with pytest.raises(ValueError, match="biases"):
        dag_forward(edges, {"x": 0.0, "h": 0.0, "y": 0.0}, {"x": x})
    with pytest.raises(ValueError, match="activation"):
        dag_forward(edges, {"h": 0.0, "y": 0.0}, {"x": x}, activation={"y": relu})
    with pytest.raises(ValueError, match="outputs"):
        dag_forward(edges, {"h": 0.0, "y": 0.0}, {"x": x}, outputs=["h"])


def test_bias_as_input_gives_the_same_function():
    torch.manual_seed(0)
    W1, b1, W2, b2 = torch.randn(3, 4), torch.randn(4), torch.randn(4, 2), torch.randn(2)
    edges, biases, ins, outs = layered_to_dag([W1, W2], [b1, b2])
    x = torch.randn(3)
    edges1, zeros = bias_as_input(edges, biases, one="one")
    assert all(b == 0.0 for b in zeros.values()) and len(edges1) == len(edges) + 4 + 2
    y0 = dag_forward(edges, biases, dict(zip(ins, x)), outputs=outs)
    y1 = dag_forward(edges1, zeros, dict(zip(ins, x)) | {"one": torch.tensor(1.0)}, outputs=outs)
    torch.testing.assert_close(y0, y1)
    with pytest.raises(ValueError, match="one"):
        bias_as_input(edges, biases, one=(0, 0))


def test_layered_to_dag_equals_layered_forward():
    torch.manual_seed(0)
    Ws = [
        torch.randn(3, 5, dtype=torch.float64),
        torch.randn(5, 4, dtype=torch.float64),
        torch.randn(4, 2, dtype=torch.float64),
    ]
    bs = [torch.randn(5, dtype=torch.float64), None, torch.randn(2, dtype=torch.float64)]
    edges, biases, ins, outs = layered_to_dag(Ws, bs)
    assert len(edges) == 3 * 5 + 5 * 4 + 4 * 2 and len(biases) == 5 + 4 + 2
    assert dag_vertices(edges)[0] == ins and dag_vertices(edges)[2] == outs
    X = torch.randn(7, 3, dtype=torch.float64)
    by_graph = dag_forward(
        edges, biases, {v: X[:, i] for i, v in enumerate(ins)}, activation=gelu, outputs=outs
    )
    torch.testing.assert_close(by_graph, layered_forward(X, Ws, bs, activation=gelu))
    by_hand = gelu(gelu(X @ Ws[0] + bs[0]) @ Ws[1]) @ Ws[2] + bs[2]
    torch.testing.assert_close(layered_forward(X, Ws, bs, activation=gelu), by_hand)


def test_layered_rejects_bad_shapes():
    with pytest.raises(ValueError, match="weights"):
        layered_to_dag([], [])
    with pytest.raises(ValueError, match="biases"):
        layered_to_dag([torch.ones(2, 3)], [])
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        layered_to_dag([torch.ones(2, 3), torch.ones(4, 1)], [None, None])
    with pytest.raises(ValueError, match=r"biases\[0\]"):
        layered_to_dag([torch.ones(2, 3)], [torch.ones(2)])
    with pytest.raises(ValueError, match=r"weights\[0\]"):
        layered_forward(torch.ones(5, 3), [torch.ones(2, 3)], [None])
    with pytest.raises(ValueError, match="biases"):
        layered_forward(torch.ones(5, 2), [torch.ones(2, 3)], [])


def test_mlp_equals_its_dag_and_the_formula():
    torch.manual_seed(0)
    mlp = MLP(3, 5, activation="gelu")
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_()
        x = torch.randn(3)
        edges, biases, ins, outs = mlp_to_dag(mlp)
        torch.testing.assert_close(
            dag_forward(edges, biases, dict(zip(ins, x)), activation=gelu, outputs=outs),
            mlp(x[None, None])[0, 0],
            atol=1e-5,
            rtol=1e-5,
        )
        X = torch.randn(2, 4, 3)
        torch.testing.assert_close(mlp(X), gelu(X @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out)
        torch.testing.assert_close(
            mlp(X), layered_forward(X, [mlp.W_in, mlp.W_out], [mlp.b_in, mlp.b_out], gelu)
        )


def test_mlp_matches_torch_sequential_peer():
    torch.manual_seed(0)
    mlp = MLP(6, 24)  # gelu_tanh, GPT-2's
    peer = torch.nn.Sequential(
        torch.nn.Linear(6, 24), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(24, 6)
    )
    with torch.no_grad():
        peer[0].weight.copy_(mlp.W_in.T)
        peer[0].bias.normal_()
        mlp.b_in.copy_(peer[0].bias)
        peer[2].weight.copy_(mlp.W_out.T)
        peer[2].bias.normal_()
        mlp.b_out.copy_(peer[2].bias)
        X = torch.randn(3, 5, 6)
        torch.testing.assert_close(mlp(X), peer(X))


def test_mlp_is_position_wise_and_without_bias():
    mlp = MLP(4, 8, bias=False)
    assert mlp.b_in is None and sum(p.numel() for p in mlp.parameters()) == 2 * 4 * 8
    X = torch.randn(1, 6, 4)
    perm = torch.randperm(6)
    with torch.no_grad():
        torch.testing.assert_close(mlp(X[:, perm]), mlp(X)[:, perm])
        torch.testing.assert_close(
            mlp(X), torch.cat([mlp(X[:, t : t + 1]) for t in range(6)], dim=1)
        )
    assert mlp(torch.randn(4)).shape == (4,)


def test_mlp_rejects_bad_arguments():
    with pytest.raises(ValueError, match="activation"):
        MLP(4, 8, activation="swish")
    with pytest.raises(ValueError, match="d_mlp"):
        MLP(4, 0)
    with pytest.raises(ValueError, match="d_model"):
        MLP(0, 8)
    with pytest.raises(ValueError, match="d_model"):
        MLP(4, 8)(torch.randn(1, 2, 5))
    with pytest.raises(ValueError, match="d_model"):
        MLP(4, 8)(torch.tensor(1.0))


def test_mlp_fused_switch_picks_the_kernel_of_the_one_table():
    from gptlib.mlp import ACTIVATIONS, MLP

    torch.manual_seed(0)
    fused, formula = MLP(8, 32), MLP(8, 32, fused=False)  # fused, the kernel, is the default
    formula.load_state_dict(fused.state_dict())
    assert (
        formula.phi is ACTIVATIONS["gelu_tanh"].formula
        and fused.phi is ACTIVATIONS["gelu_tanh"].fused
    )
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(fused(x), formula(x), atol=1e-6, rtol=1e-6)
    fused.fused = False  # a switch, read at every call
    assert fused.phi is ACTIVATIONS["gelu_tanh"].formula and torch.equal(fused(x), formula(x))
    for name, act in ACTIVATIONS.items():
        assert torch.equal(act(x), act.formula(x)), name


def test_mlp_switches_must_be_bools():
    with pytest.raises(ValueError, match="bias"):
        MLP(4, 8, bias=1)
    with pytest.raises(ValueError, match="fused"):
        MLP(4, 8, fused="no")
