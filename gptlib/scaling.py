"""Chapter 11: scaling laws — the loss as a power law in the parameter count, and Chinchilla's rule.

    L(N) = E + A / N^alpha         (Kaplan et al. 2020; E is the loss no model size removes)
    C ~ 6 N D,  D_opt ~ 20 N_opt   (Hoffmann et al. 2022, "Chinchilla": tokens ~ 20 per parameter)

N counts the parameters that are not embeddings (W_E, W_pos), as Kaplan et al. do: at the book's
sizes the embedding table is most of the model but does no per-token arithmetic beyond a lookup.
The fit is least squares in (E, A, alpha): for a fixed alpha the model is linear in (E, A), solved
exactly, and alpha is found by a grid and a golden-section search (variable projection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from torch import nn

__all__ = ["non_embedding_parameters", "PowerLaw", "fit_power_law", "CHINCHILLA_TOKENS_PER_PARAM", "compute_optimal"]

CHINCHILLA_TOKENS_PER_PARAM = 20


def non_embedding_parameters(model: nn.Module) -> int:
    """N of the scaling laws: the model's parameters without the token and position embeddings.

    For a GPT with tied weights this is n_layers (4 d_model d_attn + 2 d_model d_mlp + biases and
    LayerNorms) + 2 d_model (LN_f).

    >>> from gptlib.model import GPT, GPTConfig
    >>> non_embedding_parameters(GPT(GPTConfig.preset("tiny")))  # 2 (12 * 64^2 + 13 * 64) + 2 * 64
    100096
    """
    if not all(hasattr(model, a) for a in ("embed", "pos", "num_parameters")):
        raise ValueError(f"model must be a gptlib GPT, got {type(model).__name__}")
    skip = {id(p) for p in list(model.embed.parameters()) + list(model.pos.parameters())}
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in skip)


@dataclass(frozen=True)
class PowerLaw:
    """L(N) = E + A / N^alpha.

    >>> round(PowerLaw(E=1.0, A=8.0, alpha=0.5)(16.0), 4)
    3.0
    """

    E: float
    A: float
    alpha: float

    def __call__(self, N: float) -> float:
        return self.E + self.A * N ** (-self.alpha)


def _linear_fit(N: Sequence[float], L: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """Least squares E, A for a fixed alpha, and the sum of squared residuals."""
    x = [n ** (-alpha) for n in N]
    n = len(x)
    mx, my = sum(x) / n, sum(L) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    A = sum((xi - mx) * (yi - my) for xi, yi in zip(x, L)) / sxx if sxx > 0 else 0.0
    E = my - A * mx
    return E, A, sum((E + A * xi - yi) ** 2 for xi, yi in zip(x, L))


def fit_power_law(N: Sequence[float], L: Sequence[float], alpha_range: tuple[float, float] = (0.01, 2.0)) -> PowerLaw:
    """The least-squares fit of L(N) = E + A / N^alpha to measured losses, with alpha in ``alpha_range``.

    >>> true = PowerLaw(E=2.0, A=50.0, alpha=0.3)
    >>> sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    >>> fit = fit_power_law(sizes, [true(n) for n in sizes])
    >>> round(fit.E, 4), round(fit.A, 2), round(fit.alpha, 4)
    (2.0, 50.0, 0.3)
    """
    N, L = [float(n) for n in N], [float(l) for l in L]
    if len(N) != len(L):
        raise ValueError(f"N and L must have the same length, got {len(N)} and {len(L)}")
    if len(N) < 3:
        raise ValueError(f"N must hold at least 3 sizes to fit 3 parameters, got {len(N)}")
    if min(N) <= 0:
        raise ValueError(f"N must be positive, got {min(N)}")
    if len(set(N)) < 3:
        raise ValueError("N must hold at least 3 distinct sizes")
    lo, hi = alpha_range
    if not 0 < lo < hi:
        raise ValueError(f"alpha_range must satisfy 0 < low < high, got {alpha_range}")
    sse = lambda a: _linear_fit(N, L, a)[2]  # noqa: E731
    grid = [lo + (hi - lo) * i / 400 for i in range(401)]
    best = min(range(len(grid)), key=lambda i: sse(grid[i]))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2  # golden-section search on the bracket around the best grid point
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(100):
        if sse(c) < sse(d):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    alpha = (a + b) / 2
    E, A, _ = _linear_fit(N, L, alpha)
    return PowerLaw(E=E, A=A, alpha=alpha)


def compute_optimal(C: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> tuple[float, float]:
    """Chinchilla's allocation of a compute budget C = 6 N D with D = r N: N = sqrt(C / 6r), D = r N.

    >>> N, D = compute_optimal(5.76e23)  # Chinchilla's own budget: 70e9 parameters, 1.4e12 tokens
    >>> round(N / 1e9), round(D / 1e12, 1)
    (69, 1.4)
    """
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C}")
    if not tokens_per_param > 0:
        raise ValueError(f"tokens_per_param must be > 0, got {tokens_per_param}")
    N = math.sqrt(C / (6 * tokens_per_param))
    return N, tokens_per_param * N
