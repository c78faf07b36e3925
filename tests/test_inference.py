"""gptlib.inference (Chapter 13): tiled attention, speculative sampling, quantization.

Each key check is run twice: on the code, where it passes, and on the code broken in the way a
slip would break it (o not rescaled, a perturbed acceptance rule, the residual taken from p, an
off-by-one number of levels), where it must fail.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptlib.inference import (
    BigramDraft,
    Traffic,
    absmax_quantize,
    blockwise_quantize,
    chi_square_power,
    emitted_distribution,
    error_bound,
    expected_tokens_per_pass,
    flash,
    flash_block_sizes,
    product_noise_variance,
    q4_1_pack,
    quantize,
    quantize_model,
    sequence_distribution,
    speculative,
    speculative_generate,
    speculative_round,
    standard_attention,
    tiled_attention,
    use_tiled_attention,
)
from gptlib.kvcache import KVCache
from gptlib.sampling import generate

pytestmark = pytest.mark.usefixtures("one_thread")


def qkv(T=13, T_k=None, d=8, batch=(2, 3), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    T_k = T if T_k is None else T_k
    q = torch.randn(*batch, T, d, generator=g, dtype=dtype)
    k, v = torch.randn(2, *batch, T_k, d, generator=g, dtype=dtype)
    return q, k, v


def sdpa(q, k, v, causal=True):
    T, T_k = q.shape[-2], k.shape[-2]
    if not causal:
        return F.scaled_dot_product_attention(q, k, v)
    keep = torch.ones(T, T_k, dtype=torch.bool).tril(T_k - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


# --- 13.1 tiled attention -------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "T, T_k, block_q, block_k",
    [
        (13, 13, 4, 5),
        (13, 13, 1, 1),
        (13, 13, 13, 13),
        (5, 12, 2, 3),
        (1, 9, 1, 4),
        (16, 16, 16, 3),
    ],
)
def test_tiled_attention_equals_sdpa_in_float64(causal, T, T_k, block_q, block_k):
    q, k, v = qkv(T, T_k)
    assert (
        tiled_attention(q, k, v, block_q, block_k, causal=causal) - sdpa(q, k, v, causal)
    ).abs().max() < 1e-12


def test_tiled_attention_in_float32_is_within_rounding():
    q, k, v = qkv(64, d=16, dtype=torch.float32)
    torch.testing.assert_close(tiled_attention(q, k, v, 16, 8), sdpa(q, k, v), atol=2e-6, rtol=1e-5)


def test_tiled_attention_survives_large_scores():
    q, k, v = qkv(10)
    q = q * 1e3  # exp of the raw scores overflows: the running maximum keeps every exponent <= 0
    out = tiled_attention(q, k, v, 3, 4)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, sdpa(q, k, v))


def test_tiling_that_forgets_to_rescale_o_is_caught(monkeypatch):
    q, k, v = qkv(12)

    def no_rescale(state, scores, v_b):  # rescales ell but not o
        m_new, ell_new, o_new = flash_update(state, scores, v_b)
        if state is not None:
            _m, _, o = state
            o_new = o + torch.exp(scores - m_new) @ v_b
        return m_new, ell_new, o_new

    flash_update = flash.online_softmax_update
    monkeypatch.setattr(flash, "online_softmax_update", no_rescale)
    err = (tiled_attention(q, k, v, 4, 4) - sdpa(q, k, v)).abs().max()
    assert err > 1e-3  # the check of the chapter, assert_close to 1e-12, fails


def test_tiled_traffic_count_matches_its_formula():
    T, d, B_r, B_c = 64, 8, 8, 16
    q, k, v = qkv(T, d=d, batch=())
    t = Traffic()
    tiled_attention(q, k, v, B_r, B_c, causal=False, traffic=t)
    T_c = T // B_c  # key blocks; every query row is visited T_c times
    reads = 2 * T * d + T_c * T * d + (T_c - 1) * T * (d + 2) + T * (d + 1)
    writes = T_c * T * (d + 2) + T * d
    assert (t.reads, t.writes) == (reads, writes)
    s = Traffic()
    standard_attention(q, k, v, causal=False, traffic=s)
    assert s.total == 4 * T * T + 4 * T * d


def test_tiled_traffic_falls_as_one_over_M_and_causal_skips_tiles():
    T, d = 256, 16
    q, k, v = qkv(T, d=d, batch=())
    totals = {}
    for M in (1024, 2048, 4096):
        B_r, B_c = flash_block_sizes(M, d)
        t = Traffic()
        tiled_attention(q, k, v, B_r, B_c, causal=False, traffic=t)
        totals[M] = t.total
    assert 1.8 < totals[1024] / totals[2048] < 2.1 and 1.6 < totals[2048] / totals[4096] < 2.1
    full, half = Traffic(), Traffic()
    tiled_attention(q, k, v, 16, 16, causal=False, traffic=full)
    tiled_attention(q, k, v, 16, 16, causal=True, traffic=half)
    assert 0.45 < half.total / full.total < 0.6


def test_use_tiled_attention_on_models(tiny_gpt, tiny_modern):
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 3, 8, 1]])
    for model in (tiny_gpt(), tiny_modern()):
        with torch.no_grad():
            ref = model(ids)
            with use_tiled_attention(2, 3):
                tiled = model(ids)
            cache = KVCache(model.config.n_layers)
            with use_tiled_attention(4, 4):  # queries after cached keys: T < T_k
                model(ids[:, :5], cache=cache)
                cached = model(ids[:, 5:], cache=cache)
        torch.testing.assert_close(tiled, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cached, ref[:, 5:], atol=1e-5, rtol=1e-5)
    from gptlib import attention

    assert attention.attend.__module__ == "gptlib.attention"  # restored


def test_use_tiled_attention_holds_in_its_thread_and_closes_after_an_error(tiny_gpt):
    import threading

    from gptlib import attention

    model, ids = tiny_gpt(), torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad(), use_tiled_attention(2, 2) as tiled:
        got = []  # the other thread's logits (nothing, had it raised)
        other = threading.Thread(target=lambda: got.append(model(ids)))
        other.start()
        other.join()  # its layers used attend's own kernel
        assert len(got) == 1 and tiled.traffic.total == 0
        model(ids)
        assert tiled.traffic.total > 0
    with pytest.raises(RuntimeError, match="inside"), use_tiled_attention(2, 2):
        raise RuntimeError("inside the block")
    assert attention.kernels_open == 0 and attention.KERNEL.get() is None


def test_the_model_traces_as_one_graph_for_torch_compile(tiny_gpt):
    # a graph break costs a compiled model speed (attend's read of a ContextVar made six here)
    explained = torch._dynamo.explain(tiny_gpt().eval())(torch.tensor([[1, 5, 9, 2, 7]]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_tiled_attention_refuses_bad_input():
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, 0, 2)
    with pytest.raises(ValueError, match="more positions"):
        tiled_attention(q, k[..., :2, :], v[..., :2, :], 2, 2)
    with pytest.raises(ValueError, match="M must"):
        flash_block_sizes(0, 8)


# --- 13.2 speculative sampling --------------------------------------------------------------------


def random_conditionals(d_vocab, seed, zeros=False):
    """A distribution after every prefix, any function of the prefix (drawn once per prefix)."""
    table = {}

    def of(prefix):
        if prefix not in table:
            g = torch.Generator().manual_seed(hash((seed,) + prefix) % 2**31)
            p = torch.rand(d_vocab, generator=g, dtype=torch.float64) ** 3
            if zeros:
                p[torch.randint(d_vocab, (1,), generator=g)] = 0.0
            table[prefix] = p / p.sum()
        return table[prefix]

    return of


@pytest.mark.parametrize(
    "d_vocab, gamma, n", [(2, 1, 4), (3, 2, 3), (4, 3, 3), (3, 0, 3), (3, 5, 3)]
)
@pytest.mark.parametrize("zeros", [False, True])
def test_speculative_sampling_emits_the_target_distribution_exactly(d_vocab, gamma, n, zeros):
    p_of, q_of = random_conditionals(d_vocab, 1, zeros), random_conditionals(d_vocab, 2, zeros)
    emitted = emitted_distribution(p_of, q_of, gamma, n)
    assert abs(emitted.sum().item() - 1) < 1e-12
    assert (emitted - sequence_distribution(p_of, n, d_vocab)).abs().max() < 1e-12


def test_perturbed_acceptance_rule_is_caught(monkeypatch):
    p_of, q_of = random_conditionals(3, 1), random_conditionals(3, 2)
    rule = speculative.acceptance_probability
    monkeypatch.setattr(speculative, "acceptance_probability", lambda p, q, x: rule(p, q, x) ** 0.9)
    err = (emitted_distribution(p_of, q_of, 2, 3) - sequence_distribution(p_of, 3, 3)).abs().max()
    assert err > 1e-3


def test_residual_drawn_from_p_is_caught(monkeypatch):
    p_of, q_of = random_conditionals(3, 1), random_conditionals(3, 2)
    monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    err = (emitted_distribution(p_of, q_of, 2, 3) - sequence_distribution(p_of, 3, 3)).abs().max()
    assert err > 1e-3


@pytest.mark.slow
def test_speculative_round_samples_the_enumerated_law():
    # context-free p and q: the first emitted token of a round has law p, the round's length the
    # law of 1 + (number of leading drafts kept)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    gamma, N = 2, 4_000
    g = torch.Generator().manual_seed(0)
    firsts, lengths = [], []
    for _ in range(N):
        drafts = torch.multinomial(q.expand(gamma, 3), 1, generator=g)[:, 0]
        out = speculative_round(p.expand(gamma + 1, 3), q.expand(gamma, 3), drafts, g)
        firsts.append(int(out[0]))
        lengths.append(len(out))
    freq = torch.bincount(torch.tensor(firsts), minlength=3) / N
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / N).sqrt()).all()
    beta = torch.minimum(p, q).sum().item()
    mean, sd = (
        expected_tokens_per_pass(beta, gamma),
        torch.tensor(lengths, dtype=torch.float64).std().item(),
    )
    assert abs(sum(lengths) / N - mean) < 4 * sd / math.sqrt(N)


def test_expected_tokens_per_pass():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.6, 3) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_pass(1.5, 3)


def test_chi_square_power_against_tables():
    for df, level, table in [(5, 0.05, 11.070), (10, 0.001, 29.588), (20, 0.01, 37.566)]:
        crit, power = chi_square_power(0.0, df, level)
        assert crit == pytest.approx(table, rel=0.01)
        assert power == pytest.approx(level, rel=0.2)
    powers = [chi_square_power(lam, 20, 0.001)[1] for lam in (0, 10, 50, 200)]
    assert powers == sorted(powers) and powers[-1] > 0.999


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_speculative_decoding_gives_the_greedy_tokens(tiny_gpt, tiny_modern, gamma):
    prompt = torch.tensor([1, 2, 3, 4])
    for target, draft in ((tiny_gpt(0), tiny_gpt(1, n_layers=1)), (tiny_modern(0), tiny_modern(1))):
        out = speculative_generate(target, draft, prompt, 25, gamma, temperature=0.0)
        assert torch.equal(out.ids, generate(target, prompt, 25, temperature=0.0))
        assert out.passes < 25 or out.kept == 0
    bigram = BigramDraft(
        torch.randint(0, 512, (2000,), generator=torch.Generator().manual_seed(0)), 512
    )
    target = tiny_gpt(0)
    out = speculative_generate(target, bigram, prompt, 25, gamma, temperature=0.0)
    assert torch.equal(out.ids, generate(target, prompt, 25, temperature=0.0))


def test_a_draft_equal_to_the_target_is_always_kept(tiny_gpt):
    target = tiny_gpt(0)
    out = speculative_generate(
        target, target, torch.tensor([1, 2]), 20, 3, generator=torch.Generator().manual_seed(0)
    )
    assert out.kept == out.drafted and out.passes == 5  # 4 tokens per pass
    assert all(b == pytest.approx(1.0, abs=1e-5) for b in out.betas)


def test_speculative_generate_refuses_bad_input(tiny_gpt):
    target = tiny_gpt(0)
    with pytest.raises(ValueError, match="n_ctx"):
        speculative_generate(target, target, torch.tensor([1]), target.config.n_ctx, 2)
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(target, target, torch.tensor([1]), 3, -1)
    with pytest.raises(ValueError, match="ids"):
        speculative_generate(target, target, torch.tensor([[1]]), 3, 1)


def test_bigram_draft_counts():
    draft = BigramDraft(torch.tensor([0, 1, 0, 1, 1]), d_vocab=2, smoothing=0.0)
    torch.testing.assert_close(
        draft(torch.tensor([[0, 1]])).exp(), torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    )
    with pytest.raises(ValueError):
        BigramDraft(torch.tensor([0, 5]), d_vocab=2)


def test_kv_cache_crop_and_nbytes():
    cache = KVCache(2, capacity=8)
    for layer in range(2):
        cache.append(layer, torch.ones(1, 3, 6, 4), torch.ones(1, 3, 6, 4))
    assert cache.nbytes == 2 * 2 * 3 * 8 * 4 * 4
    cache.crop(2)
    assert len(cache) == 2 and cache.k[1].shape == (1, 3, 2, 4)
    with pytest.raises(ValueError, match="offset"):
        cache.crop(3)


# --- 13.3 quantization
# ------------------------------------------------------------------------------


def weights(shape=(48, 128), seed=0, heavy=False):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(*shape, generator=g) * 0.05
    if heavy:  # a few outliers, as real matrices have
        W = W * torch.exp(torch.randn(*shape, generator=g))
    return W


def test_q4_1_bytes_and_values_equal_ggufs():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from gguf.quants import quantize as gguf_quantize

    from gptlib.gguf import q4_1_roundtrip

    for W in (
        weights(),
        weights(heavy=True),
        torch.zeros(2, 64),
        torch.linspace(-1, 1, 64).reshape(2, 32),
    ):
        ours = q4_1_pack(W)
        theirs = gguf_quantize(W.numpy(), GGMLQuantizationType.Q4_1)
        assert ours == theirs.tobytes()
        back = dequantize(
            np.frombuffer(ours, dtype=np.uint8).reshape(theirs.shape), GGMLQuantizationType.Q4_1
        )
        assert torch.equal(blockwise_quantize(W, 4).values, torch.from_numpy(back))
        assert torch.equal(q4_1_roundtrip(W), torch.from_numpy(back))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_rounding_error_bound_holds(bits):
    for W in (weights(), weights(heavy=True), weights((4, 64)) * 1e-6):
        r = blockwise_quantize(W, bits)
        assert ((r.values - W).abs() <= error_bound(r, bits, blockwise=True)).all()
        assert (r.codes >= 0).all() and (r.codes <= 2**bits - 1).all()
        a = absmax_quantize(W, bits)
        assert ((a.values - W).abs() <= error_bound(a, bits, blockwise=False)).all()
        assert (a.codes.abs() <= 2 ** (bits - 1) - 1).all()


def test_quantizer_with_an_off_by_one_level_is_caught(monkeypatch):
    W = weights(heavy=True)
    right = quantize.blockwise_codes

    def off_by_one(x, bits=4, block=32):  # delta = (max - min) / 2^b: the top code clamps
        return right(x, bits + 1, block)[0].clamp(max=2**bits - 1), *right(x, bits + 1, block)[1:]

    monkeypatch.setattr(quantize, "blockwise_codes", off_by_one)
    r = quantize.blockwise_quantize(W, 4)
    assert not ((r.values - W).abs() <= error_bound(r, 4, blockwise=True)).all()


def test_uniform_noise_model_predicts_the_product_error():
    W = weights((256, 128), seed=1)
    X = weights((512, 256), seed=2) * 20
    for r in (absmax_quantize(W.T, 8), blockwise_quantize(W.T, 4), blockwise_quantize(W.T, 3)):
        E = r.values.T - W  # (d_in, d_out)
        measured = ((X.double() @ E.double()) ** 2).mean().item()
        predicted = product_noise_variance(X, r.step.T).mean().item()
        assert (
            0.85 < measured / predicted < 1.05
        )  # the block ends (min, max) are exact: a bit below


def test_quantize_model_keeps_vectors_and_counts_bytes(tiny_gpt):
    model = tiny_gpt()
    small, before, after = quantize_model(model, "absmax", 8)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    rows = sum(
        p.shape[0] if n.endswith(("W_E", "W_pos")) else p.shape[1]
        for n, p in model.named_parameters()
        if p.dim() == 2
    )
    assert before == 4 * matrices and after == matrices + 4 * rows  # int8, float32 scales
    assert torch.equal(small.ln_f.w, model.ln_f.w) and not torch.equal(small.W_E, model.W_E)
    assert small.W_U.data_ptr() == small.W_E.data_ptr() or torch.equal(small.W_U, small.W_E.T)
    # a peer written here: each row along the summed index (W_E and W_pos as they are, a weight
    # x @ W by its columns) rounded to the grid of its own delta = max|row| / 127
    peer = copy.deepcopy(model)
    with torch.no_grad():
        for name, W in peer.named_parameters():
            if W.dim() == 2:
                rows = W if name.endswith(("W_E", "W_pos")) else W.T  # a view: written in place
                delta = rows.abs().amax(dim=-1, keepdim=True) / 127
                assert bool((delta > 0).all())
                was = rows.clone()
                rows.copy_(delta * torch.round(rows / delta))
                assert bool(((rows - was).abs() <= delta / 2 * (1 + 1e-6)).all())  # half a step
        ids = torch.tensor([[1, 2, 3, 4]])
        for (name, p), q in zip(small.named_parameters(), peer.parameters()):
            assert torch.equal(p, q), name  # the same float32 operations: bit for bit
        assert torch.equal(small(ids), peer(ids))
    with pytest.raises(ValueError, match="method"):
        quantize_model(model, "int8", 8)


def test_quantizers_refuse_bad_input():
    with pytest.raises(ValueError, match="bits"):
        blockwise_quantize(torch.zeros(32), 9)
    with pytest.raises(ValueError, match="block"):
        blockwise_quantize(torch.zeros(30), 4)
    with pytest.raises(ValueError, match="finite"):
        absmax_quantize(torch.tensor([float("nan")]))


def chi_square_statistic(p, q, N, seed):
    """Pearson's statistic of N first tokens of a round (gamma = 1) against p."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.multinomial(q, N, replacement=True, generator=gen)
    _, tokens = speculative.accept_or_resample(p, q, x, gen)
    freq = torch.bincount(tokens, minlength=len(p)).double()
    return ((freq - N * p.double()) ** 2 / (N * p.double())).sum().item()


def test_statistical_check_passes_and_catches_a_broken_residual(monkeypatch):
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    crit, _ = chi_square_power(0.0, 3, 1e-3)
    assert chi_square_statistic(p, q, 20_000, 0) < crit
    monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    assert chi_square_statistic(p, q, 20_000, 0) > crit
