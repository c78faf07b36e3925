"""Chapter 3: feed-forward networks — activations and the position-wise MLP.

The MLP of a transformer block is two affine maps with a component-wise activation between:
MLP(X) = phi(X W_in + b_in) W_out + b_out, applied to each row (position) of X independently.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

__all__ = ["relu", "gelu", "gelu_tanh", "ACTIVATIONS", "dag_forward", "mlp_to_dag", "MLP"]


def relu(x: Tensor) -> Tensor:
    """ReLU(x) = max(x, 0), component-wise (on x's own device and dtype).

    >>> relu(torch.tensor([-1.0, 0.0, 2.0]))
    tensor([0., 0., 2.])
    """
    return torch.clamp_min(x, 0)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU, x * Phi(x) with Phi the standard normal CDF: x/2 * (1 + erf(x/sqrt 2)).

    >>> round(float(gelu(torch.tensor(1.0))), 4)
    0.8413
    """
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (HF's ``gelu_new``).

    >>> round(float(gelu_tanh(torch.tensor(1.0))), 4)
    0.8412
    """
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


def dag_forward(
    inputs: dict,
    edges: dict,
    biases: dict,
    outputs: list,
    activation: Callable[[Tensor], Tensor] | dict = relu,
) -> Tensor:
    """A feed-forward network as a DAG (000, section 2.1), evaluated vertex by vertex.

    ``inputs`` maps each input vertex to its value; ``edges`` maps (u, v) to the weight w_uv;
    ``biases`` maps every other vertex v to b_v. At a non-input vertex the *pre-activation* is
    z_v = sum_{u -> v} w_uv a_u + b_v and the *activation* is a_v = phi_v(z_v); the network's
    output is the pre-activations of the ``outputs``. ``activation`` is one function or a dict
    vertex -> function. Vertices are processed in a topological order; a cycle is an error.

    >>> one = torch.tensor(1.0)
    >>> dag_forward({"x": one}, {("x", "h"): 2.0, ("h", "y"): 3.0, ("x", "y"): 1.0},
    ...             {"h": -1.0, "y": 0.0}, ["y"])  # y = 3 relu(2x - 1) + x
    tensor([4.])
    """
    succ: dict = {}
    indeg: dict = {v: 0 for v in list(inputs) + list(biases)}
    for (u, v) in edges:
        if u not in indeg or v not in indeg:
            raise ValueError(f"edges mention vertex {u if u not in indeg else v!r}, which has no input value or bias")
        if v in inputs:
            raise ValueError(f"edges must not enter the input vertex {v!r}")
        succ.setdefault(u, []).append(v)
        indeg[v] += 1
    missing = [v for v in outputs if v not in biases]
    if missing:
        raise ValueError(f"outputs must be non-input vertices with a bias, got {missing}")
    a = dict(inputs)  # activations
    z = {}  # pre-activations
    ready = [v for v in inputs]
    done = 0
    while ready:
        u = ready.pop(0)
        done += 1
        if u not in inputs:
            z[u] = biases[u] + sum(w * a[p] for (p, q), w in edges.items() if q == u)
            phi = activation[u] if isinstance(activation, dict) else activation
            a[u] = phi(torch.as_tensor(z[u]))
        for v in succ.get(u, []):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if done != len(indeg):
        raise ValueError("edges contain a cycle (or a vertex no input reaches)")
    return torch.stack([torch.as_tensor(z[v], dtype=torch.float32) for v in outputs])


def mlp_to_dag(mlp: "MLP") -> tuple[list, dict, dict, list]:
    """The DAG of a one-hidden-layer MLP: vertices ("in", i), ("hid", j), ("out", k).

    Returns (input vertices, edges, biases, output vertices) for :func:`dag_forward`;
    w_{(in,i),(hid,j)} = W_in[i, j] and w_{(hid,j),(out,k)} = W_out[j, k].
    """
    ins = [("in", i) for i in range(mlp.d_model)]
    outs = [("out", k) for k in range(mlp.d_model)]
    edges = {(("in", i), ("hid", j)): mlp.W_in[i, j] for i in range(mlp.d_model) for j in range(mlp.d_mlp)}
    edges.update({(("hid", j), ("out", k)): mlp.W_out[j, k] for j in range(mlp.d_mlp) for k in range(mlp.d_model)})
    zero = torch.zeros(())
    biases = {("hid", j): (mlp.b_in[j] if mlp.b_in is not None else zero) for j in range(mlp.d_mlp)}
    biases.update({("out", k): (mlp.b_out[k] if mlp.b_out is not None else zero) for k in range(mlp.d_model)})
    return ins, edges, biases, outs


class MLP(nn.Module):
    """Position-wise feed-forward layer: X -> phi(X W_in + b_in) W_out + b_out.

    Shapes: W_in (d_model, d_mlp), b_in (d_mlp,), W_out (d_mlp, d_model), b_out (d_model,).
    """

    def __init__(self, d_model: int, d_mlp: int, activation: str = "gelu_tanh", bias: bool = True):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {d_model}")
        if d_mlp < 1:
            raise ValueError(f"d_mlp must be >= 1, got {d_mlp}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.d_model, self.d_mlp, self.activation = d_model, d_mlp, activation
        self.phi = ACTIVATIONS[activation]
        self.W_in = nn.Parameter(torch.empty(d_model, d_mlp))
        self.W_out = nn.Parameter(torch.empty(d_mlp, d_model))
        self.b_in = nn.Parameter(torch.zeros(d_mlp)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(d_model)) if bias else None
        nn.init.normal_(self.W_in, std=0.02)
        nn.init.normal_(self.W_out, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must end in d_model={self.d_model}, got shape {tuple(x.shape)}")
        shape = x.shape
        x2 = x.reshape(-1, self.d_model)  # (B*T, d_model): the layer acts row by row
        h = x2 @ self.W_in if self.b_in is None else torch.addmm(self.b_in, x2, self.W_in)  # pre-activations
        h = self.phi(h)  # (B*T, d_mlp): activations
        y = h @ self.W_out if self.b_out is None else torch.addmm(self.b_out, h, self.W_out)  # (B*T, d_model)
        return y.view(*shape[:-1], self.d_model)
