"""gptlib.mlp: activations, the DAG network, the MLP."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlib.mlp import ACTIVATIONS, MLP, dag_forward, gelu, gelu_tanh, mlp_to_dag, relu


def test_activations_known_values_and_torch_peers():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(relu(x), F.relu(x))
    torch.testing.assert_close(gelu(x), F.gelu(x))
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"))
    assert float(gelu(torch.tensor(0.0))) == 0.0
    assert float(gelu(torch.tensor(1.0, dtype=torch.float64))) == pytest.approx(0.5 * (1 + math.erf(1 / math.sqrt(2))))
    assert 1e-4 < float((gelu(x) - gelu_tanh(x)).abs().max()) < 1e-3


def test_activations_keep_dtype():
    for f in ACTIVATIONS.values():
        assert f(torch.ones(3, dtype=torch.float16)).dtype == torch.float16


def test_dag_forward_skip_connection_and_errors():
    one = torch.tensor(2.0)
    y = dag_forward({"x": one}, {("x", "h"): 1.0, ("h", "y"): 2.0, ("x", "y"): -1.0}, {"h": 0.5, "y": 1.0}, ["y"])
    assert float(y[0]) == pytest.approx(2 * 2.5 - 2 + 1)
    with pytest.raises(ValueError, match="cycle"):
        dag_forward({"x": one}, {("x", "a"): 1.0, ("a", "b"): 1.0, ("b", "a"): 1.0}, {"a": 0.0, "b": 0.0}, ["b"])
    with pytest.raises(ValueError, match="input vertex"):
        dag_forward({"x": one}, {("h", "x"): 1.0}, {"h": 0.0}, ["h"])
    with pytest.raises(ValueError, match="outputs"):
        dag_forward({"x": one}, {("x", "h"): 1.0}, {"h": 0.0}, ["x"])


def test_mlp_equals_its_dag_and_the_formula():
    torch.manual_seed(0)
    mlp = MLP(3, 5, activation="gelu")
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_()
        x = torch.randn(3)
        ins, edges, biases, outs = mlp_to_dag(mlp)
        torch.testing.assert_close(dag_forward(dict(zip(ins, x)), edges, biases, outs, activation=gelu),
                                   mlp(x[None, None])[0, 0], atol=1e-5, rtol=1e-5)
        X = torch.randn(2, 4, 3)
        torch.testing.assert_close(mlp(X), gelu(X @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out)


def test_mlp_is_position_wise_and_without_bias():
    mlp = MLP(4, 8, bias=False)
    assert mlp.b_in is None and sum(p.numel() for p in mlp.parameters()) == 2 * 4 * 8
    X = torch.randn(1, 6, 4)
    perm = torch.randperm(6)
    with torch.no_grad():
        torch.testing.assert_close(mlp(X[:, perm]), mlp(X)[:, perm])


def test_mlp_rejects_bad_arguments():
    with pytest.raises(ValueError, match="activation"):
        MLP(4, 8, activation="swish")
    with pytest.raises(ValueError, match="d_mlp"):
        MLP(4, 0)
    with pytest.raises(ValueError, match="d_model"):
        MLP(4, 8)(torch.randn(1, 2, 5))
