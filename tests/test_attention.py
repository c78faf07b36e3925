"""gptlib.attention: softmax, mask, attention, heads, the layer, the KV cache."""

import math

import pytest
import torch

from gptlib.attention import (
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    head_output,
    head_pattern,
    softmax,
)
from gptlib.hooks import capture_patterns


def run_with_pattern(mha, X, cache=None):
    """The layer's output and the pattern that passed through its hook_pattern."""
    with capture_patterns(mha) as seen:
        out = mha(X, cache)
    return out, seen[0]


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
        out, pattern = run_with_pattern(mha, X)
        assert mha.fused  # restored after recording
        torch.testing.assert_close(mha(X), out, atol=1e-6, rtol=1e-5)
        readable = MultiHeadAttention(12, 3, d_head=5, fused=False)
        readable.load_state_dict(mha.state_dict())
        assert not readable.fused and torch.equal(readable(X), out)
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
        steps = [run_with_pattern(mha, X[:, i : i + 1], cache)[0] for i in range(10)]
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


def test_attention_keeps_dtype_and_batch_dims():
    for dtype in (torch.float64, torch.bfloat16):
        q, k, v = (torch.randn(2, 3, 4, 8, dtype=dtype) for _ in range(3))
        out, pattern = attention(q, k, v, causal_mask(4))
        assert out.dtype == pattern.dtype == dtype
        assert out.shape == (2, 3, 4, 8) and pattern.shape == (2, 3, 4, 4)
    # T queries against T_k > T keys (the cached case): the mask offsets the queries
    q, k, v = torch.randn(2, 4), torch.randn(5, 4), torch.randn(5, 3)
    out, pattern = attention(q, k, v, causal_mask(2, 5))
    assert out.shape == (2, 3) and pattern[0, 4] == 0 and pattern[1, 4] > 0


def test_attention_bad_dims_name_the_argument():
    x = torch.randn(4, 8)
    for name, args in (("q", (x[0], x, x)), ("k", (x, x[0], x)), ("v", (x, x, x[0]))):
        with pytest.raises(ValueError, match=f"^{name} must"):
            attention(*args)
    with pytest.raises(ValueError, match="mask"):
        attention(x, x, x, causal_mask(3))
    attention(x, x, x, torch.zeros(4))  # a row vector broadcasts over the queries


def test_uniform_pattern_gives_running_mean():
    # W_Q = 0: every score is 0, so row t averages rows 0..t; with W_V W_O = I the layer outputs them.
    mha = MultiHeadAttention(4, 1, bias=False)
    with torch.no_grad():
        mha.W_Q.zero_()
        mha.W_V.copy_(torch.eye(4))
        mha.W_O.copy_(torch.eye(4))
        X = torch.arange(12.0).reshape(1, 3, 4)
        out, pattern = run_with_pattern(mha, X)
    expected = torch.tensor([[0.0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]])
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(pattern[0, 0], torch.tensor([[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]]))
    torch.testing.assert_close(mha(X), out)


def test_head_pattern_known_values_and_bilinear_form():
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    A = head_pattern(X, torch.eye(2), d_head=1)
    torch.testing.assert_close(A, torch.tensor([[1.0, 0.0], [1 / (1 + math.e), math.e / (1 + math.e)]]))
    torch.manual_seed(3)
    X, W_QK = torch.randn(5, 6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    scores = torch.tensor([[float(X[i] @ W_QK @ X[j]) for j in range(5)] for i in range(5)], dtype=torch.float64)
    torch.testing.assert_close(head_pattern(X, W_QK, 4, causal=False), torch.softmax(scores / 2, dim=-1))
    assert head_pattern(X, W_QK, 4).dtype == torch.float64


def test_head_output_sums_to_the_layer_and_ranks_are_bounded():
    torch.manual_seed(4)
    mha = MultiHeadAttention(12, 3, d_head=2, bias=False)
    X = torch.randn(2, 5, 12)
    with torch.no_grad():
        total = sum(head_output(X, mha.W_QK(h), mha.W_OV(h), mha.d_head)[0] for h in range(3))
        torch.testing.assert_close(total, mha(X), atol=1e-6, rtol=1e-5)
        _, pattern = run_with_pattern(mha, X)
        torch.testing.assert_close(head_output(X, mha.W_QK(1), mha.W_OV(1), 2)[1], pattern[:, 1])
        for h in range(3):  # generic weights: the rank is exactly d_head, far below d_model
            assert int(torch.linalg.matrix_rank(mha.W_QK(h))) == 2
            assert int(torch.linalg.matrix_rank(mha.W_OV(h))) == 2


def test_fixed_pattern_heads_compose_with_residual_terms():
    torch.manual_seed(5)
    T, d = 6, 5
    X = torch.randn(T, d, dtype=torch.float64)
    W1, W2 = torch.randn(d, d, dtype=torch.float64), torch.randn(d, d, dtype=torch.float64)
    A1, A2 = (softmax(torch.randn(T, T, dtype=torch.float64) + causal_mask(T)) for _ in range(2))
    Y = X + head_output(X, W1, W1, 1, pattern=A1)[0]  # residual layer 1 (W_QK unused: pattern fixed)
    Z = Y + head_output(Y, W2, W2, 1, pattern=A2)[0]  # residual layer 2
    expanded = X + A1 @ X @ W1 + A2 @ X @ W2 + (A2 @ A1) @ X @ (W1 @ W2)
    torch.testing.assert_close(Z, expanded)


def test_head_functions_reject_bad_shapes():
    X, W = torch.randn(4, 3), torch.eye(3)
    with pytest.raises(ValueError, match="^X must"):
        head_pattern(X[0], W, 1)
    with pytest.raises(ValueError, match="^W_QK must"):
        head_pattern(X, torch.eye(4), 1)
    with pytest.raises(ValueError, match="^d_head must"):
        head_pattern(X, W, 0)
    with pytest.raises(ValueError, match="^W_OV must"):
        head_output(X, W, torch.eye(2), 1)
    with pytest.raises(ValueError, match="^pattern must"):
        head_output(X, W, W, 1, pattern=torch.eye(3))


def test_readable_path_with_cache_equals_fast_path_float64():
    torch.manual_seed(6)
    mha = MultiHeadAttention(8, 2, layer=1).double()
    with torch.no_grad():
        for b in (mha.b_Q, mha.b_K, mha.b_V, mha.b_O):
            b.normal_()
        X = torch.randn(2, 7, 8, dtype=torch.float64)
        full = mha(X)
        cache = KVCache(2)
        steps = []
        for t in range(7):
            out, pattern = run_with_pattern(mha, X[:, t : t + 1], cache)
            assert pattern.shape == (2, 2, 1, t + 1)
            steps.append(out)
        assert len(cache) == 0 and cache.k[1].shape == (2, 2, 7, 4)  # layer 0 untouched, layer 1 filled
    torch.testing.assert_close(torch.cat(steps, 1), full)
