"""Tests for gptlib.circuits: scores on hand-made patterns with known values, composition, copying."""

import math

import pytest
import torch

from gptlib.attention import MultiHeadAttention
from gptlib.circuits import (
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
    uniform_pattern,
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


@pytest.mark.parametrize("kw,name", [(dict(n=0), "n"), (dict(length=0), "length"), (dict(d_vocab=-1), "d_vocab"),
                                     (dict(total=0), "total"), (dict(length=2.5), "length")])
def test_repeated_sequences_errors(kw, name):
    args = dict(n=2, length=3, d_vocab=5) | kw
    with pytest.raises(ValueError, match=name):
        repeated_sequences(**args)


def test_uniform_pattern_is_causal_and_stochastic():
    A = uniform_pattern(6)
    torch.testing.assert_close(A.sum(-1), torch.ones(6))
    assert torch.equal(A.triu(1), torch.zeros(6, 6))
    with pytest.raises(ValueError, match="T"):
        uniform_pattern(0)


def test_scores_on_hand_made_heads():
    T, L = 8, 4
    prev = shifted_pattern(T, 1)
    induct = shifted_pattern(T, L - 1)  # key t - L + 1
    first = shifted_pattern(T, T)  # everything on key 0
    assert float(previous_token_score(prev)) == 1.0
    assert float(induction_score(induct, L)) == 1.0
    assert float(first_token_score(first)) == 1.0
    assert math.isclose(float(previous_token_score(first)), 1 / 7, rel_tol=1e-6)  # only row 1 puts weight on its previous key (0)
    assert float(induction_score(prev, L)) == 0.0
    # the identity head (every token attends to itself) scores 0 everywhere except induction with L = 1
    eye = torch.eye(T)
    assert float(previous_token_score(eye)) == 0.0 and float(first_token_score(eye)) == 0.0
    assert float(induction_score(eye, 1)) == 1.0


def test_chance_levels_of_uniform_head():
    T, L = 48, 24
    A = uniform_pattern(T)
    assert math.isclose(float(previous_token_score(A)), sum(1 / (t + 1) for t in range(1, T)) / (T - 1), rel_tol=1e-6)
    assert math.isclose(float(first_token_score(A)), float(previous_token_score(A)), rel_tol=1e-6)
    assert math.isclose(float(induction_score(A, L)), sum(1 / (t + 1) for t in range(L, T)) / L, rel_tol=1e-6)


def test_induction_score_on_a_real_repeat():
    # An exact induction head built from tokens: row t attends to the key after the previous occurrence.
    ids = repeated_sequences(1, 6, 1000, torch.Generator().manual_seed(0))[0].tolist()
    T, L = len(ids), 6
    assert len(set(ids[:L])) == L  # no accidental repeat inside r
    A = torch.zeros(T, T)
    for t in range(T):
        earlier = [s for s in range(t) if ids[s] == ids[t]]
        A[t, earlier[-1] + 1 if earlier else t] = 1.0
    assert float(induction_score(A, L)) == 1.0 and float(previous_token_score(A)) < 0.5


def test_score_table_shapes_and_batch_mean():
    p = torch.stack([uniform_pattern(6), shifted_pattern(6, 1)])  # two heads
    batch = torch.stack([p[None].expand(2, 2, 6, 6), p.flip(0)[None].expand(2, 2, 6, 6)])  # (2, 2, 2, 6, 6)
    table = score_table(batch, length=3)
    assert set(table) == {"previous-token", "induction", "first-token"}
    assert table["previous-token"].shape == (2, 2)
    expected = (float(previous_token_score(uniform_pattern(6))) + 1.0) / 2
    assert math.isclose(float(table["previous-token"][0, 0]), expected, rel_tol=1e-6)
    torch.testing.assert_close(score_table(batch[0], 3)["induction"], induction_score(batch[0], 3))


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, 3), torch.zeros(1, 1)])
def test_pattern_errors(bad):
    with pytest.raises(ValueError, match="pattern"):
        previous_token_score(bad)


def test_other_errors():
    with pytest.raises(ValueError, match="length"):
        induction_score(uniform_pattern(4), 4)
    with pytest.raises(ValueError, match="patterns"):
        score_table(uniform_pattern(4), 2)
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
    # K-composition: W_QK^2 (W_OV^1)^T; the earlier head writes direction 1, the later head's keys read it.
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
    extra = X @ W_QK2 @ (Y @ W_OV1).T  # what the earlier head's output adds to the later head's key scores
    torch.testing.assert_close(extra, X @ (W_QK2 @ W_OV1.T) @ Y.T)


def test_composition_scores_table_and_random_level():
    torch.manual_seed(0)
    a, b = MultiHeadAttention(64, 4), MultiHeadAttention(64, 4)
    table = composition_scores(a, b, "K")
    assert table.shape == (4, 4)
    torch.testing.assert_close(table[1, 2], k_composition(b.W_QK(2), a.W_OV(1)).detach())
    torch.testing.assert_close(composition_scores(a, b, "V")[3, 0], v_composition(b.W_OV(0), a.W_OV(3)).detach())
    torch.testing.assert_close(composition_scores(a, b, "Q")[0, 1], q_composition(b.W_QK(1), a.W_OV(0)).detach())
    assert abs(float(table.mean()) - 1 / 8) < 0.02  # random heads: about 1/sqrt(d_model)


def test_copying_and_diagonal():
    assert float(copying_score(torch.eye(5))) == pytest.approx(1.0)
    assert float(copying_score(-torch.eye(5))) == pytest.approx(-1.0)
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: no copying
    assert float(copying_score(rot)) == pytest.approx(0.0, abs=1e-7)
    assert float(diagonal_argmax_rate(torch.eye(6))) == 1.0
    assert float(diagonal_argmax_rate(torch.ones(4, 4) - torch.eye(4))) == 0.0


# --- the attention-only model that Chapter 8 trains (GPTConfig.attn_only, Block(attn_only=True)) ---


def test_attention_only_block_is_x_plus_attention():
    from gptlib.block import Block

    torch.manual_seed(0)
    blk = Block(8, 2, 32, attn_only=True).eval()
    assert blk.mlp is None and blk.ln_2 is None
    X = torch.randn(2, 5, 8)  # (B, T, d_model)
    torch.testing.assert_close(blk(X), X + blk.attn(blk.ln_1(X)))
    with pytest.raises(ValueError, match="attn_only"):
        Block(8, 2, 32, kind="post_ln", attn_only=True)


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
        GPTConfig(d_vocab=16, n_ctx=8, d_model=16, n_heads=2, n_layers=2, attn_only=True, block="parallel")
