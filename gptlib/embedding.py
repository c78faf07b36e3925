"""Chapter 2: tokens as one-hot rows, the embedding W_E and the unembedding W_U.

A sequence of T token ids is the one-hot matrix X in {0,1}^(T x d_vocab); embedding it is the
matrix product X W_E, which picks rows of W_E. Unembedding maps a d_model vector back to
d_vocab logits with W_U; GPT-2 ties W_U = W_E^T.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from . import runtime
from .runtime import check_float, check_positive_int

__all__ = ["one_hot", "init_normal_", "skip_init", "learned_table", "Embedding", "Unembedding"]

# False inside skip_init(): the layers leave their weights as allocated (a load overwrites them).
_INIT = ContextVar("gptlib_init_weights", default=True)


def init_normal_(W: Tensor, std: float) -> Tensor:
    """W drawn in place from N(0, std^2), exactly as ``nn.init.normal_`` draws it; returns W.

    A tensor on the meta device (shapes only) has no values to draw: it is left as it is, since
    any random or arithmetic op on a meta tensor imports torch._dynamo (about 2 s of CPU, once per
    process). Inside :func:`skip_init` nothing is drawn either, and the global generator is not
    advanced.

    >>> W = torch.empty(2, 3, device="meta")
    >>> init_normal_(W, 0.02) is W, W.is_meta
    (True, True)
    """
    if W.is_meta or not _INIT.get():
        return W
    return nn.init.normal_(W, std=std)


@contextmanager
def skip_init() -> Iterator[None]:
    """Within this block the layers of gptlib allocate their weights without drawing them (their
    values are whatever memory held): for a model whose every weight is loaded next.

    >>> with skip_init():
    ...     state = torch.random.get_rng_state()
    ...     _ = Embedding(50, 8)
    ...     torch.equal(state, torch.random.get_rng_state())
    True
    """
    token = _INIT.set(False)
    try:
        yield
    finally:
        _INIT.reset(token)


def one_hot(ids: Tensor, d_vocab: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The one-hot matrix of a sequence of ids: row t is the basis vector e_{ids[t]}.

    ids of shape (..., T) give a tensor of shape (..., T, d_vocab).

    >>> one_hot(torch.tensor([2, 0]), 3)
    tensor([[0., 0., 1.],
            [1., 0., 0.]])
    """
    check_positive_int("d_vocab", d_vocab)
    if not isinstance(ids, Tensor):
        raise ValueError(f"ids must be an integer tensor, got {type(ids).__name__}")
    runtime.check_ids(ids, d_vocab)
    return torch.nn.functional.one_hot(ids.long(), d_vocab).to(dtype)  # (..., T, d_vocab)


def learned_table(rows_name: str, rows: int, d_model: int, std: float) -> nn.Parameter:
    """A trainable (rows, d_model) matrix drawn from N(0, std^2), its sizes checked: W_E and W_pos.

    >>> tuple(learned_table("n_ctx", 4, 8, std=0.01).shape)
    (4, 8)
    """
    check_positive_int(rows_name, rows)
    check_positive_int("d_model", d_model)
    std = check_float("std", std, 0.0)
    W = nn.Parameter(torch.empty(rows, d_model))  # (rows, d_model)
    init_normal_(W, std)
    return W


class Embedding(nn.Module):
    """Token embedding: ids -> rows of ``W_E`` (d_vocab, d_model), i.e. one_hot(ids) @ W_E.

    >>> emb = Embedding(3, 2)
    >>> with torch.no_grad():
    ...     _ = emb.W_E.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    >>> emb(torch.tensor([[2, 0]]))
    tensor([[[5., 6.],
             [1., 2.]]], grad_fn=<EmbeddingBackward0>)
    """

    def __init__(self, d_vocab: int, d_model: int):
        super().__init__()
        self.d_vocab, self.d_model = d_vocab, d_model
        self.W_E = learned_table("d_vocab", d_vocab, d_model, std=0.02)

    def forward(self, ids: Tensor, *, check_ids: bool = True) -> Tensor:
        """ids (B, T) -> (B, T, d_model): a row lookup, equal to one_hot(ids) @ W_E without the
        zeros.

        Ids out of range are a ValueError here rather than an IndexError on the CPU or a device-side
        assert on a GPU. That check reads the ids (a synchronisation on a GPU); a caller that has
        checked them once, as generation does, passes ``check_ids=False``.
        """
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                "ids must be an int64 or int32 tensor, got "
                f"{getattr(ids, 'dtype', type(ids).__name__)}"
            )
        if check_ids:
            runtime.check_ids(ids, self.d_vocab)
        return torch.nn.functional.embedding(
            ids, self.W_E
        )  # (F.embedding: a faster backward than indexing)

    def extra_repr(self) -> str:
        return f"d_vocab={self.d_vocab}, d_model={self.d_model}"


class Unembedding(nn.Module):
    """Unembedding: (…, d_model) -> logits (…, d_vocab) = x @ W_U.

    Untied, ``W_U`` (d_model, d_vocab) is a parameter of its own. Tied to an :class:`Embedding`
    (``tied_to``, as GPT-2), the module holds that embedding's parameter ``W_E`` itself, the same
    Parameter object in both modules, and ``W_U`` is its transpose W_E^T, a view of the same
    storage: gradients from both uses add up in the one tensor.

    >>> emb = Embedding(5, 3)
    >>> tied = Unembedding(3, 5, tied_to=emb)
    >>> tied.W_E is emb.W_E, tied.W_U.data_ptr() == emb.W_E.data_ptr(), tuple(tied.W_U.shape)
    (True, True, (3, 5))
    """

    def __init__(self, d_model: int, d_vocab: int, tied_to: Embedding | None = None):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_vocab", d_vocab)
        self.d_model, self.d_vocab = d_model, d_vocab
        if tied_to is not None:
            if not isinstance(tied_to, Embedding):
                raise ValueError(f"tied_to must be an Embedding, got {type(tied_to).__name__}")
            if (tied_to.d_vocab, tied_to.d_model) != (d_vocab, d_model):
                raise ValueError(
                    f"tied_to has shape ({tied_to.d_vocab}, {tied_to.d_model}), expected "
                    f"({d_vocab}, {d_model})"
                )
            self.W_E = tied_to.W_E  # shared, not copied
        else:
            self.W_U = nn.Parameter(torch.empty(d_model, d_vocab))
            init_normal_(self.W_U, 0.02)

    @property
    def tied(self) -> bool:
        return "W_E" in self._parameters

    @property
    def W_U(self) -> Tensor:
        """The unembedding matrix, (d_model, d_vocab): the parameter, or W_E^T when tied."""
        if self.tied:
            return self._parameters["W_E"].T
        if "W_U" not in self._parameters:  # only while __init__ registers the parameter
            raise AttributeError("W_U")
        return self._parameters["W_U"]

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.d_model,):
            raise ValueError(f"x must end in d_model={self.d_model}, got shape {tuple(x.shape)}")
        # (B, T, d_model) @ (d_model, d_vocab) -> (B, T, d_vocab). For tied weights F.linear with
        # W_E itself (x W_E^T) avoids materialising the transpose's gradient.
        if self.tied:
            return torch.nn.functional.linear(x, self.W_E)
        return x @ self.W_U

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_vocab={self.d_vocab}, tied={self.tied}"
