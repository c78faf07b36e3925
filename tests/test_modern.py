"""Tests for gptlib.modern: RoPE, RMSNorm, SwiGLU, grouped-query attention and the Llama-style
model."""

import pytest
import torch
import torch.nn.functional as F

from gptlib.attention import attention, causal_mask, repeat_kv
from gptlib.block import layer_norm
from gptlib.circuits import induction_score, previous_token_score, score_table
from gptlib.hooks import capture_patterns
from gptlib.kvcache import KVCache
from gptlib.modern import (
    GroupedQueryAttention,
    ModernConfig,
    ModernGPT,
    RMSNorm,
    SwiGLU,
    apply_rope,
    kv_cache_bytes,
    logit_lens,
    rms_norm,
    rope_angles,
    swiglu,
)
from gptlib.positional import relative_rotation
from gptlib.sampling import generate


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return ModernGPT(ModernConfig.preset("tiny", **overrides)).eval()


# --- RoPE -----------------------------------------------------------------------------------------
def test_rope_is_right_multiplication_by_the_transposed_relative_rotation():
    torch.manual_seed(0)
    d, base = 8, 100.0
    x = torch.randn(5, d, dtype=torch.float64)
    rotated = apply_rope(x, rope_angles(5, d, base))
    for m in range(5):
        torch.testing.assert_close(rotated[m], x[m] @ relative_rotation(m, d, base).T)


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(1)
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    angles = rope_angles(40, d, 10000.0)
    Q, K = apply_rope(q.expand(40, d), angles), apply_rope(k.expand(40, d), angles)
    S = Q @ K.T  # S[m, n] = q_m . k_n
    for delta in (0, 1, 7, 30):
        diag = S.diagonal(offset=-delta)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=0, atol=1e-12)
    # and the dot product is not shift-invariant without the rotation's relative property: it
    # varies with delta
    assert S.diagonal(offset=-1)[0] != pytest.approx(S.diagonal(offset=-7)[0])


def test_rope_preserves_norms_and_offset_matches_slice():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 6, 8)
    y = apply_rope(x, rope_angles(6, 8))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(
        apply_rope(x[..., 4:, :], rope_angles(2, 8, offset=4)), y[..., 4:, :]
    )


def _rope_by_pairs(x, angles):
    """The rotation written pair by pair, as the definition reads (the reference of the next
    test): (x_2i cos a - x_2i+1 sin a, x_2i sin a + x_2i+1 cos a)."""
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_rope_equals_the_pairwise_formula_bit_for_bit(dtype):
    # apply_rope computes x * (cos, cos) + (x_2i+1, x_2i) * (-sin, sin): the same products and
    # sums (a + (-b) is a - b; the odd coordinate adds its two products in the other order), so
    # the same numbers, here for every finite input, transposed (strided) input included; its
    # output is contiguous, as the pairs' stack made it, so that the products after it take the
    # same path
    torch.manual_seed(5)
    x = (torch.randn(2, 7, 3, 16) * 5).to(dtype).transpose(1, 2)  # (B, H, T, d), strided
    x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, -0.0, 0.0], dtype=dtype)
    angles = rope_angles(7, 16, offset=11)
    got, want = apply_rope(x, angles), _rope_by_pairs(x, angles)
    assert got.is_contiguous() and got.dtype == dtype
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    assert torch.equal(got.view(bits[got.element_size()]), want.view(bits[got.element_size()]))
    assert not torch.equal(got, _rope_by_pairs(x, -angles))  # the inverse rotation is another


def test_rope_bad_arguments():
    with pytest.raises(ValueError, match="T must"):
        rope_angles(0, 8)
    with pytest.raises(ValueError, match="offset"):
        rope_angles(2, 8, offset=-1)
    with pytest.raises(ValueError, match="d_model must be a positive even"):
        rope_angles(2, 7)
    with pytest.raises(ValueError, match="angles must have shape"):
        apply_rope(torch.zeros(3, 8), rope_angles(2, 8))


# --- RMSNorm and SwiGLU
# ------------------------------------------------------------------------------
def test_rms_norm_equals_layer_norm_on_centred_rows_and_torch():
    torch.manual_seed(3)
    x = torch.randn(4, 10)
    w = torch.randn(10)
    centred = x - x.mean(dim=-1, keepdim=True)
    torch.testing.assert_close(rms_norm(centred, w, 1e-5), layer_norm(centred, w, None, 1e-5))
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (10,), w, 1e-6))
    assert not torch.allclose(
        rms_norm(x, w), layer_norm(x, w, None)
    )  # they differ when the mean is not 0
    torch.testing.assert_close(RMSNorm(10)(x).pow(2).mean(-1), torch.ones(4), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="d_model"):
        RMSNorm(0)


