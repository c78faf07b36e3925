"""Tests for gptlib.mla: latent attention against its formula per head, absorption, the latent
cache."""

import math

import pytest
import torch

from gptlib.kvcache import KVCache
from gptlib.mla import LatentCache, MultiHeadLatentAttention, absorbed_weights, mla_model
from gptlib.modern import ModernConfig, apply_rope, rope_angles
from gptlib.recipes import ATTENTION_VARIANTS, attention_variant

pytestmark = pytest.mark.usefixtures("one_thread")


def layer(seed=0, **kw):
    torch.manual_seed(seed)
    args = {"d_model": 16, "n_heads": 4, "d_head": 6, "d_c": 10, "d_R": 4, **kw}
    attn = MultiHeadLatentAttention(
        args.pop("d_model"),
        args.pop("n_heads"),
        args.pop("d_head"),
        args.pop("d_c"),
        args.pop("d_R"),
        **args,
    ).double()
    with torch.no_grad():  # weights of order one, so that the patterns are far from uniform
        for p in attn.parameters():
            p.mul_(20)
    return attn


def by_formula(attn, x):
    """The layer computed head by head from its definition, with explicit loops."""
    B, T, _ = x.shape
    angles = rope_angles(T, attn.d_R, attn.rope_base)
    c = x @ attn.W_DKV  # (B, T, d_c)
    k_R = apply_rope(x @ attn.W_KR, angles)  # (B, T, d_R)
    out = torch.zeros_like(x)
    for h in range(attn.n_heads):
        W_Q, W_UK, W_UV, W_O = attn.head_weights(h)
        W_QR = attn.W_QR[:, h * attn.d_R : (h + 1) * attn.d_R]
        q, q_R = x @ W_Q, apply_rope(x @ W_QR, angles)
        K, V = c @ W_UK, c @ W_UV
        for b in range(B):
            for t in range(T):
                s = torch.stack([(q[b, t] @ K[b, j] + q_R[b, t] @ k_R[b, j]) for j in range(t + 1)])
                a = torch.softmax(s / math.sqrt(attn.d_head + attn.d_R), dim=0)  # (t + 1,)
                out[b, t] += (a @ V[b, : t + 1]) @ W_O
    return out


@pytest.mark.parametrize("fused", [True, False])
def test_unabsorbed_equals_the_formula(fused):
    attn = layer(fused=fused)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(attn(x), by_formula(attn, x))


def test_absorbed_equals_unabsorbed():
    attn = layer()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    y = attn(x)
    attn.absorb = True
    torch.testing.assert_close(attn(x), y)


def test_absorption_identities():
    attn = layer()
    x = torch.randn(5, 16, dtype=torch.float64)
    c = x @ attn.W_DKV
    W_QK, W_VO = absorbed_weights(attn)
    A = torch.softmax(torch.randn(5, 5, dtype=torch.float64), dim=-1)
    for h in range(attn.n_heads):
        W_Q, W_UK, W_UV, W_O = attn.head_weights(h)
        torch.testing.assert_close((x @ W_Q) @ (c @ W_UK).T, (x @ W_Q @ W_QK[h]) @ c.T)
        torch.testing.assert_close((A @ (c @ W_UV)) @ W_O, (A @ c) @ W_VO[h])
        assert torch.equal(W_QK[h], W_UK.T)
    # a broken absorption (the heads' key maps in the wrong order) fails
    wrong = W_QK.flip(0)
    h = 0
    W_Q, W_UK, _, _ = attn.head_weights(h)
    assert not torch.allclose((x @ W_Q) @ (c @ W_UK).T, (x @ W_Q @ wrong[h]) @ c.T)


def test_rope_on_the_keys_breaks_absorption():
    """Rotating K_h = c W_UK^h puts a position-dependent rotation between the factors: no single
    matrix absorbs it, which the decoupled key avoids."""
    attn = layer()
    x = torch.randn(16, 16, dtype=torch.float64)  # 256 scores for the 60 entries of M
    c = x @ attn.W_DKV
    angles = rope_angles(16, attn.d_head, attn.rope_base)
    W_Q, W_UK, _, _ = attn.head_weights(0)
    rotated = apply_rope(x @ W_Q, angles) @ apply_rope(c @ W_UK, angles).T  # (16, 16)
    # the best fixed matrix M with rotated = (x W_Q M) c^T, by least squares, misses
    qx = x @ W_Q  # (6, d_head)
    M = torch.linalg.lstsq(torch.kron(qx, c), rotated.reshape(-1, 1)).solution.reshape(
        attn.d_head, attn.d_c
    )
    assert (qx @ M @ c.T - rotated).abs().max() > 1e-3
    plain = qx @ (c @ W_UK).T  # without rotation the same fit is exact
    M0 = torch.linalg.lstsq(torch.kron(qx, c), plain.reshape(-1, 1)).solution.reshape(
        attn.d_head, attn.d_c
    )
    torch.testing.assert_close(qx @ M0 @ c.T, plain)


@pytest.mark.parametrize("absorb", [False, True])
def test_cache_decodes_as_the_full_pass(absorb):
    attn = layer(absorb=absorb)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    cache = LatentCache(n_layers=1, capacity=6)
    steps = [attn(x[:, :3], cache)] + [attn(x[:, t : t + 1], cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), attn(x))
    assert cache.allocated_numbers() == 2 * 6 * (10 + 4)  # B x positions x (d_c + d_R)


def test_model_with_cache_and_allocation():
    m = mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4).eval()
    ids = torch.tensor([[5, 3, 8, 1, 2]])
    cache = LatentCache(m.config.n_layers, capacity=5)
    with torch.no_grad():
        logits = torch.cat(
            [m(ids[:, :2], cache)] + [m(ids[:, t : t + 1], cache) for t in range(2, 5)], dim=1
        )
        torch.testing.assert_close(logits, m(ids), atol=1e-5, rtol=1e-5)
    assert cache.allocated_numbers() == m.config.n_layers * 5 * (8 + 4)
    with pytest.raises(ValueError, match="LatentCache"):
        m(ids, KVCache(m.config.n_layers))


def test_matched_variants():
    counts = {name: attention_variant(name).num_parameters() for name in ATTENTION_VARIANTS}
    assert max(counts.values()) - min(counts.values()) <= 256
    mla = ATTENTION_VARIANTS["mla"]
    assert (
        sum(mla[1])
        == 2 * ATTENTION_VARIANTS["gqa"][0].n_kv_heads * ATTENTION_VARIANTS["gqa"][0].d_head
    )


def test_errors():
    with pytest.raises(ValueError, match="d_R must be even"):
        MultiHeadLatentAttention(16, 4, 6, 10, 3)
    with pytest.raises(ValueError, match="absorb"):
        MultiHeadLatentAttention(16, 4, 6, 10, 4, absorb=1)
    cache = LatentCache(1, capacity=2)
    with pytest.raises(ValueError, match="append_latent"):
        cache.append(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    cache.append_latent(0, torch.zeros(1, 2, 3), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="capacity=2"):
        cache.append_latent(0, torch.zeros(1, 1, 3), torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="shape"):
        layer()(torch.zeros(1, 2, 15, dtype=torch.float64))
