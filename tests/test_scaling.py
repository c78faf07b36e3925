"""Tests for gptlib.scaling: the non-embedding parameter count, the power-law fits (with and
without a floor), Chinchilla's loss surface and its optimum, and the 20-tokens rule against the
papers' numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gptlib.model import GPT, GPTConfig
from gptlib.scaling import (
    CHINCHILLA_APPROACH_3,
    CHINCHILLA_TOKENS_PER_PARAM,
    KAPLAN,
    LossSurface,
    PowerLaw,
    compute_optimal,
    fit_power_law,
    non_embedding_parameters,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tie", [True, False])
def test_non_embedding_parameters(tie):
    c = GPTConfig(d_vocab=100, n_ctx=16, d_model=24, n_heads=3, n_layers=2, tie_weights=tie)
    model = GPT(c)
    untied_W_U = 0 if tie else c.d_model * c.d_vocab  # an untied unembedding is not an embedding
    expected = c.n_layers * (12 * c.d_model**2 + 13 * c.d_model) + 2 * c.d_model + untied_W_U
    assert non_embedding_parameters(model) == expected
    assert (
        model.num_parameters() - non_embedding_parameters(model)
        == (c.d_vocab + c.n_ctx) * c.d_model
    )
    with pytest.raises(ValueError, match="model"):
        non_embedding_parameters(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("E,c,alpha", [(1.5, 20.0, 0.1), (3.0, 400.0, 0.5), (0.0, 5.0, 1.2)])
def test_fit_recovers_a_known_law(E, c, alpha):
    law = PowerLaw(E, c, alpha)
    sizes = [3e3, 2e4, 1e5, 4e5, 2e6, 1e7]
    fit = fit_power_law(sizes, [law(n) for n in sizes])
    assert fit.alpha == pytest.approx(alpha, rel=1e-4)
    assert fit.E == pytest.approx(E, abs=1e-4 * max(1.0, abs(E)))
    assert fit.c == pytest.approx(c, rel=1e-3)


def test_fit_is_least_squares():
    sizes, losses = [1e3, 1e4, 1e5, 1e6], [6.0, 5.1, 4.7, 4.55]
    fit = fit_power_law(sizes, losses)
    sse = lambda f: sum((f(n) - l) ** 2 for n, l in zip(sizes, losses))  # noqa: E731
    for d in (-0.01, 0.01):  # nudging any parameter makes the fit worse
        for nudged in (
            PowerLaw(fit.E + d, fit.c, fit.alpha),
            PowerLaw(fit.E, fit.c * (1 + d), fit.alpha),
            PowerLaw(fit.E, fit.c, fit.alpha + d),
        ):
            assert sse(nudged) > sse(fit)


def test_fit_without_a_floor_is_kaplans_form():
    sizes = [768, 1e4, 1e6, 1.5e9]  # Kaplan et al.'s range of non-embedding parameters
    fit = fit_power_law(sizes, [KAPLAN(n) for n in sizes], floor=False)
    assert (
        fit.E == 0.0
        and fit.alpha == pytest.approx(0.076, rel=1e-4)
        and fit.N_c == pytest.approx(8.8e13, rel=1e-3)
    )
    assert KAPLAN(KAPLAN.N_c) == pytest.approx(1.0)  # (N_c / N)^alpha = 1 at N = N_c
    # least squares in (c, alpha) with E = 0: nudging either makes the fit worse
    losses = [6.0, 5.1, 4.7, 4.55]
    fit = fit_power_law(sizes, losses, floor=False)
    sse = lambda f: sum((f(n) - l) ** 2 for n, l in zip(sizes, losses))  # noqa: E731
    for d in (-0.01, 0.01):
        assert (
            sse(PowerLaw(0.0, fit.c * (1 + d), fit.alpha))
            > sse(fit)
            < sse(PowerLaw(0.0, fit.c, fit.alpha + d))
        )
    with pytest.raises(ValueError, match="at least 2"):
        fit_power_law([1], [1], floor=False)


def test_fit_arguments():
    with pytest.raises(ValueError, match="length"):
        fit_power_law([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 3"):
        fit_power_law([1, 2], [1, 2])
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([0, 2, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="distinct"):
        fit_power_law([1, 1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="alpha_range"):
        fit_power_law([1, 2, 3], [3, 2, 1], alpha_range=(1.0, 0.5))


def test_compute_optimal_is_twenty_tokens_per_parameter():
    for C in (1e18, 5.76e23, 2e25):
        N, D = compute_optimal(C)
        assert D == pytest.approx(CHINCHILLA_TOKENS_PER_PARAM * N)
        assert 6 * N * D == pytest.approx(C)
    # Chinchilla itself: Gopher's budget, 5.76e23 FLOPs, spent on 70e9 parameters and 1.4e12 tokens
    N, D = compute_optimal(5.76e23)
    assert N == pytest.approx(70e9, rel=0.02) and D == pytest.approx(1.4e12, rel=0.02)
    N, D = compute_optimal(6e20, tokens_per_param=1)
    assert (N, D) == (pytest.approx(1e10), pytest.approx(1e10))
    with pytest.raises(ValueError, match="C"):
        compute_optimal(0)
    with pytest.raises(ValueError, match="tokens_per_param"):
        compute_optimal(1e20, tokens_per_param=-1)


def test_shipped_sweep_is_consistent():
    data = json.loads((ROOT / "models" / "scaling_sweep.json").read_text())
    runs = data["runs"]
    assert len(runs) >= 4
    for r in runs:
        model = GPT(
            GPTConfig(
                d_vocab=data["d_vocab"],
                n_ctx=data["n_ctx"],
                d_model=r["d_model"],
                n_heads=r["n_heads"],
                n_layers=r["n_layers"],
            )
        )
        assert (r["params"], r["N"]) == (model.num_parameters(), non_embedding_parameters(model))
        assert math.isfinite(r["val_loss"]) and 0 < r["val_loss"] < math.log(data["d_vocab"])
    assert [r["N"] for r in runs] == sorted(r["N"] for r in runs)


def test_loss_surface_optimum_is_the_brute_force_minimum():
    surface = LossSurface(E=1.0, c_N=300.0, c_tok=500.0, alpha_N=0.4, alpha_tok=0.25)
    for C in (1e19, 1e23):
        N_opt, n_opt = surface.optimum(C)
        assert 6 * N_opt * n_opt == pytest.approx(C)
        grid = torch.logspace(2, 16, 100_001, dtype=torch.float64)
        losses = (
            surface.c_N / grid**surface.alpha_N
            + surface.c_tok / (C / (6 * grid)) ** surface.alpha_tok
        )
        assert float(grid[torch.argmin(losses)]) == pytest.approx(N_opt, rel=1e-3)
    for name in ("c_N", "alpha_tok"):
        with pytest.raises(ValueError, match=name):
            LossSurface(
                **{"E": 1.0, "c_N": 1.0, "c_tok": 1.0, "alpha_N": 0.3, "alpha_tok": 0.3}
                | {name: 0.0}
            )
    with pytest.raises(ValueError, match="C"):
        surface.optimum(-1.0)


def test_chinchilla_approach_3_tokens_per_parameter_grow_with_compute():
    # Approach 3's exponents: N_opt ~ C^(0.28/0.62), so n_tok / N ~ C^((0.34 - 0.28)/0.62) = C^0.097
    s = CHINCHILLA_APPROACH_3
    ratio = [s.optimum(C)[1] / s.optimum(C)[0] for C in (1e20, 1e25)]
    assert math.log(ratio[1] / ratio[0]) / math.log(1e5) == pytest.approx(0.06 / 0.62)
    assert ratio[0] > CHINCHILLA_TOKENS_PER_PARAM  # not Approaches 1-2's constant 20
