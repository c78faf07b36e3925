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
    torch.testing.assert_close(
        out,
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        atol=1e-6,
        rtol=1e-5,
    )
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
        parts = [
            mha(X[:, :3], cache=cache),
            mha(X[:, 3:4], cache=cache),
            mha(X[:, 4:], cache=cache),
        ]
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
    # W_Q = 0: every score is 0, so row t averages rows 0..t; with W_V W_O = I the layer
    # outputs them.
    mha = MultiHeadAttention(4, 1, bias=False)
    with torch.no_grad():
        mha.W_Q.zero_()
        mha.W_V.copy_(torch.eye(4))
        mha.W_O.copy_(torch.eye(4))
        X = torch.arange(12.0).reshape(1, 3, 4)
        out, pattern = run_with_pattern(mha, X)
    expected = torch.tensor([[0.0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]])
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(
        pattern[0, 0], torch.tensor([[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]])
    )
    torch.testing.assert_close(mha(X), out)


def test_head_pattern_known_values_and_bilinear_form():
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    A = head_pattern(X, torch.eye(2), d_head=1)
    torch.testing.assert_close(
        A, torch.tensor([[1.0, 0.0], [1 / (1 + math.e), math.e / (1 + math.e)]])
    )
    torch.manual_seed(3)
    X, W_QK = torch.randn(5, 6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    scores = torch.tensor(
        [[float(X[i] @ W_QK @ X[j]) for j in range(5)] for i in range(5)], dtype=torch.float64
    )
    torch.testing.assert_close(
        head_pattern(X, W_QK, 4, causal=False), torch.softmax(scores / 2, dim=-1)
    )
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
    Y = (
        X + head_output(X, W1, W1, 1, pattern=A1)[0]
    )  # residual layer 1 (W_QK unused: pattern fixed)
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
        assert len(cache) == 0 and cache.k[1].shape == (
            2,
            2,
            7,
            4,
        )  # layer 0 untouched, layer 1 filled
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_readable_path_dropout_acts_on_the_hooked_pattern():
    torch.manual_seed(7)
    mha = MultiHeadAttention(8, 2, dropout=0.5, fused=False).train()
    X = torch.randn(1, 6, 8)
    with capture_patterns(mha) as seen:
        mha(X)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(1, 2, 6))  # recorded before dropout
    # a forward hook that returns a tensor replaces the pattern: a uniform causal pattern here
    uniform = softmax(torch.zeros(6, 6) + causal_mask(6)).expand(1, 2, 6, 6)
    handle = mha.hook_pattern.register_forward_hook(lambda m, args, out: uniform)
    mha.eval()
    with torch.no_grad():
        out = mha(X)
    handle.remove()
    v = (X @ mha.W_V + mha.b_V).view(1, 6, 2, 4).transpose(1, 2)
    z = (uniform @ v).transpose(1, 2).reshape(1, 6, 8)
    torch.testing.assert_close(out, z @ mha.W_O + mha.b_O)


def test_dropout_must_be_a_finite_probability():
    for p in (float("nan"), float("-inf"), 1.0, -0.1):
        with pytest.raises(ValueError, match="dropout"):
            MultiHeadAttention(8, 2, dropout=p)


# --- Q, K, V: three parameters, three products ------------------------------------------------
def test_qkv_is_three_products_of_the_current_parameters():
    torch.manual_seed(9)
    mha, x = MultiHeadAttention(8, 2), torch.randn(5, 8)
    assert list(mha.state_dict())[:4] == ["W_Q", "W_K", "W_V", "W_O"]  # the file format's names
    for b in (mha.b_Q, mha.b_K, mha.b_V):
        b.data.normal_()
    opt = torch.optim.AdamW(mha.parameters(), lr=0.1)
    mha(torch.randn(2, 4, 8)).square().sum().backward()
    opt.step()
    with torch.no_grad():
        mha.W_K[0, 0] = 5.0
    mha.load_state_dict(mha.state_dict(), assign=True)
    with torch.no_grad():
        got = mha.qkv(x)
    want = [x @ W + b for W, b in ((mha.W_Q, mha.b_Q), (mha.W_K, mha.b_K), (mha.W_V, mha.b_V))]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    plain = MultiHeadAttention(8, 2, bias=False)
    torch.testing.assert_close(plain.qkv(x)[1], x @ plain.W_K)


def test_attention_with_and_without_autograd_agree():
    torch.manual_seed(11)
    mha, X = MultiHeadAttention(8, 2), torch.randn(2, 6, 8)
    with torch.no_grad():
        inference = mha(X)
    torch.testing.assert_close(mha(X), inference, rtol=1e-6, atol=1e-6)


# --- the KV cache: buffers written in place -------------------------------------------------------
def test_kv_cache_buffers_are_allocated_once_and_written_in_place():
    cache = KVCache(2, capacity=6)
    k = torch.randn(1, 2, 3, 4)
    cache.append(1, k, -k)
    buffer = cache._k[1]
    for t in range(3):
        k_all, _ = cache.append(1, torch.full((1, 2, 1, 4), float(t)), torch.zeros(1, 2, 1, 4))
        assert cache._k[1] is buffer and k_all.data_ptr() == buffer.data_ptr()  # no reallocation
    assert cache.offset(1) == 6 and len(cache) == 0 and cache.k[0] is None
    torch.testing.assert_close(cache.k[1][:, :, :3], k)
    assert cache.k[1][0, 0, 3:, 0].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="capacity=6"):
        cache.append(1, k[:, :, :1], k[:, :, :1])
    cache.clear()
    assert cache.offset(1) == 0
    cache.append(1, k, k)
    assert cache._k[1] is buffer  # refilled in place


def test_kv_cache_without_capacity_grows_and_refuses_mismatches():
    cache = KVCache(1)
    keys = [torch.randn(2, 3, 1, 4) for _ in range(40)]
    for k in keys:
        k_all, _ = cache.append(0, k, k)
    torch.testing.assert_close(k_all, torch.cat(keys, dim=2))
    assert len(cache) == 40 and cache._k[0].shape[2] >= 40
    with pytest.raises(ValueError, match="does not continue"):
        cache.append(0, torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4))  # another batch size
    with pytest.raises(ValueError, match="does not continue"):
        cache.append(0, keys[0].double(), keys[0].double())
    with pytest.raises(ValueError, match="one shape"):
        cache.append(0, keys[0], keys[0][..., :2])
    with pytest.raises(ValueError, match="capacity"):
        KVCache(1, capacity=0)
    with pytest.raises(ValueError, match="layer"):
        cache.offset(1)


def test_switches_must_be_bools_and_the_layer_an_int():
    for kw in (
        dict(bias=1),
        dict(causal="yes"),
        dict(fused=None),
        dict(layer=True),
        dict(layer=1.0),
    ):
        with pytest.raises(ValueError, match=next(iter(kw))):
            MultiHeadAttention(8, 2, **kw)
    with pytest.raises(ValueError, match="layer"):
        KVCache(2).append(True, torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
