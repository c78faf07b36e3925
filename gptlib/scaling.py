"""Chapter 11: scaling laws — the loss as a power of the parameter count, and the compute-optimal
split.

    Kaplan et al. 2020     L(N) = (N_c / N)^alpha_N, no constant: models trained on enough data
                           (early-stopped), 768 to 1.5e9 non-embedding parameters;
                           alpha_N ~ 0.076, N_c ~ 8.8e13                         (:data:`KAPLAN`)
    with a floor E         L(N) = E + c_N / N^alpha_N: the form fitted here (:func:`fit_power_law`);
                           at a fixed number of tokens, E holds what more data would still remove
    Hoffmann et al. 2022   L(N, n_tok) = E + c_N / N^alpha_N + c_tok / n_tok^alpha_tok
    ("Chinchilla")         (:class:`LossSurface`; Approach 3's fit: :data:`CHINCHILLA_APPROACH_3`)
                           minimised at a fixed C = 6 N n_tok (:meth:`LossSurface.optimum`);
                           Approaches 1 and 2 give N_opt ~ C^0.50 and about 20 tokens per
                           parameter (:func:`compute_optimal`)

The papers' symbols: Chinchilla's A, B, alpha, beta are c_N, c_tok, alpha_N, alpha_tok here, and
its D is n_tok (the book's A is an attention pattern, B a batch, beta a KL weight, D a data set).
N counts the parameters that are not embeddings (W_E, W_pos), as Kaplan et al. do: at the book's
sizes the embedding table is most of the model but does no per-token arithmetic beyond a lookup.
The fit is least squares in (E, c_N, alpha_N): for a fixed alpha_N the model is linear in (E, c_N),
solved exactly, and alpha_N is found by a grid and a golden-section search (variable projection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from .runtime import check_float

__all__ = [
    "non_embedding_parameters",
    "PowerLaw",
    "KAPLAN",
    "fit_power_law",
    "LossSurface",
    "CHINCHILLA_APPROACH_3",
    "CHINCHILLA_TOKENS_PER_PARAM",
    "compute_optimal",
]

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
    return sum(
        p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in skip
    )


@dataclass(frozen=True)
class PowerLaw:
    """L(N) = E + c / N^alpha; with E = 0, Kaplan's (N_c / N)^alpha with N_c = c^(1/alpha).

    >>> round(PowerLaw(E=1.0, c=8.0, alpha=0.5)(16.0), 4)
    3.0
    >>> round(PowerLaw(E=0.0, c=8.0, alpha=0.5).N_c, 4)
    64.0
    """

    E: float
    c: float
    alpha: float

    def __call__(self, N: float) -> float:
        return self.E + self.c * N ** (-self.alpha)

    @property
    def N_c(self) -> float:
        """The scale of Kaplan's form: c / N^alpha = (N_c / N)^alpha."""
        return self.c ** (1 / self.alpha)


# Kaplan et al. (2020), their eq. (1.1): L(N) = (N_c / N)^alpha_N, in nats per token
KAPLAN = PowerLaw(E=0.0, c=8.8e13**0.076, alpha=0.076)


def _linear_fit(
    N: Sequence[float], L: Sequence[float], alpha: float, floor: bool
) -> tuple[float, float, float]:
    """Least squares E, c for a fixed alpha (E = 0 without a floor), and the sum of squared
    residuals."""
    x = [n ** (-alpha) for n in N]
    if floor:
        n = len(x)
        mx, my = sum(x) / n, sum(L) / n
        sxx = sum((xi - mx) ** 2 for xi in x)
        c = sum((xi - mx) * (yi - my) for xi, yi in zip(x, L)) / sxx if sxx > 0 else 0.0
        E = my - c * mx
    else:
        E, c = 0.0, sum(xi * yi for xi, yi in zip(x, L)) / sum(xi * xi for xi in x)
    return E, c, sum((E + c * xi - yi) ** 2 for xi, yi in zip(x, L))


