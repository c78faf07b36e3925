"""Reading tensors out of a forward pass: hook points, and one way to capture attention patterns.

A :class:`HookPoint` is an identity module placed where a tensor of interest is computed (an
attention pattern, a residual stream). It changes nothing; PyTorch's forward hooks on it read the
tensor, and a hook that returns a tensor replaces it (patching): every module uses what its hook
point returns. This is TransformerLens's mechanism, and the only one the library uses: ``forward``
methods keep a single return type, and a caller who wants the patterns asks for them with
:func:`capture_patterns`.

``fused`` means one thing throughout the library: ``True`` (the default) evaluates a module with
PyTorch's fused kernel for the same function, ``False`` with the formula the chapter derives. In
attention the fused kernel never hands the pattern back; the formula computes it and passes it
through ``hook_pattern``. So a hook on ``hook_pattern`` is a request for the pattern: while one
is attached (:attr:`HookPoint.observed`) the layer evaluates the formula, whatever its ``fused``
says, and :func:`capture_patterns` changes no switch of the model it records.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["HookPoint", "capture", "capture_patterns", "logit_lens"]


class HookPoint(nn.Identity):
    """The identity map, as a module that forward hooks can be attached to.

    >>> import torch
    >>> hp = HookPoint()
    >>> seen = []
    >>> handle = hp.register_forward_hook(lambda module, args, out: seen.append(out))
    >>> hp(torch.ones(2)).tolist(), len(seen)
    ([1.0, 1.0], 1)
    >>> handle.remove()
    """

    @property
    def observed(self) -> bool:
        """Whether a forward hook is attached: someone reads (or replaces) what passes here, so a
        module must compute it rather than take a path that skips it (a fused kernel).

        >>> hp = HookPoint()
        >>> handle = hp.register_forward_hook(lambda module, args, out: None)
        >>> hp.observed, (handle.remove(), hp.observed)[1]
        (True, False)
        """
        return bool(self._forward_hooks or self._forward_pre_hooks)


def _check_module(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")


@contextmanager
def capture(model: nn.Module, name: str) -> Iterator[list[Tensor]]:
    """Record, in call order, every tensor that passes through a :class:`HookPoint` called ``name``.

    Yields a list that fills as the model runs; the hooks are removed on exit, also after an
    error. The tensors are detached: recording never keeps a graph alive.

    >>> import torch
    >>> class Double(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.hook_out = HookPoint()
    ...     def forward(self, x):
    ...         return self.hook_out(2 * x)
    >>> model = Double()
    >>> with capture(model, "hook_out") as seen:
    ...     _ = model(torch.ones(1))
    ...     _ = model(torch.full((1,), 3.0))
    >>> [t.tolist() for t in seen]
    [[2.0], [6.0]]
    """
    _check_module(model)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    points = [
        m
        for path, m in model.named_modules()
        if isinstance(m, HookPoint) and path.rsplit(".", 1)[-1] == name
    ]
    if not points:
        raise ValueError(f"model has no HookPoint called {name!r}")
    seen: list[Tensor] = []
    handles = [
        p.register_forward_hook(lambda module, args, out: seen.append(out.detach())) for p in points
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@contextmanager
def capture_patterns(model: nn.Module) -> Iterator[list[Tensor]]:
    """Record every attention pattern the model computes: one tensor (B, n_heads, T, T_k) per call.

    Every submodule with a ``hook_pattern`` computes its pattern by the formula while its hook
    point is observed (:func:`gptlib.attention.attend`), so the recorded patterns are the ones the
    outputs are made of; no ``fused`` switch is changed. For one forward pass of a GPT the list
    holds the layers' patterns in order, layer 0 first.

    >>> from gptlib.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig.preset("tiny")).eval()
    >>> with capture_patterns(model) as seen:
    ...     _ = model(torch.tensor([[1, 2, 3]]))
    >>> [tuple(p.shape) for p in seen], model.blocks[0].attn.fused
    ([(1, 4, 3, 3), (1, 4, 3, 3)], True)
    """
    _check_module(model)
    owners = [m for m in model.modules() if isinstance(getattr(m, "hook_pattern", None), HookPoint)]
    if not owners:
        raise ValueError("model has no attention module with a hook_pattern")
    with capture(model, "hook_pattern") as seen:
        yield seen


@torch.no_grad()
def logit_lens(model: nn.Module, ids: Tensor, position: int | None = None) -> Tensor:
    """The final norm and unembedding applied to every residual stream: (L + 1, B, T, d_vocab),
    L = n_layers; with ``position`` (an index into the T positions, negative from the end), that
    position only: (L + 1, B, d_vocab).

    ``model`` is a :class:`gptlib.model.GPT` or :class:`gptlib.modern.ModernGPT`: its
    ``hook_resid`` points see X_0 and the output of each block, and ``model.read_out``,
    ln_f(X_l) W_U, reads them. Row 0 reads the embedding, row l the output of block l; the last
    row is the model's logits. Reading one position costs (L + 1) d_model d_vocab multiplications
    per sequence instead of T times as many: ``position=-1`` is the next-token prediction. All the
    streams go through ``read_out`` at once, so W_U is read from memory once, not L + 1 times.

    >>> from gptlib.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model, ids = GPT(GPTConfig.preset("tiny")).eval(), torch.tensor([[1, 2, 3]])
    >>> lens = logit_lens(model, ids)
    >>> tuple(lens.shape), torch.allclose(lens[-1], model(ids), atol=1e-5)
    ((3, 1, 3, 512), True)
    >>> last = logit_lens(model, ids, position=-1)  # (L + 1, B, d_vocab)
    >>> tuple(last.shape), torch.allclose(last, lens[:, :, -1], atol=1e-5)
    ((3, 1, 512), True)
    """
    if position is not None:
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError(f"ids must be a (B, T) tensor to read a position, got {ids!r}")
        T = ids.shape[1]
        if type(position) is not int or not -T <= position < T:
            raise ValueError(f"position must be an int in [-{T}, {T}), got {position!r}")
    with capture(model, "hook_resid") as seen:
        model(ids)
    streams = torch.stack(seen)  # (L + 1, B, T, d_model)
    if position is not None:
        streams = streams[:, :, position]  # (L + 1, B, d_model)
    return model.read_out(streams)  # one product with W_U for all the streams
