"""gptlib.block: LayerNorm and the three block kinds."""

import pytest
import torch

from gptlib.block import BLOCK_KINDS, Block, LayerNorm, layer_norm
from gptlib.hf import from_hf
from gptlib.hooks import capture_patterns
from gptlib.mlp import ACTIVATIONS, gelu_tanh
from gptlib.model import GPTConfig


def cfg(d_model=16, n_heads=4, d_mlp=64, **kw):
    """A block's configuration (the vocabulary, context and depth of GPTConfig do not enter a
    block)."""
    return GPTConfig(d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, **kw)


def test_layer_norm_formula_and_peer():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    w, b = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    peer = torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5)
    torch.testing.assert_close(layer_norm(x, w, b), peer)
    ln = LayerNorm(8).double()
    torch.testing.assert_close(
        ln(x),
        layer_norm(x, torch.ones(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)),
    )
    assert layer_norm(torch.tensor([[1.0, 3.0]]), torch.ones(2), None, eps=0.0).tolist() == [
        [-1.0, 1.0]
    ]


def test_layer_norm_errors():
    with pytest.raises(ValueError, match="eps"):
        LayerNorm(4, eps=-1)
    with pytest.raises(ValueError, match="d_model"):
        LayerNorm(0)


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_block_kinds_match_their_equations(kind):
    torch.manual_seed(0)
    blk = Block(cfg(block=kind)).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        a, m = blk.attn, blk.mlp
        if kind == "pre_ln":
            y = x + a(blk.ln_1(x))
            z = y + m(blk.ln_2(y))
        elif kind == "post_ln":
            y = blk.ln_1(x + a(x))
            z = blk.ln_2(y + m(y))
        else:
            z = x + a(blk.ln_1(x)) + m(blk.ln_1(x))
        torch.testing.assert_close(blk(x), z)
        with capture_patterns(blk) as seen:
            out = blk(x)
        (pattern,) = seen
        torch.testing.assert_close(out, z, atol=1e-6, rtol=1e-5)
        assert pattern.shape == (2, 4, 5, 5)


def test_block_dropout_only_in_training():
    blk = Block(cfg(dropout=0.5))
    x = torch.randn(1, 5, 16)
    blk.eval()
    with torch.no_grad():
        assert torch.equal(blk(x), blk(x))
    blk.train()
    torch.manual_seed(0)
    with torch.no_grad():
        assert not torch.equal(blk(x), blk(x))


def test_block_matches_hf_gpt2_block():
    from transformers import GPT2Config, GPT2LMHeadModel  # the peer, imported where it is used

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=50,
            n_positions=16,
            n_embd=32,
            n_layer=1,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        )
    ).eval()
    ours = from_hf(hf).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        ref = hf.transformer.h[0](x)
        ref = ref[0] if isinstance(ref, tuple) else ref
        torch.testing.assert_close(ours.blocks[0](x), ref, atol=1e-5, rtol=1e-5)


def test_block_rejects_unknown_kind_and_other_configs():
    with pytest.raises(ValueError, match="block"):
        Block(cfg(block="sandwich"))
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        Block(16)
    with pytest.raises(ValueError, match="layer"):
        Block(cfg(), layer=-1)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
def test_fused_activations_equal_the_formulas(activation):
    act = ACTIVATIONS[activation]
    x = torch.linspace(-10, 10, 20_001, dtype=torch.float64, requires_grad=True)
    fused, formula = act.fused(x), act.formula(x)
    torch.testing.assert_close(fused, formula, atol=1e-14, rtol=0)
    (g1,) = torch.autograd.grad(fused.sum(), x)
    (g2,) = torch.autograd.grad(formula.sum(), x)
    torch.testing.assert_close(g1, g2, atol=1e-13, rtol=0)
    x32 = x.detach().float()
    assert float((act.fused(x32) - act.formula(x32)).abs().max()) <= 2e-6


def test_fused_and_formula_blocks_agree():
    torch.manual_seed(0)
    fused = Block(cfg()).eval()
    formula = Block(cfg()).eval()
    formula.load_state_dict(fused.state_dict())
    formula.mlp.fused = False  # the formula of Chapter 3
    assert formula.mlp.phi is gelu_tanh and fused.mlp.phi is not gelu_tanh
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), formula(x), atol=1e-6, rtol=1e-6)


def test_block_dropout_fraction_and_scaling():
    p = 0.3
    blk = Block(cfg(dropout=p)).train()
    seen = {}
    blk.mlp_drop.register_forward_hook(lambda mod, inp, out: seen.update(before=inp[0], after=out))
    torch.manual_seed(0)
    with torch.no_grad():
        blk(torch.randn(16, 32, 16))
    kept = seen["after"] != 0
    assert abs(1 - float(kept.float().mean()) - p) < 0.02
    torch.testing.assert_close(seen["after"][kept], seen["before"][kept] / (1 - p))


def test_block_deepcopy_and_pickle_round_trip():
    import copy
    import pickle

    blk = Block(cfg(8, 2, 32)).eval()
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        for other in (copy.deepcopy(blk), pickle.loads(pickle.dumps(blk))):
            assert torch.equal(other(x), blk(x))


def test_layer_norm_eps_must_be_finite():
    for eps in (float("nan"), float("inf"), -1e-5):
        with pytest.raises(ValueError, match="eps"):
            LayerNorm(4, eps=eps)


def test_layer_norm_function_and_module_refuse_bad_arguments():
    with pytest.raises(ValueError, match="eps"):
        layer_norm(torch.ones(1, 2), torch.ones(2), None, eps=float("nan"))
    with pytest.raises(ValueError, match="bias"):
        LayerNorm(4, bias=0)
