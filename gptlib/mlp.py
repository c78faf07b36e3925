"""Chapter 3: feed-forward networks — from a graph of neurons to the position-wise MLP.

000 section 2 defines a feed-forward network on a directed acyclic graph: every non-input vertex
v has a pre-activation z_v = sum_u w_uv a_u + b_v and an activation a_v = phi_v(z_v)
(:func:`dag_forward`). The layered, fully connected case is the MLP, affine maps with a
component-wise phi between (:func:`layered_forward`). A transformer block's MLP has one hidden
layer, MLP(X) = phi(X W_in + b_in) W_out + b_out, applied to each row (position) of X independently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embedding import init_normal_
from .runtime import check_positive_int

__all__ = [
    "relu",
    "gelu",
    "gelu_tanh",
    "Activation",
    "ACTIVATIONS",
    "dag_vertices",
    "topological_order",
    "dag_activations",
    "dag_forward",
    "bias_as_input",
    "layered_to_dag",
    "layered_forward",
    "mlp_to_dag",
    "MLP",
]


def relu(x: Tensor) -> Tensor:
    """ReLU(x) = max(x, 0), component-wise (on x's own device and dtype).

    >>> relu(torch.tensor([-1.0, 0.0, 2.0]))
    tensor([0., 0., 2.])
    """
    return torch.clamp_min(x, 0)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU, x * Phi(x) with Phi the standard normal CDF: x/2 * (1 + erf(x/sqrt 2)).

    Computed as x/2 * erfc(-x/sqrt 2), the same number without the cancellation in 1 + erf(...)
    for negative x (it keeps full relative precision in the left tail).

    >>> round(float(gelu(torch.tensor(1.0))), 4)
    0.8413
    """
    return 0.5 * x * torch.erfc(-x / math.sqrt(2.0))


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (HF's ``gelu_new``).

    >>> round(float(gelu_tanh(torch.tensor(1.0))), 4)
    0.8412
    """
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


@dataclass(frozen=True)
class Activation:
    """An activation phi twice: its ``formula`` (above) and PyTorch's ``fused`` kernel for the same
    function.

    The fused kernel evaluates phi in one pass forward and one backward instead of a chain of
    element-wise operations (GELU_tanh's formula is seven); the two agree to float rounding
    (a few ulps; Chapter 5 and the tests check). Calling an ``Activation`` applies the formula.

    >>> x = torch.linspace(-6, 6, 1001)
    >>> act = ACTIVATIONS["gelu_tanh"]
    >>> torch.equal(act(x), gelu_tanh(x)), float((act.fused(x) - act.formula(x)).abs().max()) < 1e-6
    (True, True)
    """

    formula: Callable[[Tensor], Tensor]
    fused: Callable[[Tensor], Tensor]

    def __call__(self, x: Tensor) -> Tensor:
        return self.formula(x)


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(relu, F.relu),
    "gelu": Activation(gelu, F.gelu),
    "gelu_tanh": Activation(gelu_tanh, partial(F.gelu, approximate="tanh")),
}


def _vertices_in_order(edges: dict) -> list:
    """The vertices of the edge set, in order of first appearance."""
    seen: dict = {}
    for u, v in edges:
        seen.setdefault(u, None)
        seen.setdefault(v, None)
    return list(seen)


def dag_vertices(edges: dict) -> tuple[list, list, list]:
    """Split the vertices of a DAG, given by its edges (u, v), as 000 section 2.1 does.

    Returns (input vertices: no incoming edge, hidden vertices, output vertices: no outgoing edge),
    each in order of first appearance. Every vertex lies on an edge (minimum degree >= 1).

    >>> dag_vertices({("x", "h"): 1.0, ("h", "y"): 1.0, ("x", "y"): 1.0})
    (['x'], ['h'], ['y'])
    """
    has_in = {v for _, v in edges}
    has_out = {u for u, _ in edges}
    order = _vertices_in_order(edges)
    ins = [v for v in order if v not in has_in]
    outs = [v for v in order if v not in has_out]
    hidden = [v for v in order if v in has_in and v in has_out]
    return ins, hidden, outs


def topological_order(edges: dict) -> list:
    """The vertices ordered so that every edge u -> v has u before v (Kahn's algorithm).

    >>> topological_order({("h", "y"): 1.0, ("x", "h"): 1.0})
    ['x', 'h', 'y']
    """
    if not edges:
        raise ValueError("edges must not be empty")
    order = _vertices_in_order(edges)
    indegree = {v: 0 for v in order}
    successors: dict = {v: [] for v in order}
    for u, v in edges:
        indegree[v] += 1
        successors[u].append(v)
    ready = [v for v in order if indegree[v] == 0]
    result = []
    while ready:
        u = ready.pop(0)
        result.append(u)
        for v in successors[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    if len(result) != len(order):
        stuck = [v for v in order if indegree[v] > 0]
        raise ValueError(f"edges contain a cycle: no topological order reaches {stuck}")
    return result


def dag_activations(
    edges: dict,
    biases: dict,
    inputs: dict,
    activation: Callable[[Tensor], Tensor] | dict = relu,
) -> tuple[dict, dict]:
    """Pre-activations z and activations a of every vertex of a feed-forward network (000
    (2.1)-(2.2)).

    ``edges`` maps (u, v) to the weight w_uv, ``biases`` maps every non-input vertex v to b_v,
    ``inputs`` gives the value a_u of every input vertex, ``activation`` is phi (the same at every
    hidden vertex) or a dict hidden vertex -> phi_v. In a topological order,

        z_v = sum_{u -> v} w_uv a_u + b_v,   a_v = phi_v(z_v)  (hidden v),   a_v = z_v  (output v).

    Values may be tensors of any one shape, e.g. (N,) to push N inputs through at once.

    >>> edges = {("x", "h"): 2.0, ("h", "y"): 3.0}
    >>> z, a = dag_activations(edges, {"h": -1.0, "y": 0.0}, {"x": 0.25})
    >>> float(z["h"]), float(a["h"]), float(z["y"])
    (-0.5, 0.0, 0.0)
    """
    order = topological_order(edges)
    ins, hidden, outs = dag_vertices(edges)
    if set(inputs) != set(ins):
        raise ValueError(
            f"inputs must give a value to exactly the input vertices {ins}, got {list(inputs)}"
        )
    if set(biases) != set(hidden) | set(outs):
        raise ValueError(
            f"biases must give a bias to exactly the non-input vertices {hidden + outs}, got "
            f"{list(biases)}"
        )
    if isinstance(activation, dict) and not set(hidden) <= set(activation):
        raise ValueError(f"activation must name a function for every hidden vertex {hidden}")
    is_hidden = set(hidden)
    incoming: dict = {v: [] for v in order}
    for (u, v), w in edges.items():
        incoming[v].append((u, w))
    z: dict = {}
    a: dict = {u: torch.as_tensor(inputs[u]) for u in ins}
    for v in order:
        if v in a:
            continue  # an input vertex
        z[v] = sum(w * a[u] for u, w in incoming[v]) + biases[v]  # (2.1) pre-activation
        if v in is_hidden:
            phi = activation[v] if isinstance(activation, dict) else activation
            a[v] = phi(z[v])  # (2.2) activation
        else:
            a[v] = z[v]  # an output vertex: the network outputs its pre-activation
    return z, a


def dag_forward(
    edges: dict,
    biases: dict,
    inputs: dict,
    activation: Callable[[Tensor], Tensor] | dict = relu,
    outputs: list | None = None,
) -> Tensor:
    """The function a feed-forward network computes: the pre-activations of its output vertices.

    See :func:`dag_activations` for the arguments. ``outputs`` fixes the order of the output
    vertices (default: order of first appearance); the result stacks them on a last axis, (...,
    n_out).

    >>> one = torch.tensor(1.0)
    >>> dag_forward({("x", "h"): 2.0, ("h", "y"): 3.0, ("x", "y"): 1.0},
    ...             {"h": -1.0, "y": 0.0}, {"x": one})  # y = 3 relu(2x - 1) + x
    tensor([4.])
    """
    z, _ = dag_activations(edges, biases, inputs, activation)
    outs = dag_vertices(edges)[2]
    if outputs is None:
        outputs = outs
    elif len(outputs) != len(outs) or set(outputs) != set(outs):
        raise ValueError(f"outputs must list the output vertices {outs}, got {list(outputs)}")
    return torch.stack([torch.as_tensor(z[v]) for v in outputs], dim=-1)  # (..., n_out)


def bias_as_input(edges: dict, biases: dict, one="1") -> tuple[dict, dict]:
    """Remark 2.1 of 000: biases simulated by a constant input vertex ``one`` (fed the value 1).

    Returns new (edges, biases): an edge one -> v of weight b_v for every vertex with a bias, and
    all biases zero. Feed ``inputs | {one: 1.0}`` to :func:`dag_forward` to get the same function.

    >>> bias_as_input({("x", "y"): 2.0}, {"y": 0.5})
    ({('x', 'y'): 2.0, ('1', 'y'): 0.5}, {'y': 0.0})
    """
    if any(one in e for e in edges):
        raise ValueError(f"one={one!r} is already a vertex of edges")
    new_edges = dict(edges)
    new_edges.update({(one, v): b for v, b in biases.items()})
    return new_edges, {v: 0.0 for v in biases}


def layered_to_dag(weights: list, biases: list) -> tuple[dict, dict, list, list]:
    """The DAG of a fully connected layered MLP (000 section 2.2) with weight matrices W^(l).

    Vertex (l, j) is unit j of layer l (layer 0: the inputs); edge (l-1, i) -> (l, j) has weight
    W^(l)[i, j] (row-vector convention, W^(l) of shape (n_{l-1}, n_l)) and (l, j) the bias b^(l)[j]
    (0 where ``biases[l-1]`` is None). Returns (edges, biases, input vertices, output vertices).

    >>> edges, b, ins, outs = layered_to_dag([torch.ones(2, 1)], [None])
    >>> ins, outs, len(edges)
    ([(0, 0), (0, 1)], [(1, 0)], 2)
    """
    if not weights:
        raise ValueError("weights must hold at least one matrix")
    if len(biases) != len(weights):
        raise ValueError(
            f"biases must have one entry per weight matrix ({len(weights)}), got {len(biases)}"
        )
    edges: dict = {}
    bias: dict = {}
    for l, (W, b) in enumerate(zip(weights, biases), start=1):
        if W.dim() != 2 or (l > 1 and W.shape[0] != weights[l - 2].shape[1]):
            raise ValueError(
                f"weights[{l - 1}] has shape {tuple(W.shape)}, which does not follow the layer "
                "before"
            )
        if b is not None and tuple(b.shape) != (W.shape[1],):
            raise ValueError(
                f"biases[{l - 1}] must have shape ({W.shape[1]},), got {tuple(b.shape)}"
            )
        n_in, n_out = W.shape
        edges.update({((l - 1, i), (l, j)): W[i, j] for i in range(n_in) for j in range(n_out)})
        bias.update({(l, j): (b[j] if b is not None else 0.0) for j in range(n_out)})
    L = len(weights)
    return (
        edges,
        bias,
        [(0, i) for i in range(weights[0].shape[0])],
        [(L, j) for j in range(weights[-1].shape[1])],
    )


def layered_forward(
    x: Tensor, weights: list, biases: list, activation: Callable[[Tensor], Tensor] = relu
) -> Tensor:
    """A layered MLP in matrix form, 000 (2.5)-(2.7): z^(l) = a^(l-1) W^(l) + b^(l), a^(l) =
    phi(z^(l)).

    x has shape (..., n_0); the result is the last pre-activation z^(L), shape (..., n_L).

    >>> weights, biases = [torch.eye(2), torch.ones(2, 1)], [None, torch.tensor([0.5])]
    >>> layered_forward(torch.tensor([[1.0, -2.0]]), weights, biases)
    tensor([[1.5000]])
    """
    if len(biases) != len(weights):
        raise ValueError(
            f"biases must have one entry per weight matrix ({len(weights)}), got {len(biases)}"
        )
    a = x
    for l, (W, b) in enumerate(zip(weights, biases), start=1):
        if a.shape[-1] != W.shape[0]:
            raise ValueError(
                f"weights[{l - 1}] expects {W.shape[0]} inputs, got shape {tuple(a.shape)}"
            )
        z = a @ W if b is None else a @ W + b  # (..., n_l) pre-activation
        a = activation(z) if l < len(weights) else z
    return a


def mlp_to_dag(mlp: MLP) -> tuple[dict, dict, list, list]:
    """The DAG of a transformer MLP: :func:`layered_to_dag` of [W_in, W_out], [b_in, b_out]."""
    return layered_to_dag([mlp.W_in, mlp.W_out], [mlp.b_in, mlp.b_out])


class MLP(nn.Module):
    """Position-wise feed-forward layer: X -> phi(X W_in + b_in) W_out + b_out.

    Shapes: W_in (d_model, d_mlp), b_in (d_mlp,), W_out (d_mlp, d_model), b_out (d_model,);
    ``activation`` is a key of :data:`ACTIVATIONS` (GPT-2: "gelu_tanh"); ``bias=False`` drops b_in,
    b_out.
    ``fused`` (default ``True``) evaluates phi with PyTorch's fused kernel (:class:`Activation`),
    ``False`` with the formula; it may be switched at any time, and ``phi`` follows it.

    >>> mlp = MLP(4, 16, activation="relu")
    >>> X = torch.randn(2, 3, 4)  # (B, T, d_model)
    >>> torch.allclose(mlp(X), relu(X @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out)
    True
    """

    def __init__(
        self,
        d_model: int,
        d_mlp: int,
        activation: str = "gelu_tanh",
        bias: bool = True,
        fused: bool = True,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_mlp", d_mlp)
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        for name, value in (("bias", bias), ("fused", fused)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.d_model, self.d_mlp, self.activation, self.fused = d_model, d_mlp, activation, fused
        self.W_in = nn.Parameter(torch.empty(d_model, d_mlp))
        self.W_out = nn.Parameter(torch.empty(d_mlp, d_model))
        self.b_in = nn.Parameter(torch.zeros(d_mlp)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(d_model)) if bias else None
        init_normal_(self.W_in, 0.02)
        init_normal_(self.W_out, 0.02)

    @property
    def phi(self) -> Callable[[Tensor], Tensor]:
        """The activation as evaluated now: the fused kernel or the formula of
        :data:`ACTIVATIONS`."""
        act = ACTIVATIONS[self.activation]
        return act.fused if self.fused else act.formula

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.d_model,):
            raise ValueError(f"x must end in d_model={self.d_model}, got shape {tuple(x.shape)}")
        shape = x.shape
        x2 = x.reshape(-1, self.d_model)  # (B*T, d_model): the layer acts row by row
        h = (
            x2 @ self.W_in if self.b_in is None else torch.addmm(self.b_in, x2, self.W_in)
        )  # pre-activations
        h = self.phi(h)  # (B*T, d_mlp): activations
        y = (
            h @ self.W_out if self.b_out is None else torch.addmm(self.b_out, h, self.W_out)
        )  # (B*T, d_model)
        return y.view(*shape[:-1], self.d_model)  # (B, T, d_model)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_mlp={self.d_mlp}, activation={self.activation!r}, "
            f"bias={self.b_in is not None}, fused={self.fused}"
        )
