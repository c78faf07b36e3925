"""gptlib.attention: softmax, mask, attention, heads, the layer, the KV cache."""

import math

import pytest
import torch

from gptlib.attention import KVCache, MultiHeadAttention, attention, causal_mask, softmax


def test_softmax_rows_stable_and_known():
    x = torch.tensor([[0.0, math.log(3.0)], [1e4, 1e4]])
    torch.testing.assert_close(softmax(x), torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    y = torch.randn(4, 7, dtype=torch.float64)
    torch.testing.assert_close(softmax(y), torch.softmax(y, dim=-1))
    torch.testing.assert_close(softmax(y, dim=0), torch.softmax(y, dim=0))


def test_causal_mask_shapes_and_offset():
    assert torch.equal(causal_mask(3) == 0, torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    m = causal_mask(2, 4)  # two new queries at positions 2, 3 of 4
    assert torch.equal(m == 0, torch.tensor([[True, True, True, False], [True, True, True, True]]))
    with pytest.raises(ValueError, match="T_k"):
        causal_mask(3, 2)
    with pytest.raises(ValueError, match="T"):
        causal_mask(0)


def test_attention_function_matches_sdpa():
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    out, pattern = attention(q, k, v, causal_mask(5))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 3, 5))
    with pytest.raises(ValueError, match="d_head"):
        attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="positions"):
        attention(q, k, v[..., :4, :])


def test_layer_is_sum_of_heads_with_low_rank_matrices():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, bias=False)
    X = torch.randn(1, 6, 16)
    with torch.no_grad():
        total = 0
        for h in range(4):
            Wq, Wk, Wv, Wo = mha.head_weights(h)
            A = softmax(X[0] @ mha.W_QK(h) @ X[0].T / 2.0 + causal_mask(6))
            total = total + A @ X[0] @ mha.W_OV(h)
            assert int(torch.linalg.matrix_rank(mha.W_QK(h))) <= mha.d_head
        torch.testing.assert_close(mha(X)[0], total, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="h must"):
        mha.head_weights(4)


def test_fast_and_readable_paths_agree_and_pattern_shape():
    torch.manual_seed(1)
    mha = MultiHeadAttention(12, 3, d_head=5)
    X = torch.randn(2, 7, 12)
    with torch.no_grad():
        out, pattern = mha(X, return_pattern=True)
        torch.testing.assert_close(mha(X), out, atol=1e-6, rtol=1e-5)
    assert pattern.shape == (2, 3, 7, 7) and out.dtype == X.dtype


def test_causality_by_perturbation():
    mha = MultiHeadAttention(8, 2)
    X = torch.randn(1, 6, 8)
    Y = X.clone()
    Y[:, 4:] += 1.0
    with torch.no_grad():
        assert torch.equal(mha(X)[:, :4], mha(Y)[:, :4])


def test_kv_cache_equals_full_pass():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2)
    X = torch.randn(3, 10, 8)
    with torch.no_grad():
        full = mha(X)
        cache = KVCache(1)
        parts = [mha(X[:, :3], cache=cache), mha(X[:, 3:4], cache=cache), mha(X[:, 4:], cache=cache)]
        assert len(cache) == 10
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-6, rtol=1e-5)
        cache = KVCache(1)
        steps = [mha(X[:, i : i + 1], cache=cache, return_pattern=True)[0] for i in range(10)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="layer"):
        KVCache(1).append(1, torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="n_layers"):
        KVCache(0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match="x must"):
        MultiHeadAttention(8, 2)(torch.randn(4, 8))
    with pytest.raises(ValueError, match="x must"):
        MultiHeadAttention(8, 2)(torch.randn(1, 4, 9))
