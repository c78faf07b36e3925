"""gptlib.sampling: next_token_probs semantics and errors; generate with and without the KV
cache."""

import math

import pytest
import torch

from gptlib.model import GPT, GPTConfig
from gptlib.sampling import Generation, generate, generate_with_logits, next_token_probs

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is as fast


def test_worked_example_of_004():
    y = torch.tensor([0.001, 10.0, 6.0, 1.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(
        next_token_probs(y, 1.0, top_k=3)[[1, 2, 4]],
        torch.tensor([0.97962921, 0.01794253, 0.00242826], dtype=torch.float64),
        atol=1e-8,
        rtol=0,
    )
    torch.testing.assert_close(
        next_token_probs(y, 10.0, top_k=3)[[1, 2, 4]],
        torch.tensor([0.45062671, 0.30206411, 0.24730918], dtype=torch.float64),
        atol=1e-8,
        rtol=0,
    )


def test_temperature_limits_and_greedy():
    y = torch.tensor([1.0, 3.0, 2.0, 3.0])
    assert torch.equal(
        next_token_probs(y, temperature=0), torch.tensor([0.0, 1.0, 0.0, 0.0])
    )  # first argmax
    torch.testing.assert_close(next_token_probs(y, temperature=1e7), torch.full((4,), 0.25))
    torch.testing.assert_close(next_token_probs(y), torch.softmax(y, -1))


def test_top_k_and_ties():
    y = torch.tensor([5.0, 1.0, 5.0, 3.0])
    p = next_token_probs(y, top_k=1)
    assert torch.equal(p, torch.tensor([1.0, 0.0, 0.0, 0.0]))  # ties: lower id kept
    p = next_token_probs(y, top_k=3)
    assert p[1] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    torch.testing.assert_close(next_token_probs(y, top_k=10), torch.softmax(y, -1))


def test_top_p_keeps_crossing_token_and_at_least_one():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    y = p.log()
    for top_p, n in ((0.1, 1), (0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (0.96, 4), (1.0, 4)):
        q = next_token_probs(y, top_p=top_p)
        assert int((q > 0).sum()) == n, (top_p, q)
        torch.testing.assert_close(q.sum(), torch.tensor(1.0))


def test_order_temperature_then_top_k_then_top_p_batched():
    y = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    out = next_token_probs(y, temperature=0.7, top_k=10, top_p=0.6)
    for b in range(3):
        p = torch.softmax(y[b] / 0.7, -1)
        idx = torch.argsort(y[b], descending=True)[:10]
        pk = p[idx] / p[idx].sum()
        n = int(((torch.cumsum(pk, 0) - pk) < 0.6).sum())
        ref = torch.zeros(50)
        ref[idx[:n]] = pk[:n] / pk[:n].sum()
        torch.testing.assert_close(out[b], ref)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        next_token_probs(torch.randn(5), **kwargs)


def test_bad_logits():
    with pytest.raises(ValueError, match="NaN"):
        next_token_probs(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="logits must be a tensor of shape"):
        next_token_probs(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="logits must be a tensor of shape"):
        next_token_probs(torch.tensor(1.0))
    with pytest.raises(ValueError, match="logits must be a tensor"):
        next_token_probs([1.0, 2.0])
    with pytest.raises(ValueError, match="inf"):
        next_token_probs(torch.tensor([0.0, math.inf]))
    with pytest.raises(ValueError, match="finite"):
        next_token_probs(torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]))
    with pytest.raises(ValueError, match="floating"):
        next_token_probs(torch.tensor([1, 2]))


def test_masked_logits_tiny_temperature_and_integer_types():
    y = torch.tensor([-math.inf, 2.0, 1.0, 2.0])
    torch.testing.assert_close(next_token_probs(y), torch.softmax(y, -1))
    # (y - max) / tau stays finite: ties at the max share the mass as tau -> 0
    torch.testing.assert_close(
        next_token_probs(y, temperature=1e-40), torch.tensor([0.0, 0.5, 0.0, 0.5])
    )
    assert torch.equal(next_token_probs(y, temperature=0), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    import numpy as np

    torch.testing.assert_close(next_token_probs(y, top_k=np.int64(1)), next_token_probs(y, top_k=1))
    torch.testing.assert_close(
        next_token_probs(y, temperature=np.float32(2.0)), next_token_probs(y, temperature=2.0)
    )


def test_top_p_boundary_is_exact():
    y = torch.tensor([0.5, 0.25, 0.25]).log()  # binary fractions: the sums are exact
    assert int((next_token_probs(y, top_p=0.75) > 0).sum()) == 2  # 0.5 + 0.25 reaches 0.75 exactly
    assert int((next_token_probs(y, top_p=0.7500001) > 0).sum()) == 3


@pytest.fixture(scope="module")
def small(tiny_gpt):
    return tiny_gpt(n_ctx=16)


def test_generate_cache_equals_no_cache_past_n_ctx(small):
    prompt = torch.randint(0, 512, (2, 6))
    a, la = generate_with_logits(small, prompt, 30, temperature=0.0)
    b, lb = generate_with_logits(small, prompt, 30, temperature=0.0, use_cache=False)
    assert torch.equal(a, b) and a.shape == (2, 36)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    s1 = generate(small, prompt, 30, top_p=0.9, generator=torch.Generator().manual_seed(1))
    s2 = generate(
        small, prompt, 30, top_p=0.9, generator=torch.Generator().manual_seed(1), use_cache=False
    )
    assert torch.equal(s1, s2)


def test_generate_is_reproducible_with_a_seed(small):
    prompt = torch.tensor([[5, 6, 7]])

    def draw(seed, **kw):
        return generate(small, prompt, 20, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(draw(7), draw(7)) and torch.equal(
        draw(7, temperature=1.5, top_k=20), draw(7, temperature=1.5, top_k=20)
    )
    assert not torch.equal(draw(7), draw(8))
    # top_k = 1 is greedy whatever the temperature
    assert torch.equal(
        draw(0, top_k=1, temperature=3.0), generate(small, prompt, 20, temperature=0.0)
    )


def test_generate_equals_a_plain_sampling_loop(small):
    ids, g = torch.tensor([[3, 1, 4, 1, 5]]), torch.Generator().manual_seed(2)
    for _ in range(25):  # past n_ctx = 16: crop, softmax of the last row, one draw
        with torch.no_grad():
            y = small(ids[:, -16:])[:, -1]  # (1, d_vocab)
        ids = torch.cat(
            [ids, torch.multinomial(torch.softmax(y / 0.9, dim=-1), 1, generator=g)], dim=1
        )
    assert torch.equal(
        ids,
        generate(
            small, ids[:, :5], 25, temperature=0.9, generator=torch.Generator().manual_seed(2)
        ),
    )


def test_cached_keys_of_earlier_positions_do_not_change(small):
    from gptlib.kvcache import KVCache

    ids = torch.randint(0, 512, (1, 12))
    short, full = KVCache(small.config.n_layers), KVCache(small.config.n_layers)
    with torch.no_grad():
        small(ids[:, :7], cache=short)
        small(ids, cache=full)
    for layer in range(small.config.n_layers):
        torch.testing.assert_close(full.k[layer][:, :, :7], short.k[layer])
        torch.testing.assert_close(full.v[layer][:, :, :7], short.v[layer])


def test_generate_1d_prompt_keeps_prefix_and_restores_mode(small):
    small.train()
    prompt = torch.tensor([1, 2, 3])
    out = generate(small, prompt, 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (8,) and torch.equal(out[:3], prompt)
    assert small.training
    small.eval()
    assert torch.equal(generate(small, prompt, 0), prompt)


def test_generate_crops_a_prompt_longer_than_n_ctx(small):
    long = torch.randint(0, 512, (1, 40))
    out = generate(small, long, 3, temperature=0.0)
    ref = generate(small, long[:, -16:], 3, temperature=0.0)
    assert torch.equal(out[:, -3:], ref[:, -3:])


def test_generate_errors(small):
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(small, torch.tensor([1]), -1)
    with pytest.raises(ValueError, match="top_k"):
        generate(small, torch.tensor([1]), 1, top_k=0)
    with pytest.raises(ValueError, match="ids"):
        generate(small, torch.zeros(1, 1, 1, dtype=torch.long), 1)


# --- no NaN passes as a result --------------------------------------------------------------------
def test_temperature_below_float32_range_is_the_limit_not_nan():
    """A temperature that rounds to 0 in float32 (1e-46) gives the limit tau -> 0+: the maxima
    share."""
    y = torch.tensor([-math.inf, 2.0, 1.0, 2.0])
    for tau in (1e-46, 1e-300, 5e-324):
        torch.testing.assert_close(
            next_token_probs(y, temperature=tau), torch.tensor([0.0, 0.5, 0.0, 0.5])
        )
    half = next_token_probs(y.half(), temperature=1e-9)  # below float16's range too
    assert half.dtype == torch.float16 and half.tolist() == [0.0, 0.5, 0.0, 0.5]
    z = torch.tensor([0.0, 1e-6, 3.0])  # exact at a tiny but representable temperature too
    torch.testing.assert_close(
        next_token_probs(z, temperature=1e-40), torch.tensor([0.0, 0.0, 1.0])
    )


def test_generate_at_a_vanishing_temperature_is_greedy(small):
    prompt = torch.tensor([[5, 6, 7]])
    greedy = generate(small, prompt, 8, temperature=0.0)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate(small, prompt, 8, temperature=1e-46, generator=g), greedy)


def test_infinite_temperature_is_refused_with_a_clear_message():
    y = torch.tensor([-math.inf, 2.0, 1.0])
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        next_token_probs(y, temperature=math.inf)
    with pytest.raises(ValueError, match="temperature"):
        generate(GPT(GPTConfig.preset("tiny")), torch.tensor([1]), 1, temperature=math.inf)
    # a large finite temperature is the uniform distribution over the tokens with a finite logit
    torch.testing.assert_close(
        next_token_probs(y, temperature=1e300), torch.tensor([0.0, 0.5, 0.5])
    )


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_generate_refuses_a_model_with_non_finite_weights(use_cache, fused, bad, tiny_gpt):
    """A non-finite weight is a ValueError naming it, before any token is drawn."""
    model = tiny_gpt(n_ctx=16)
    for blk in model.blocks:
        blk.attn.fused = fused
    with torch.no_grad():
        model.blocks[1].attn.W_Q[0, 0] = bad
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"non-finite.*blocks\.1\.attn\.W_Q"):
            generate(
                model, torch.tensor([[1, 2, 3]]), 4, temperature=temperature, use_cache=use_cache
            )


def test_generate_checks_ids_once_and_refuses_bad_ones(small):
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 512\)"):
        generate(small, torch.tensor([[1, 512]]), 2)
    with pytest.raises(ValueError, match="ids must be an integer tensor"):
        generate(small, torch.tensor([[1.0, 2.0]]), 2)
    with pytest.raises(ValueError, match="max_new_tokens must be an int"):
        generate(small, torch.tensor([1]), True)
    with pytest.raises(ValueError, match="use_cache"):
        generate(small, torch.tensor([1]), 1, use_cache=1)


def test_generate_reads_the_ids_and_the_settings_once_not_per_token(small, monkeypatch):
    """The per-token path holds no data-dependent check (each one a synchronisation on a GPU)."""
    import gptlib.runtime
    import gptlib.sampling

    calls = {"ids": 0, "logits": 0}
    check_ids, check_logits = gptlib.runtime.check_ids, gptlib.sampling._check_logits

    def count(key, f):
        def counted(*args, **kwargs):
            calls[key] += 1
            return f(*args, **kwargs)

        return counted

    monkeypatch.setattr(
        gptlib.runtime, "check_ids", count("ids", check_ids)
    )  # what the models call
    monkeypatch.setattr(gptlib.sampling, "_check_logits", count("logits", check_logits))
    for use_cache in (True, False):
        generate(
            small,
            torch.tensor([[1, 2, 3]]),
            20,
            top_p=0.9,
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(0),
        )
    assert calls == {"ids": 0, "logits": 0}
    with torch.no_grad():
        small(torch.tensor([[1, 2, 3]]))
    assert calls["ids"] == 1  # a direct call checks


def test_generate_with_logits_returns_one_type(small):
    out = generate_with_logits(small, torch.tensor([1, 2]), 3, temperature=0.0)
    assert isinstance(out, Generation) and out.ids.shape == (5,) and out.logits.shape == (3, 512)
    assert torch.equal(out.ids, generate(small, torch.tensor([1, 2]), 3, temperature=0.0))
    assert torch.equal(out.ids[2:], out.logits.argmax(-1))
    empty = generate_with_logits(small, torch.tensor([[1, 2]]), 0)
    assert empty.logits.shape == (1, 0, 512) and torch.equal(empty.ids, torch.tensor([[1, 2]]))
