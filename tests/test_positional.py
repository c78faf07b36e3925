"""gptlib.positional: sinusoidal encodings, learned positions, buffers."""

import math

import pytest
import torch

from gptlib.positional import LearnedPositional, SinusoidalPositional, sinusoidal_encoding


def test_sinusoidal_known_values():
    pe = sinusoidal_encoding(3, 4)
    expected = torch.tensor([
        [0.0, 1.0, 0.0, 1.0],
        [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
        [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
    ])
    torch.testing.assert_close(pe, expected)


def test_sinusoidal_pairs_lie_on_the_unit_circle_and_shift_by_rotation():
    pe = sinusoidal_encoding(50, 8).double()
    torch.testing.assert_close(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, torch.ones(50, 4, dtype=torch.float64), atol=1e-6, rtol=0)
    k = 5
    R = torch.zeros(8, 8, dtype=torch.float64)
    for i in range(4):
        a = k * 10000 ** (-2 * i / 8)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    torch.testing.assert_close(pe[k:], pe[:-k] @ R, atol=1e-6, rtol=0)


def test_sinusoidal_rejects_bad_sizes():
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(4, 3)
    with pytest.raises(ValueError, match="n_ctx"):
        sinusoidal_encoding(0, 4)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_encoding(4, 4, base=1.0)


def test_modules_return_rows_and_check_lengths():
    lp = LearnedPositional(8, 4)
    assert lp.W_pos.shape == (8, 4)
    torch.testing.assert_close(lp(3, offset=2), lp.W_pos[2:5])
    with pytest.raises(ValueError, match="n_ctx"):
        lp(7, offset=2)
    with pytest.raises(ValueError, match="offset"):
        lp(1, offset=-1)
    sp = SinusoidalPositional(8, 4)
    torch.testing.assert_close(sp(8), sinusoidal_encoding(8, 4))


def test_sinusoidal_buffer_follows_the_module():
    sp = SinusoidalPositional(8, 4)
    assert "PE" in dict(sp.named_buffers())
    assert sp.to(torch.float64).PE.dtype == torch.float64