def fit_power_law(
    N: Sequence[float],
    L: Sequence[float],
    alpha_range: tuple[float, float] = (0.01, 2.0),
    floor: bool = True,
) -> PowerLaw:
    """The least-squares fit of L(N) = E + c / N^alpha to measured losses, with alpha in
    ``alpha_range``.

    ``floor=False`` fixes E = 0: Kaplan's form (N_c / N)^alpha.

    >>> true = PowerLaw(E=2.0, c=50.0, alpha=0.3)
    >>> sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    >>> fit = fit_power_law(sizes, [true(n) for n in sizes])
    >>> round(fit.E, 4), round(fit.c, 2), round(fit.alpha, 4)
    (2.0, 50.0, 0.3)
    >>> fit = fit_power_law(sizes, [KAPLAN(n) for n in sizes], floor=False)
    >>> fit.E, round(fit.alpha, 4), f"{fit.N_c:.2e}"
    (0.0, 0.076, '8.80e+13')
    """
    N, L = [float(n) for n in N], [float(l) for l in L]
    if len(N) != len(L):
        raise ValueError(f"N and L must have the same length, got {len(N)} and {len(L)}")
    need = 3 if floor else 2
    if len(N) < need:
        raise ValueError(
            f"N must hold at least {need} sizes to fit {need} parameters, got {len(N)}"
        )
    if min(N) <= 0:
        raise ValueError(f"N must be positive, got {min(N)}")
    if len(set(N)) < need:
        raise ValueError(f"N must hold at least {need} distinct sizes")
    lo, hi = alpha_range
    if not 0 < lo < hi:
        raise ValueError(f"alpha_range must satisfy 0 < low < high, got {alpha_range}")
    sse = lambda a: _linear_fit(N, L, a, floor)[2]  # noqa: E731
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
    E, c, _ = _linear_fit(N, L, alpha, floor)
    return PowerLaw(E=E, c=c, alpha=alpha)


@dataclass(frozen=True)
class LossSurface:
    """Chinchilla's parametric loss L(N, n_tok) = E + c_N / N^alpha_N + c_tok / n_tok^alpha_tok.

    >>> s = LossSurface(E=1.0, c_N=1.0, c_tok=1.0, alpha_N=0.5, alpha_tok=0.5)
    >>> s(4.0, 16.0)
    1.75
    >>> N, n_tok = s.optimum(6 * 1e6)  # alpha_N = alpha_tok, c_N = c_tok: N = n_tok = sqrt(C / 6)
    >>> round(N), round(n_tok)
    (1000, 1000)
    """

    E: float
    c_N: float
    c_tok: float
    alpha_N: float
    alpha_tok: float

    def __post_init__(self):
        for name in ("c_N", "c_tok", "alpha_N", "alpha_tok"):
            check_float(name, getattr(self, name), 0.0, lo_open=True)
        check_float("E", self.E)

    def __call__(self, N: float, n_tok: float) -> float:
        return self.E + self.c_N / N**self.alpha_N + self.c_tok / n_tok**self.alpha_tok

    def optimum(self, C: float) -> tuple[float, float]:
        """(N_opt, n_tok) minimising L at the compute C = 6 N n_tok: setting dL/dN = 0 along
        n_tok = C / (6N) gives N_opt = G (C/6)^(alpha_tok / (alpha_N + alpha_tok)),
        G = (alpha_N c_N / (alpha_tok c_tok))^(1 / (alpha_N + alpha_tok))."""
        check_float("C", C, 0.0, lo_open=True)
        a, b = self.alpha_N, self.alpha_tok
        N = (a * self.c_N / (b * self.c_tok)) ** (1 / (a + b)) * (C / 6) ** (b / (a + b))
        return N, C / (6 * N)


# Hoffmann et al. (2022), Approach 3 (their eq. (10)): E = 1.69, A = 406.4, B = 410.7, alpha =
# 0.34, beta = 0.28
CHINCHILLA_APPROACH_3 = LossSurface(E=1.69, c_N=406.4, c_tok=410.7, alpha_N=0.34, alpha_tok=0.28)


def compute_optimal(
    C: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM
) -> tuple[float, float]:
    """The rule of Chinchilla's Approaches 1 and 2: C = 6 N n_tok with n_tok = r N, so
    N = sqrt(C / 6r).

    >>> N, n_tok = compute_optimal(5.76e23)  # Gopher's budget; Chinchilla trained 70e9 on 1.4e12
    >>> round(N / 1e9), round(n_tok / 1e12, 1)
    (69, 1.4)
    """
    check_float("C", C, 0.0, lo_open=True)
    check_float("tokens_per_param", tokens_per_param, 0.0, lo_open=True)
    N = math.sqrt(C / (6 * tokens_per_param))
    return N, tokens_per_param * N