def test_swiglu_formula_and_parameter_count():
    torch.manual_seed(4)
    mlp = SwiGLU(6, 16)
    x = torch.randn(3, 6)
    g = x @ mlp.W_gate
    expected = (g * torch.sigmoid(g) * (x @ mlp.W_up)) @ mlp.W_out
    torch.testing.assert_close(mlp(x), expected)
    torch.testing.assert_close(swiglu(x, mlp.W_gate, mlp.W_up, mlp.W_out), expected)
    assert sum(p.numel() for p in mlp.parameters()) == 3 * 6 * 16
    with pytest.raises(ValueError, match="d_mlp"):
        SwiGLU(6, 0)


# --- grouped-query attention ---------------------------------------------------------------------
def test_gqa_equals_multi_head_attention_with_copied_kv_heads():
    torch.manual_seed(5)
    gqa = GroupedQueryAttention(16, 4, 2, 4)
    mha = GroupedQueryAttention(16, 4, 4, 4)  # one head per group: multi-head attention
    with torch.no_grad():
        mha.W_Q.copy_(gqa.W_Q)
        mha.W_O.copy_(gqa.W_O)
        mha.W_K.copy_(gqa.W_K.unflatten(1, (2, 4)).repeat_interleave(2, dim=1).flatten(1))
        mha.W_V.copy_(gqa.W_V.unflatten(1, (2, 4)).repeat_interleave(2, dim=1).flatten(1))
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(gqa(x), mha(x))
    for h in range(4):
        assert all(torch.equal(a, b) for a, b in zip(gqa.head_weights(h), mha.head_weights(h)))


def test_gqa_with_one_head_per_group_is_the_multi_head_formula():
    torch.manual_seed(6)
    att = GroupedQueryAttention(12, 3, 3, 4, rope_base=50.0)
    x = torch.randn(1, 5, 12)
    angles = rope_angles(5, 4, 50.0)
    heads = []
    for h in range(3):
        W_Q, W_K, W_V, W_O = att.head_weights(h)
        z, _ = attention(
            apply_rope(x @ W_Q, angles), apply_rope(x @ W_K, angles), x @ W_V, causal_mask(5)
        )
        heads.append(z @ W_O)
    torch.testing.assert_close(att(x), sum(heads), atol=1e-6, rtol=1e-5)


def test_fused_and_readable_paths_agree_and_patterns_are_captured():
    model = tiny_model()
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    fused = model(ids)
    with capture_patterns(model) as patterns:
        readable = model(ids)
    torch.testing.assert_close(fused, readable, atol=1e-5, rtol=1e-5)
    assert len(patterns) == 2 and patterns[0].shape == (2, 4, 9, 9)
    torch.testing.assert_close(patterns[0].sum(-1), torch.ones(2, 4, 9))
    assert patterns[1].triu(1).abs().max() == 0  # causal
    assert all(blk.attn.fused for blk in model.blocks)


