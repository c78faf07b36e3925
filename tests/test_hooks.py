"""gptlib.hooks: hook points read tensors and, when a hook returns one, replace them (patching)."""

import pytest
import torch

from gptlib.hooks import HookPoint, capture, capture_patterns, logit_lens


def _uniform_pattern(shape):
    """The pattern of a head that spreads each query evenly over keys 0..i: (..., T, T)."""
    T = shape[-1]
    A = torch.tril(torch.ones(T, T))
    return (A / A.sum(-1, keepdim=True)).expand(shape)


def test_hook_point_is_the_identity_and_capture_detaches():
    hp = HookPoint()
    x = torch.randn(3, requires_grad=True)
    assert hp(x) is x
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), HookPoint())
    with capture(model, "1") as seen:
        model(x)
    assert len(seen) == 1 and not seen[0].requires_grad
    assert not model[1]._forward_hooks  # removed on exit
    with pytest.raises(ValueError, match="no HookPoint"):
        with capture(model, "hook_missing"):
            pass
    with pytest.raises(ValueError, match="name"):
        with capture(model, ""):
            pass


def test_capture_patterns_changes_no_switch_and_records_the_patterns_used(tiny_gpt):
    """capture_patterns asks for the patterns by hooking them: fused stays True, the layers take the
    formula while hooked (so the patterns exist and the logits equal the fused kernel's up to float
    rounding), and no hook is left behind, also after an error."""
    model = tiny_gpt(n_ctx=16)
    ids = torch.randint(0, model.config.d_vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fused = model(ids)
        with capture_patterns(model) as seen:
            assert all(blk.attn.fused for blk in model.blocks)
            assert all(blk.attn.hook_pattern.observed for blk in model.blocks)
            recorded = model(ids)
    assert len(seen) == model.config.n_layers
    torch.testing.assert_close(recorded, fused, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_patterns(model):
            raise RuntimeError("boom")
    assert not any(blk.attn.hook_pattern.observed for blk in model.blocks)
    assert all(blk.attn.fused for blk in model.blocks)
    with pytest.raises(ValueError, match="hook_pattern"):
        with capture_patterns(torch.nn.Linear(2, 2)):
            pass


@pytest.mark.parametrize("make", ["tiny_gpt", "tiny_modern"], ids=["GPT", "ModernGPT"])
def test_patching_an_attention_pattern_changes_the_logits(make, request):
    """A forward hook on hook_pattern that returns a tensor replaces the pattern the layer uses.

    Patching layer 0's pattern to the uniform causal one must give the model whose layer-0 queries
    are zero (every score 0, so every query averages keys 0..i): an independent way to the same
    logits.
    """
    model = request.getfixturevalue(make)()
    ids = torch.randint(0, model.config.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    attn = model.blocks[0].attn
    with torch.no_grad():
        clean = model(ids)
        attn.fused = False
        handle = attn.hook_pattern.register_forward_hook(
            lambda m, args, out: _uniform_pattern(out.shape)
        )
        try:
            patched = model(ids)
        finally:
            handle.remove()
            attn.fused = True
        attn.W_Q.zero_()
        if getattr(attn, "b_Q", None) is not None:
            attn.b_Q.zero_()
        zero_queries = model(ids)
    assert float((patched - clean).abs().max()) > 1e-3
    torch.testing.assert_close(patched, zero_queries)


def test_patching_a_residual_stream_of_modern_gpt_changes_the_logits(tiny_modern):
    model = tiny_modern()
    ids = torch.randint(0, model.config.d_vocab, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        clean = model(ids)
        handle = model.blocks[0].hook_resid.register_forward_hook(
            lambda m, args, out: torch.zeros_like(out)
        )
        try:
            patched = model(ids)
        finally:
            handle.remove()
        # zeroing the stream after block 0: the rest of the model sees 0, as if it started
        # from there
        x = torch.zeros(1, 8, model.config.d_model)
        for blk in model.blocks[1:]:
            x = blk(x)
        expected = model.ln_f(x) @ model.W_U
    assert float((patched - clean).abs().max()) > 1e-3
    torch.testing.assert_close(patched, expected)


def test_logit_lens_of_gpt_reads_each_stream_of_a_walk_through_the_blocks(tiny_gpt):
    model = tiny_gpt()
    ids = torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        x = model.input_stream(ids)  # X_0, then X_l = Block_l(X_(l-1)), walked by hand
        streams = [x]
        for blk in model.blocks:
            x = blk(x)
            streams.append(x)
        expected = torch.stack([model.ln_f(x) @ model.W_U for x in streams])
        logits = model(ids)
    lens = logit_lens(model, ids)
    assert lens.shape == (model.config.n_layers + 1, 2, 7, model.config.d_vocab)
    torch.testing.assert_close(lens, expected)
    torch.testing.assert_close(lens[-1], logits)


def test_logit_lens_at_one_position_is_that_column_of_the_whole_lens(tiny_gpt):
    model = tiny_gpt()
    ids = torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(4))
    lens = logit_lens(model, ids)  # (L + 1, B, T, d_vocab)
    for position in (0, 3, 6, -1, -7):
        one = logit_lens(model, ids, position=position)
        assert one.shape == (model.config.n_layers + 1, 2, model.config.d_vocab)
        torch.testing.assert_close(one, lens[:, :, position])
    for bad in (7, -8, 1.0, True, "0"):
        with pytest.raises(ValueError, match="position must be an int in"):
            logit_lens(model, ids, position=bad)
    with pytest.raises(ValueError, match="ids must be a"):
        logit_lens(model, ids[0], position=0)


def test_capture_needs_a_module():
    for bad in (None, "model", [torch.nn.Linear(2, 2)]):
        with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
            with capture(bad, "hook_pattern"):
                pass
        with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
            with capture_patterns(bad):
                pass
