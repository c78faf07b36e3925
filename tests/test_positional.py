"""gptlib.positional: sinusoidal encodings, the relative-position rotation, learned positions,
buffers."""

import math

import pytest
import torch

from gptlib.positional import (
    LearnedPositional,
    SinusoidalPositional,
    relative_rotation,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)


def test_sinusoidal_known_values():
    pe = sinusoidal_encoding(3, 4)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ]
    )
    torch.testing.assert_close(pe, expected)
    assert pe.dtype == torch.float32
    assert sinusoidal_encoding(3, 4, dtype=torch.float64).dtype == torch.float64


def test_sinusoidal_matches_the_formula_entry_by_entry():
    n_ctx, d, base = 20, 10, 500.0
    pe = sinusoidal_encoding(n_ctx, d, base, dtype=torch.float64)
    for p in range(n_ctx):
        for i in range(d // 2):
            w = base ** (-2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-12)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-12)


def test_frequencies():
    w = sinusoidal_frequencies(8)
    torch.testing.assert_close(w, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64))
    assert w.dtype == torch.float64


def test_pairs_lie_on_the_unit_circle():
    pe = sinusoidal_encoding(50, 8, dtype=torch.float64)
    torch.testing.assert_close(
        pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, torch.ones(50, 4, dtype=torch.float64)
    )


def test_relative_rotation_shifts_every_position():
    n_ctx, d = 200, 16
    pe = sinusoidal_encoding(n_ctx, d, dtype=torch.float64)
    for k in (0, 1, 5, 37, 150):
        R = relative_rotation(k, d)
        torch.testing.assert_close(pe[k:], pe[: n_ctx - k] @ R, atol=1e-12, rtol=0)
    R3 = relative_rotation(3, d)
    torch.testing.assert_close(R3 @ R3.T, torch.eye(d, dtype=torch.float64))  # orthogonal
    torch.testing.assert_close(relative_rotation(-3, d), R3.T)  # R_{-k} = R_k^T
    torch.testing.assert_close(
        relative_rotation(2, d) @ relative_rotation(5, d), relative_rotation(7, d)
    )
    assert torch.count_nonzero(R3) == 4 * (d // 2)  # block-diagonal 2x2 blocks


def test_relative_rotation_known_value():
    R = relative_rotation(2, 4, base=100.0)
    a, b = 2.0, 2 * 0.1
    expected = torch.tensor(
        [
            [math.cos(a), -math.sin(a), 0, 0],
            [math.sin(a), math.cos(a), 0, 0],
            [0, 0, math.cos(b), -math.sin(b)],
            [0, 0, math.sin(b), math.cos(b)],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(R, expected)


def test_sinusoidal_rejects_bad_sizes():
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(4, 3)
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(4, 0)
    with pytest.raises(ValueError, match="n_ctx"):
        sinusoidal_encoding(0, 4)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_encoding(4, 4, base=1.0)
    with pytest.raises(ValueError, match="d_model"):
        relative_rotation(1, 5)
    with pytest.raises(ValueError, match="k"):
        relative_rotation(1.5, 4)
    with pytest.raises(ValueError, match="d_model"):
        SinusoidalPositional(8, 7)


def test_modules_return_rows_and_check_lengths():
    lp = LearnedPositional(8, 4)
    assert lp.W_pos.shape == (8, 4) and lp.W_pos.requires_grad
    torch.testing.assert_close(lp(3, offset=2), lp.W_pos[2:5])
    assert lp(0).shape == (0, 4)
    with pytest.raises(ValueError, match="n_ctx"):
        lp(7, offset=2)
    with pytest.raises(ValueError, match="offset"):
        lp(1, offset=-1)
    with pytest.raises(ValueError, match="T"):
        lp(-1)
    with pytest.raises(ValueError, match="d_model"):
        LearnedPositional(8, 0)
    with pytest.raises(ValueError, match="n_ctx"):
        LearnedPositional(0, 4)
    sp = SinusoidalPositional(8, 4)
    torch.testing.assert_close(sp(8), sinusoidal_encoding(8, 4))
    torch.testing.assert_close(sp(3, offset=5), sinusoidal_encoding(8, 4)[5:])
    with pytest.raises(ValueError, match="n_ctx"):
        sp(9)


def test_learned_matches_nn_embedding_of_positions():
    lp = LearnedPositional(8, 4)
    peer = torch.nn.Embedding(8, 4)
    peer.weight.data.copy_(lp.W_pos.data)
    torch.testing.assert_close(lp(5, offset=3), peer(torch.arange(3, 8)))


def test_sinusoidal_buffer_follows_the_module():
    sp = SinusoidalPositional(8, 4)
    assert "PE" in dict(sp.named_buffers()) and len(list(sp.parameters())) == 0
    assert "PE" not in sp.state_dict()  # persistent=False: rebuilt, not saved
    assert sp.to(torch.float64).PE.dtype == torch.float64
    assert sp.to("meta").PE.device.type == "meta"
    fresh = SinusoidalPositional(8, 4)
    fresh.load_state_dict(SinusoidalPositional(8, 4).state_dict())
    torch.testing.assert_close(fresh.PE, sinusoidal_encoding(8, 4))


def test_base_must_be_a_finite_number_above_one():
    for base in (float("nan"), float("inf"), 1.0):
        with pytest.raises(ValueError, match="base"):
            sinusoidal_encoding(4, 8, base=base)
        with pytest.raises(ValueError, match="base"):
            SinusoidalPositional(4, 8, base=base)


def test_encoding_dtype_must_be_floating_point():
    with pytest.raises(ValueError, match="dtype"):
        sinusoidal_encoding(4, 8, dtype=torch.int64)  # would truncate every sine to 0
