"""Tests for gptlib.lora: the rank-r update, its first gradients, merging, and the alpha/r
scaling."""

import copy

import pytest
import torch

from gptlib.lora import LoRA, attention_mlp_targets, lora_forward, lora_parameters
from gptlib.recipes import fine_tune
from gptlib.training import make_windows

pytestmark = pytest.mark.usefixtures("one_thread")


def perturbed(lora, seed=1):
    """Give every B random values (as training would), so that the update is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for B in lora.B:
            B.copy_(torch.randn(B.shape, generator=g, dtype=B.dtype) * 0.05)
    return lora


def by_hand(base, lora):
    """The adapted model computed exactly: a copy of base with W + (alpha/r) A B written in."""
    model = copy.deepcopy(base)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for i, name in enumerate(lora.targets):
            params[name].add_(lora.alpha / lora.r * lora.A[i] @ lora.B[i])
    return model


def test_lora_forward_is_x_times_w_plus_update():
    g = torch.Generator().manual_seed(0)
    x, W = (
        torch.randn(5, 6, generator=g, dtype=torch.float64),
        torch.randn(6, 4, generator=g, dtype=torch.float64),
    )
    A, B = (
        torch.randn(6, 2, generator=g, dtype=torch.float64),
        torch.randn(2, 4, generator=g, dtype=torch.float64),
    )
    torch.testing.assert_close(lora_forward(x, W, A, B, 0.5), x @ (W + 0.5 * A @ B))
    with pytest.raises(ValueError, match="A \\(d_in, r\\)"):
        lora_forward(x, W, A.T, B, 0.5)


def test_parameter_count(tiny_gpt):
    base = tiny_gpt()
    targets = attention_mlp_targets(base)
    lora = LoRA(base, targets, r=3, alpha=1.0)
    shapes = [dict(base.named_parameters())[n].shape for n in targets]
    assert lora.num_parameters() == sum(lora_parameters(d_in, d_out, 3) for d_in, d_out in shapes)
    assert lora.num_parameters() == 2 * (4 * (64 + 64) + 2 * (64 + 256)) * 3  # 2 layers, d_model 64
    assert all(p.requires_grad for p in base.parameters())  # the caller's model is not changed


def test_starts_as_the_original_and_equals_the_weights_written_in(tiny_gpt):
    base = tiny_gpt()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    lora = LoRA(
        base,
        attention_mlp_targets(base),
        r=2,
        alpha=4.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(lora(ids), base(ids))  # B = 0
    perturbed(lora)
    assert not torch.allclose(lora(ids), base(ids), atol=1e-3)
    torch.testing.assert_close(lora(ids), by_hand(base, lora)(ids), atol=1e-5, rtol=1e-5)


def test_merged_weights_and_outputs(tiny_gpt):
    base = tiny_gpt().double()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    lora = perturbed(
        LoRA(
            base,
            attention_mlp_targets(base)[:4],
            r=2,
            alpha=3.0,
            generator=torch.Generator().manual_seed(2),
        )
    )
    merged = lora.merged()
    m, b = dict(merged.named_parameters()), dict(base.named_parameters())
    for i, name in enumerate(lora.targets):
        assert torch.equal(m[name], b[name] + 1.5 * (lora.A[i] @ lora.B[i]))
    for name in set(b) - set(lora.targets):
        assert torch.equal(m[name], b[name])
    torch.testing.assert_close(merged(ids), lora(ids), atol=1e-12, rtol=1e-12)
    # a broken merge (the update without its scale alpha / r) is a different model
    broken = copy.deepcopy(base)
    with torch.no_grad():
        for i, name in enumerate(lora.targets):
            dict(broken.named_parameters())[name].add_(lora.A[i] @ lora.B[i])
    assert not torch.allclose(broken(ids), lora(ids), atol=1e-4)


def test_first_step_gradients():
    """At B = 0 the gradient of A is exactly zero and that of B is s A^T X^T G: B moves first."""
    torch.manual_seed(0)
    lin = torch.nn.Module()
    lin.W = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    lin.forward = lambda x: x @ lin.W
    lora = LoRA(lin, ["W"], r=2, alpha=3.0, generator=torch.Generator().manual_seed(1))
    X = torch.randn(5, 6, dtype=torch.float64)
    target = torch.randn(5, 4, dtype=torch.float64)
    Y = lora(X)
    loss = ((Y - target) ** 2).sum()
    loss.backward()
    G = 2 * (Y - target).detach()  # dL/dY
    assert torch.count_nonzero(lora.A[0].grad) == 0
    torch.testing.assert_close(lora.B[0].grad, 1.5 * lora.A[0].detach().T @ X.T @ G)
    assert torch.count_nonzero(lora.B[0].grad) == lora.B[0].numel()


def test_alpha_over_r_is_a_learning_rate_on_b():
    """Under Adam, scale s with rate eta on both factors = scale 1 with eta on A and s eta on B."""
    torch.manual_seed(0)
    X, target = torch.randn(32, 6, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)

    def run(alpha, lr_A, lr_B):
        lin = torch.nn.Module()
        lin.W = torch.nn.Parameter(torch.zeros(6, 4, dtype=torch.float64))
        lin.forward = lambda x: x @ lin.W
        lora = LoRA(lin, ["W"], r=2, alpha=alpha, generator=torch.Generator().manual_seed(1))
        opt = torch.optim.Adam(
            [{"params": [lora.A[0]], "lr": lr_A}, {"params": [lora.B[0]], "lr": lr_B}], eps=1e-30
        )
        for _ in range(20):
            opt.zero_grad()
            ((lora(X) - target) ** 2).mean().backward()
            opt.step()
        return lora.delta(0).detach()

    s, eta = 4.0, 1e-2  # r = 2, alpha = 8
    torch.testing.assert_close(run(8.0, eta, eta), run(2.0, eta, s * eta), atol=1e-10, rtol=1e-9)
    assert not torch.allclose(run(8.0, eta, eta), run(2.0, eta, eta), atol=1e-3)


def test_fine_tune_freezes_the_base_and_repeats(tiny_gpt):
    base = tiny_gpt()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    train = make_windows(
        torch.randint(0, 512, (2000,), generator=torch.Generator().manual_seed(0)), 32, 32
    )
    model, hist = fine_tune(base, train, r=2, seed=3, steps=6)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    assert len(hist.loss) == 6 and isinstance(model, LoRA)
    _, first = fine_tune(base, train, r=2, seed=3, steps=6, n_steps=3)
    assert first.loss == hist.loss[:3]  # the first steps of the run, exactly
    full, hist_full = fine_tune(base, train, r=None, seed=3, steps=6)
    assert hist_full.loss[0] == hist.loss[0]  # the same first batch, the same model
    assert any(not torch.equal(before[k], v) for k, v in full.state_dict().items())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"r": 0}, "r must be"),
        ({"alpha": 0.0}, "alpha must be"),
        ({"targets": ["blocks.0.attn.W_X"]}, "not a 2-D parameter"),
        ({"targets": ["blocks.0.ln_1.w"]}, "not a 2-D parameter"),
        ({"targets": []}, "targets must be"),
    ],
)
def test_bad_arguments(tiny_gpt, kwargs, match):
    args = {"targets": ["blocks.0.attn.W_Q"], "r": 2, "alpha": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        LoRA(tiny_gpt(), **args)
