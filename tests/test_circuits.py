"""Tests for gptlib.circuits: scores on hand-made patterns with known values, composition,
copying."""

import math

import pytest
import torch

from gptlib.attention import MultiHeadAttention
from gptlib.circuits import (
    ablate_heads,
    composition_score,
    composition_scores,
    copying_score,
    diagonal_argmax_rate,
    first_token_score,
    induction_score,
    k_composition,
    previous_token_score,
    q_composition,
    repeated_sequences,
    score_table,
    uniform_causal_pattern,
    v_composition,
)


def shifted_pattern(T: int, offset: int) -> torch.Tensor:
    """Row t puts all its weight on key t - offset (on key 0 where t < offset)."""
    A = torch.zeros(T, T)
    for t in range(T):
        A[t, max(t - offset, 0)] = 1.0
    return A


def test_repeated_sequences_repeat_and_are_seeded():
    a = repeated_sequences(4, 7, 11, torch.Generator().manual_seed(5))
    b = repeated_sequences(4, 7, 11, torch.Generator().manual_seed(5))
    assert a.shape == (4, 14) and torch.equal(a, b)
    assert torch.equal(a[:, :7], a[:, 7:]) and int(a.min()) >= 0 and int(a.max()) < 11
    tiled = repeated_sequences(3, 4, 9, torch.Generator().manual_seed(0), total=10)
    assert tiled.shape == (3, 10) and torch.equal(tiled[:, 4:], tiled[:, :-4])


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(n=0), "n"),
        (dict(length=0), "length"),
        (dict(d_vocab=-1), "d_vocab"),
        (dict(total=0), "total"),
        (dict(length=2.5), "length"),
    ],
)
def test_repeated_sequences_errors(kw, name):
    args = dict(n=2, length=3, d_vocab=5) | kw
    with pytest.raises(ValueError, match=name):
        repeated_sequences(**args)