def test_repeat_kv_and_cache_memory():
    k = torch.arange(6.0).view(1, 3, 2, 1)
    assert repeat_kv(k, 2)[0, :, 0, 0].tolist() == [0.0, 0.0, 2.0, 2.0, 4.0, 4.0]
    assert kv_cache_bytes(30, 3, 64, 8192) * 3 == kv_cache_bytes(30, 9, 64, 8192)
    with pytest.raises(ValueError, match="group"):
        repeat_kv(k, 0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        kv_cache_bytes(1, 0, 1, 1)
    with pytest.raises(ValueError, match="must divide n_heads"):
        GroupedQueryAttention(16, 4, 3, 4)
    with pytest.raises(ValueError, match="even"):
        GroupedQueryAttention(15, 5, 5, 3)


def test_kv_cache_stores_kv_heads_and_matches_full_forward():
    model = tiny_model(1)
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    cache = KVCache(2)
    first = model(ids[:, :6], cache=cache)
    steps = [model(ids[:, t : t + 1], cache=cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.k[0].shape == (1, 2, 10, 8)  # n_kv_heads = 2 heads of d_head = 8
    a = generate(model, ids[0, :3], 12, temperature=0.0)
    b = generate(model, ids[0, :3], 12, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(
        generate(model, ids[0, :3], 5, generator=g1),
        generate(model, ids[0, :3], 5, generator=g2, use_cache=False),
    )


# --- the model
# -------------------------------------------------------------------------------------
def test_config_presets_and_errors():
    c = ModernConfig.preset("smollm2-135m")
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_mlp) == (
        576,
        30,
        9,
        3,
        64,
        1536,
    )
    with torch.device("meta"):
        n = ModernGPT(c).num_parameters()
    assert n == 134_515_008  # SmolLM2-135M, tied embedding counted once
    with pytest.raises(ValueError, match="name must be one of"):
        ModernConfig.preset("nope")
    with pytest.raises(ValueError, match="n_kv_heads=2 must divide n_heads=3"):
        ModernConfig(d_model=12, n_heads=3, n_kv_heads=2)
    with pytest.raises(ValueError, match="d_head must be a positive even"):
        ModernConfig(d_model=15, n_heads=5, n_kv_heads=5)
    with pytest.raises(ValueError, match="rope_base"):
        ModernConfig(rope_base=1.0)
    with pytest.raises(ValueError, match="config must be"):
        ModernGPT("tiny")


def test_forward_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="ids must be"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="cache has 3 layers"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=KVCache(3))


def test_save_load_round_trip_and_bad_files(tmp_path):
    model = tiny_model(2)
    path = model.save(tmp_path / "m.safetensors")
    loaded = ModernGPT.load(path)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(loaded(ids), model(ids))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a valid safetensors"):
        ModernGPT.load(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError):
        ModernGPT.load(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    from gptlib.files import read_file, write_file

    tensors, fields = read_file(path)  # one gptlib file: the config is inside (gptlib.files)
    part = {k: v for k, v in tensors.items() if k != "blocks.1.mlp.W_up"}
    write_file(tmp_path / "part.safetensors", part, fields)
    with pytest.raises(
        ValueError, match=r"part.safetensors lacks tensor\(s\) \['blocks.1.mlp.W_up'\]"
    ):
        ModernGPT.load(tmp_path / "part.safetensors")
    save_file(tensors, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ValueError, match="nometa.safetensors is not a gptlib file"):
        ModernGPT.load(tmp_path / "nometa.safetensors")
    with pytest.raises(ValueError, match="field 'model' is 'GPT', not 'ModernGPT'"):
        ModernGPT.load(
            write_file(tmp_path / "gpt.safetensors", tensors, {**fields, "model": "GPT"})
        )


def test_logit_lens_last_row_is_the_logits():
    model = tiny_model(3)
    ids = torch.tensor([[5, 6, 7, 8]])
    lens = logit_lens(model, ids)
    assert lens.shape == (3, 1, 4, 300)
    torch.testing.assert_close(lens[-1], model(ids))
    torch.testing.assert_close(lens[0], model.ln_f(model.W_E[ids]) @ model.W_U)
    torch.testing.assert_close(logit_lens(model, ids, position=-1), lens[:, :, -1])


def test_head_scores_of_modern_gpt_are_the_circuits_scores():
    """Chapter 12 reads its heads with gptlib.circuits, the one definition of the scores: on a
    random block r repeated ([r, r], no token twice in r) the induction pairs are (i, i - R + 1),
    i >= R."""
    model, R = tiny_model(4), 7
    r = torch.randperm(300, generator=torch.Generator().manual_seed(4))[:R]
    ids = torch.cat([r, r])[None]  # (1, 2R)
    with torch.no_grad(), capture_patterns(model) as seen:
        model(ids)
    A = torch.stack(seen, dim=1)  # (1, n_layers, n_heads, 2R, 2R)
    table = score_table(A, ids)
    diagonal = A[0].diagonal(offset=-(R - 1), dim1=-2, dim2=-1)[
        ..., 1:
    ]  # A[i, i - R + 1], i = R .. 2R - 1
    torch.testing.assert_close(table["induction"], diagonal.mean(-1))
    torch.testing.assert_close(table["induction"], induction_score(A[0], ids[0].tolist()))
    torch.testing.assert_close(table["previous-token"], previous_token_score(A[0]))
    torch.testing.assert_close(
        table["previous-token"], A[0].diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
    )


# --- issue 24: floats finite and in range
# --------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("ln_eps", float("nan")),
        ("ln_eps", float("inf")),
        ("rope_base", float("inf")),
        ("rope_base", float("nan")),
        ("rope_base", 1.0),
        ("d_model", 32.0),
        ("tie_weights", 1),
    ],
)
def test_config_values_finite_in_range_and_typed(field, value):
    with pytest.raises(ValueError, match=field):
        ModernConfig.preset("tiny", **{field: value})


def test_rms_norm_eps_must_be_finite():
    for eps in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            RMSNorm(4, eps=eps)
    with pytest.raises(ValueError, match="rope_base"):
        GroupedQueryAttention(16, 4, 2, 4, rope_base=float("inf"))
    with pytest.raises(ValueError, match="base"):
        rope_angles(4, 8, base=float("nan"))
