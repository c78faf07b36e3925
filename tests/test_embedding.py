"""gptlib.embedding: one-hot, W_E lookup, W_U and tying."""

import pytest
import torch

from gptlib.embedding import Embedding, Unembedding, one_hot


def test_one_hot_known_value_and_dtype():
    X = one_hot(torch.tensor([2, 0, 2]), 3)
    assert torch.equal(X, torch.tensor([[0.0, 0, 1], [1, 0, 0], [0, 0, 1]]))
    assert one_hot(torch.tensor([1]), 2, dtype=torch.float64).dtype == torch.float64
    assert one_hot(torch.tensor([[0, 1]]), 2).shape == (1, 2, 2)


def test_one_hot_rejects_bad_input():
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([-1]), 3)
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([0.5]), 3)
    with pytest.raises(ValueError, match="d_vocab"):
        one_hot(torch.tensor([0]), 0)


def test_embedding_is_one_hot_product_and_matches_nn_embedding():
    torch.manual_seed(0)
    emb = Embedding(11, 4)
    ids = torch.tensor([[1, 10, 1, 0]])
    torch.testing.assert_close(emb(ids), one_hot(ids, 11) @ emb.W_E)
    peer = torch.nn.Embedding(11, 4)
    peer.weight.data.copy_(emb.W_E.data)
    torch.testing.assert_close(emb(ids), peer(ids))
    assert emb.W_E.shape == (11, 4)
    with pytest.raises(ValueError, match="d_model"):
        Embedding(5, 0)


def test_unembedding_tied_and_untied():
    emb = Embedding(7, 3)
    tied = Unembedding(3, 7, tied_to=emb)
    assert tied.tied and tied.W_U.data_ptr() == emb.W_E.data_ptr()
    assert len(list(tied.parameters())) == 0
    free = Unembedding(3, 7)
    assert not free.tied and free.W_U.shape == (3, 7)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(tied(x), x @ emb.W_E.T)
    with pytest.raises(ValueError, match="tied_to"):
        Unembedding(4, 7, tied_to=emb)
