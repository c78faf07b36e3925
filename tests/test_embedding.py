"""gptlib.embedding: one-hot, W_E lookup, W_U and tying."""

import pytest
import torch

from gptlib.embedding import Embedding, Unembedding, one_hot


def test_one_hot_known_value_and_dtype():
    X = one_hot(torch.tensor([2, 0, 2]), 3)
    assert torch.equal(X, torch.tensor([[0.0, 0, 1], [1, 0, 0], [0, 0, 1]]))
    assert one_hot(torch.tensor([1]), 2, dtype=torch.float64).dtype == torch.float64
    assert one_hot(torch.tensor([[0, 1]]), 2).shape == (1, 2, 2)
    assert one_hot(torch.tensor([1, 0], dtype=torch.int32), 2).sum() == 2
    assert one_hot(torch.tensor([], dtype=torch.long), 4).shape == (0, 4)


def test_one_hot_matches_torch():
    ids = torch.randint(0, 17, (3, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(one_hot(ids, 17), torch.nn.functional.one_hot(ids, 17).float())


def test_one_hot_rejects_bad_input():
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([-1]), 3)
    with pytest.raises(ValueError, match="ids"):
        one_hot(torch.tensor([0.5]), 3)
    with pytest.raises(ValueError, match="ids"):
        one_hot([0, 1], 3)
    with pytest.raises(ValueError, match="d_vocab"):
        one_hot(torch.tensor([0]), 0)


def test_embedding_is_one_hot_product_and_matches_nn_embedding():
    torch.manual_seed(0)
    emb = Embedding(11, 4)
    ids = torch.tensor([[1, 10, 1, 0]])
    torch.testing.assert_close(emb(ids), one_hot(ids, 11) @ emb.W_E)
    peer = torch.nn.Embedding(11, 4)
    peer.weight.data.copy_(emb.W_E.data)
    assert torch.equal(emb(ids), peer(ids))
    assert emb.W_E.shape == (11, 4)
    assert torch.equal(emb(ids)[0, 0], emb(ids)[0, 2])  # same id, same row


def test_embedding_gradient_reaches_only_the_used_rows():
    emb = Embedding(6, 3)
    emb(torch.tensor([[4, 1, 4]])).sum().backward()
    used = emb.W_E.grad.abs().sum(dim=1) > 0
    assert used.tolist() == [False, True, False, False, True, False]
    torch.testing.assert_close(emb.W_E.grad[4], torch.full((3,), 2.0))  # row 4 used twice


def test_embedding_rejects_bad_arguments():
    with pytest.raises(ValueError, match="d_model"):
        Embedding(5, 0)
    with pytest.raises(ValueError, match="d_vocab"):
        Embedding(0, 5)
    emb = Embedding(5, 2)
    with pytest.raises(ValueError, match="ids"):
        emb(torch.tensor([[5]]))
    with pytest.raises(ValueError, match="ids"):
        emb(torch.tensor([[-1]]))
    with pytest.raises(ValueError, match="ids"):
        emb(torch.tensor([[1.0]]))


def test_embedding_on_meta_device_skips_the_value_check():
    with torch.device("meta"):
        emb = Embedding(5, 2)
        out = emb(torch.zeros(1, 3, dtype=torch.long))
    assert out.shape == (1, 3, 2) and out.device.type == "meta"


def test_unembedding_tied_and_untied():
    emb = Embedding(7, 3)
    tied = Unembedding(3, 7, tied_to=emb)
    assert tied.tied and tied.W_U.data_ptr() == emb.W_E.data_ptr()
    assert tied.W_U.shape == (3, 7)
    assert list(tied.parameters()) == [emb.W_E] and tied.W_E is emb.W_E  # shared, not copied
    free = Unembedding(3, 7)
    assert not free.tied and free.W_U.shape == (3, 7)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(tied(x), x @ emb.W_E.T)
    torch.testing.assert_close(free(x), x @ free.W_U)
    peer = torch.nn.Linear(3, 7, bias=False)
    peer.weight.data.copy_(free.W_U.data.T)
    torch.testing.assert_close(free(x), peer(x))


def test_tied_gradient_is_the_sum_over_both_uses():
    torch.manual_seed(1)
    emb = Embedding(9, 4)
    unemb = Unembedding(4, 9, tied_to=emb)
    ids = torch.tensor([[3, 8, 3]])
    unemb(emb(ids)).square().sum().backward()
    E_in = emb.W_E.detach().clone().requires_grad_(True)
    E_out = emb.W_E.detach().clone().requires_grad_(True)
    (E_in[ids] @ E_out.T).square().sum().backward()
    torch.testing.assert_close(emb.W_E.grad, E_in.grad + E_out.grad)


def test_tied_module_follows_to_and_state_dict():
    emb = Embedding(7, 3)
    tied = Unembedding(3, 7, tied_to=emb)
    emb.to(torch.float64)
    assert tied.W_U.dtype == torch.float64 and tied.W_U.data_ptr() == emb.W_E.data_ptr()
    assert list(tied.state_dict()) == ["W_E"] and list(Unembedding(3, 7).state_dict()) == ["W_U"]


def test_unembedding_rejects_bad_arguments():
    emb = Embedding(7, 3)
    with pytest.raises(ValueError, match="tied_to"):
        Unembedding(4, 7, tied_to=emb)
    with pytest.raises(ValueError, match="tied_to"):
        Unembedding(3, 7, tied_to=torch.nn.Embedding(7, 3))
    with pytest.raises(ValueError, match="d_model"):
        Unembedding(0, 7)
    with pytest.raises(ValueError, match="d_vocab"):
        Unembedding(3, -2)
    with pytest.raises(ValueError, match="d_model"):
        Unembedding(3, 7)(torch.randn(2, 4))


def test_learned_table_std_must_be_finite():
    from gptlib.embedding import learned_table

    for std in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="std"):
            learned_table("n_ctx", 4, 8, std=std)
