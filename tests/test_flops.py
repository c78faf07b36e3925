"""gptlib.flops: the FLOP convention against PyTorch's own counter, MFU, the matmul rate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from gptlib import flops
from gptlib.model import GPT, GPTConfig


def test_matmul_weights_is_the_parameters_of_the_matrix_products():
    cfg = GPTConfig.preset("tiny")
    model = GPT(cfg)
    matrices = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "W_pos" not in n
    )
    assert flops.matmul_weights(cfg) == matrices  # W_E is tied: counted once, as W_U
    # GPT-2 small: 12 (4 * 768^2 + 2 * 768 * 3072) + 768 * 50257
    assert flops.matmul_weights(GPTConfig.preset("gpt2")) == 123_532_032


@pytest.mark.parametrize("preset, T", [("tiny", 64), ("tiny", 16)])
def test_flop_formula_matches_torch_flop_counter(preset, T):
    cfg = GPTConfig.preset(preset)
    torch.manual_seed(0)
    model = GPT(cfg)
    B = 2
    ids = torch.randint(0, cfg.d_vocab, (B, T), generator=torch.Generator().manual_seed(8))
    for blk in model.blocks:
        blk.attn.fused = (
            False  # the readable path: attention as two matmuls FlopCounterMode can see
        )
    with FlopCounterMode(display=False) as fwd:
        logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    assert fwd.get_total_flops() == B * T * flops.forward_flops_per_token(cfg, n_ctx=T)
    assert bwd.get_total_flops() == 2 * fwd.get_total_flops()
    assert (
        flops.training_flops(cfg, B * T, n_ctx=T) == fwd.get_total_flops() + bwd.get_total_flops()
    )


def test_training_flops_per_token_is_6_N_plus_12_L_T_d_attn():
    cfg = GPTConfig.preset("gpt2")
    n_mm, d_attn = flops.matmul_weights(cfg), cfg.n_heads * cfg.d_head
    assert flops.training_flops(cfg, 1) == 6 * n_mm + 12 * cfg.n_layers * cfg.n_ctx * d_attn
    assert flops.forward_flops_per_token(cfg, n_ctx=1) == 2 * n_mm + 4 * cfg.n_layers * d_attn


def test_flops_and_mfu_errors():
    cfg = GPTConfig.preset("tiny")
    with pytest.raises(ValueError, match="tokens"):
        flops.training_flops(cfg, -1)
    with pytest.raises(ValueError, match="n_ctx"):
        flops.forward_flops_per_token(cfg, n_ctx=0)
    with pytest.raises(ValueError, match="seconds"):
        flops.model_flops_utilization(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="peak"):
        flops.model_flops_utilization(1.0, 1.0, 0.0)
    assert flops.model_flops_utilization(3e12, 2.0, 3e12) == 0.5


def test_matmul_flops_per_s():
    assert flops.matmul_flops_per_s(64, 2) > 0
    assert (
        flops.matmul_flops_per_s(32, 1, device=torch.device("cpu"), dtype=torch.float64, products=3)
        > 0
    )
    for kwargs, name in (
        ({"repeats": 0}, "repeats"),
        ({"n": 0}, "n"),
        ({"products": 0}, "products"),
    ):
        with pytest.raises(ValueError, match=name):
            flops.matmul_flops_per_s(**{"n": 64, "repeats": 2, **kwargs})


def test_float_arguments_must_be_finite():
    for kw, name in (
        (dict(seconds=float("nan")), "seconds"),
        (dict(peak_flops_per_s=float("inf")), "peak_flops_per_s"),
        (dict(model_flops=float("nan")), "model_flops"),
    ):
        args = dict(model_flops=6e12, seconds=10.0, peak_flops_per_s=1e12) | kw
        with pytest.raises(ValueError, match=name):
            flops.model_flops_utilization(**args)


def test_the_count_is_for_gpt_configs_only():
    """The formula is GPT-2's block (full-width K and V, a two-matrix MLP): for a Llama-style
    ModernConfig (grouped K and V, SwiGLU's three matrices) it would be silently wrong, and a config
    that is not one at all must not fail with an AttributeError."""
    from gptlib.modern import ModernConfig

    for bad in (ModernConfig.preset("tiny"), None, {"d_model": 64}):
        for call in (
            flops.matmul_weights,
            flops.forward_flops_per_token,
            lambda c: flops.training_flops(c, 1),
        ):
            with pytest.raises(ValueError, match="config must be a GPTConfig"):
                call(bad)


def test_the_matmul_rate_needs_a_floating_dtype():
    with pytest.raises(ValueError, match="dtype"):
        flops.matmul_flops_per_s(8, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype"):
        flops.matmul_flops_per_s(8, 1, dtype="float32")