def test_score_table_on_hand_made_heads():
    L = 4
    ids = repeated_sequences(
        3, L, 1000, torch.Generator().manual_seed(0)
    )  # (3, 8), no repeat inside r
    assert all(len(set(seq[:L])) == L for seq in ids.tolist())
    heads = torch.stack(
        [shifted_pattern(2 * L, 1), shifted_pattern(2 * L, L - 1), shifted_pattern(2 * L, 2 * L)]
    )
    table = score_table(
        heads[None, None].expand(3, 1, 3, 2 * L, 2 * L), ids
    )  # one layer of 3 heads, batch of 3
    torch.testing.assert_close(table["previous-token"][0], torch.tensor([1.0, 1 / 7, 1 / 7]))
    torch.testing.assert_close(table["induction"][0], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(
        table["first-token"][0], torch.tensor([1 / 7, 3 / 7, 1.0])
    )  # rows 1-3 of the second head sit on key 0


def test_score_table_chance_on_repeats():
    T, L = 48, 24
    ids = repeated_sequences(2, L, 10_000, torch.Generator().manual_seed(1))
    assert all(len(set(seq[:L])) == L for seq in ids.tolist())
    U = uniform_causal_pattern(T).expand(2, 1, 1, T, T)
    table = score_table(U, ids)
    assert math.isclose(
        float(table["previous-token"]),
        sum(1 / (t + 1) for t in range(1, T)) / (T - 1),
        rel_tol=1e-9,
    )
    assert math.isclose(
        float(table["induction"]), sum(1 / (t + 1) for t in range(L, T)) / L, rel_tol=1e-9
    )


def test_score_table_averages_the_batch():
    p = torch.stack([uniform_causal_pattern(6).float(), shifted_pattern(6, 1)])  # two heads
    ids = torch.tensor([[1, 2, 3, 1, 2, 3], [4, 5, 4, 5, 4, 5]])
    batch = torch.stack([p[None], p.flip(0)[None]])  # (2, 1, 2, 6, 6)
    table = score_table(batch, ids)
    assert table["previous-token"].shape == (1, 2)
    expected = (float(previous_token_score(uniform_causal_pattern(6))) + 1.0) / 2
    assert math.isclose(float(table["previous-token"][0, 0]), expected, rel_tol=1e-6)
    ind = (
        induction_score(batch[0], ids[0].tolist()) + induction_score(batch[1], ids[1].tolist())
    ) / 2
    torch.testing.assert_close(table["induction"], ind)
    torch.testing.assert_close(
        score_table(batch[0], ids[0])["first-token"], first_token_score(batch[0])
    )


def test_errors():
    U = uniform_causal_pattern(4).expand(1, 1, 4, 4)
    with pytest.raises(ValueError, match="patterns"):
        score_table(uniform_causal_pattern(4), torch.tensor([1, 2, 1, 2]))
    with pytest.raises(ValueError, match="ids"):
        score_table(U, torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError, match="ids"):
        score_table(U, torch.tensor([1, 2, 3, 4]))  # no repeat
    with pytest.raises(ValueError, match="W_A"):
        composition_score(torch.zeros(3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="W_B"):
        composition_score(torch.zeros(3, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="M"):
        copying_score(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="M"):
        diagonal_argmax_rate(torch.zeros(3))
    with pytest.raises(ValueError, match="kind"):
        composition_scores(MultiHeadAttention(8, 2), MultiHeadAttention(8, 2), kind="X")


def test_composition_known_values():
    d = 4
    P = torch.zeros(d, d)
    P[0, 0] = 1.0
    Q = torch.zeros(d, d)
    Q[1, 1] = 1.0
    assert float(composition_score(P, P)) == 1.0 and float(composition_score(P, Q)) == 0.0
    # K-composition: W_QK^2 (W_OV^1)^T; the earlier head writes direction 1, the later head's
    # keys read it.
    W_OV1 = torch.zeros(d, d)
    W_OV1[0, 1] = 1.0  # reads direction 0, writes direction 1
    W_QK2 = torch.zeros(d, d)
    W_QK2[2, 1] = 1.0  # queries along 2 match keys along 1
    assert float(k_composition(W_QK2, W_OV1)) == 1.0
    assert float(q_composition(W_QK2, W_OV1)) == 0.0  # the queries read direction 2, not 1
    W_OV2 = torch.zeros(d, d)
    W_OV2[1, 3] = 1.0  # reads direction 1 (what head 1 wrote), writes 3
    assert float(v_composition(W_OV2, W_OV1)) == 1.0 and float(v_composition(W_OV1, W_OV2)) == 0.0
    torch.testing.assert_close(k_composition(W_QK2, W_OV1), composition_score(W_QK2, W_OV1.T))


def test_k_composition_is_the_term_in_the_scores():
    g = torch.Generator().manual_seed(0)
    W_QK2, W_OV1 = torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g)
    X, Y = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    extra = (
        X @ W_QK2 @ (Y @ W_OV1).T
    )  # what the earlier head's output adds to the later head's key scores
    torch.testing.assert_close(extra, X @ (W_QK2 @ W_OV1.T) @ Y.T)


def test_composition_scores_table_and_random_level():
    torch.manual_seed(0)
    a, b = MultiHeadAttention(64, 4), MultiHeadAttention(64, 4)
    table = composition_scores(a, b, "K")
    assert table.shape == (4, 4)
    torch.testing.assert_close(table[1, 2], k_composition(b.W_QK(2), a.W_OV(1)).detach())
    torch.testing.assert_close(
        composition_scores(a, b, "V")[3, 0], v_composition(b.W_OV(0), a.W_OV(3)).detach()
    )
    torch.testing.assert_close(
        composition_scores(a, b, "Q")[0, 1], q_composition(b.W_QK(1), a.W_OV(0)).detach()
    )
    assert abs(float(table.mean()) - 1 / 8) < 0.02  # random heads: about 1/sqrt(d_model)


def test_copying_and_diagonal():
    assert float(copying_score(torch.eye(5))) == pytest.approx(1.0)
    assert float(copying_score(-torch.eye(5))) == pytest.approx(-1.0)
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: no copying
    assert float(copying_score(rot)) == pytest.approx(0.0, abs=1e-7)
    assert float(diagonal_argmax_rate(torch.eye(6))) == 1.0
    assert float(diagonal_argmax_rate(torch.ones(4, 4) - torch.eye(4))) == 0.0


# --- the attention-only model that Chapter 8 trains (GPTConfig.attn_only) ---


def test_attention_only_block_is_x_plus_attention():
    from gptlib.block import Block
    from gptlib.config import GPTConfig

    torch.manual_seed(0)
    blk = Block(GPTConfig(d_model=8, n_heads=2, attn_only=True)).eval()
    assert blk.mlp is None and blk.ln_2 is None
    X = torch.randn(2, 5, 8)  # (B, T, d_model)
    torch.testing.assert_close(blk(X), X + blk.attn(blk.ln_1(X)))
    with pytest.raises(ValueError, match="attn_only"):
        GPTConfig(d_model=8, n_heads=2, block="post_ln", attn_only=True)


def test_attention_only_gpt(tmp_path):
    from gptlib.model import GPT, GPTConfig

    cfg = GPTConfig(d_vocab=16, n_ctx=8, d_model=16, n_heads=2, n_layers=2, attn_only=True)
    torch.manual_seed(0)
    m = GPT(cfg).eval()
    assert not any("mlp" in name or "ln_2" in name for name, _ in m.named_parameters())
    ids = repeated_sequences(2, 4, 16, torch.Generator().manual_seed(0))
    assert m.attention_patterns(ids).shape == (2, 2, 2, 8, 8)
    loaded = GPT.load(m.save(tmp_path / "toy"))
    assert loaded.config.attn_only
    torch.testing.assert_close(loaded(ids), m(ids))
    with pytest.raises(ValueError, match="attn_only"):
        GPTConfig(
            d_vocab=16, n_ctx=8, d_model=16, n_heads=2, n_layers=2, attn_only=True, block="parallel"
        )


# --- ablation -------------------------------------------------------------------------------------
def _attention_output(model, layer, x):
    with torch.no_grad():
        return model.blocks[layer].attn(x)


def test_ablating_heads_removes_exactly_their_terms_gpt():
    """A layer's output is b_O plus one term per head: zeroing head h takes away its term, the terms
    of all heads add up to the output less b_O, and the weights come back bit for bit."""
    from gptlib.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    with torch.no_grad():
        model.blocks[1].attn.b_O.normal_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 7, model.config.d_model)
    out = _attention_output(model, 1, x)
    n = model.config.n_heads
    terms = []
    for h in range(n):
        with ablate_heads(model, [(1, h)]):
            terms.append(out - _attention_output(model, 1, x))
    with ablate_heads(model, [(1, h) for h in range(n)]):
        none = _attention_output(model, 1, x)
    torch.testing.assert_close(none, model.blocks[1].attn.b_O.detach().expand_as(none))
    torch.testing.assert_close(sum(terms), out - none, atol=1e-5, rtol=1e-5)
    assert all(float(t.abs().max()) > 1e-3 for t in terms)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="inside"), ablate_heads(model, [(0, 2)]):
        raise RuntimeError("an error inside the block")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_ablating_a_query_head_of_grouped_query_attention():
    """In GQA a head is a query head: zeroing it leaves the sum of the other heads, each computed
    by hand from head_weights (its own W_Q^h and W_O^h, its group's W_K, W_V), RoPE applied."""
    from gptlib.attention import attention, causal_mask
    from gptlib.modern import ModernConfig, ModernGPT, apply_rope, rope_angles

    torch.manual_seed(1)
    model = ModernGPT(ModernConfig.preset("tiny")).eval()
    attn, T = model.blocks[0].attn, 6
    x = torch.randn(1, T, model.config.d_model)
    angles = rope_angles(T, attn.d_head, attn.rope_base)
    with torch.no_grad():
        heads = []
        for h in range(attn.n_heads):
            W_Q, W_K, W_V, W_O = attn.head_weights(h)
            z, _ = attention(
                apply_rope(x @ W_Q, angles), apply_rope(x @ W_K, angles), x @ W_V, causal_mask(T)
            )
            heads.append(z @ W_O)
    with ablate_heads(model, [(0, 1)]):
        ablated = _attention_output(model, 0, x)
    torch.testing.assert_close(ablated, sum(heads[:1] + heads[2:]), atol=1e-5, rtol=1e-4)
    ids = torch.tensor([[3, 4, 5, 3, 4, 5]])
    with torch.no_grad():
        clean = model(ids)
        with ablate_heads(model, [(1, h) for h in range(attn.n_heads)]):
            assert not torch.allclose(model(ids), clean)
        torch.testing.assert_close(model(ids), clean, rtol=0, atol=0)


@pytest.mark.parametrize("heads", [[(2, 0)], [(0, 4)], [(0, -1)], [(0, 1.0)], [(0,)], [0]])
def test_ablate_heads_refuses_what_is_not_a_head(heads):
    from gptlib.model import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny"))
    with pytest.raises(ValueError, match="heads"), ablate_heads(model, heads):
        pass
