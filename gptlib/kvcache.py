"""Chapter 4 (and 7): the KV cache — the keys and values of the positions processed so far.

Under the causal mask the key and value at position j depend only on tokens <= j, so decoding
computes each once and appends it: a step on T new tokens reads the P cached positions and writes
T more. :class:`KVCache` holds them per layer; the attention layers of :mod:`gptlib.attention`,
:mod:`gptlib.modern` and :mod:`gptlib.mla` append to it, and :func:`check_cache` is the models'
check of the one they are given.
"""

from __future__ import annotations

from torch import Tensor

from .runtime import check_int, check_positive_int

__all__ = ["KVCache", "check_cache"]


class KVCache:
    """Keys and values of the positions processed so far, per layer: (B, n_kv_heads, offset,
    d_head).

    Under the causal mask a key or value at position j depends only on tokens <= j, so once
    computed it never changes; decoding appends one position per step. ``offset(layer)``, the number
    of positions a layer holds, is the position of its next one. Each layer writes into a buffer of
    ``capacity`` positions allocated at its first append (without a capacity it doubles when full),
    so a step copies only its own keys and values; ``k[layer]``, ``v[layer]`` view the filled part.
    A cache is for inference: autograd refuses to differentiate through keys written over later.

    >>> import torch
    >>> cache = KVCache(n_layers=1, capacity=4)
    >>> k, v = cache.append(0, torch.ones(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))  # 3 positions
    >>> k, v = cache.append(0, torch.ones(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))  # and one more
    >>> len(cache), tuple(k.shape), tuple(cache.k[0].shape)
    (4, (1, 2, 4, 8), (1, 2, 4, 8))
    """

    def __init__(self, n_layers: int, capacity: int | None = None):
        check_positive_int("n_layers", n_layers)
        if capacity is not None:
            check_positive_int("capacity", capacity)
        self.n_layers, self.capacity = n_layers, capacity
        self._k: list[Tensor | None] = [None] * n_layers  # (B, n_kv_heads, buffer length, d_head)
        self._v: list[Tensor | None] = [None] * n_layers
        self._filled = [0] * n_layers

    def __len__(self) -> int:
        """The number of cached positions (those of layer 0): the offset of the next input."""
        return self._filled[0]

    def offset(self, layer: int) -> int:
        """The number of positions ``layer`` holds: the position its next key will have."""
        return self._filled[check_int("layer", layer, 0, self.n_layers - 1)]

    @property
    def k(self) -> list[Tensor | None]:
        """Each layer's keys so far, (B, n_kv_heads, offset, d_head), or None before its first
        append."""
        return [None if b is None else b[:, :, :n] for b, n in zip(self._k, self._filled)]

    @property
    def v(self) -> list[Tensor | None]:
        """Each layer's values so far, as :attr:`k`."""
        return [None if b is None else b[:, :, :n] for b, n in zip(self._v, self._filled)]

    def clear(self) -> None:
        """Forget every position and keep the buffers (generation refills them after a crop)."""
        self._filled = [0] * self.n_layers

    def crop(self, offset: int) -> None:
        """Keep the first ``offset`` positions of every layer and forget the later ones (keep the
        buffers): speculative decoding drops the keys of rejected drafts this way.

        >>> import torch
        >>> cache = KVCache(n_layers=1)
        >>> _ = cache.append(0, torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
        >>> cache.crop(3); len(cache)
        3
        """
        offset = check_int("offset", offset, 0, len(self))
        self._filled = [min(n, offset) for n in self._filled]

    @property
    def nbytes(self) -> int:
        """The bytes of the key and value buffers allocated so far, over all layers (with a
        ``capacity``: 2 n_layers B n_kv_heads capacity d_head bytes-per-number once every layer
        has appended).

        >>> import torch
        >>> cache = KVCache(n_layers=2, capacity=10)
        >>> for layer in range(2):
        ...     _ = cache.append(layer, torch.ones(1, 3, 1, 64), torch.ones(1, 3, 1, 64))
        >>> cache.nbytes == 2 * 2 * 3 * 10 * 64 * 4
        True
        """
        return sum(
            b.numel() * b.element_size()
            for store in (self._k, self._v)
            for b in store
            if b is not None
        )

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values (B, n_kv_heads, T, d_head) for ``layer``; return all so
        far."""
        if type(layer) is not int or not 0 <= layer < self.n_layers:
            layer = check_int("layer", layer, 0, self.n_layers - 1)
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(
                f"k and v must have one shape (B, n_kv_heads, T, d_head), got {tuple(k.shape)}, "
                f"{tuple(v.shape)}"
            )
        n, T, buf = self._filled[layer], k.shape[2], self._k[layer]
        if (
            buf is None
            or n + T > buf.shape[2]
            or k.shape[:2] != buf.shape[:2]
            or k.shape[3] != buf.shape[3]
            or k.dtype != buf.dtype
            or k.device != buf.device
        ):
            buf = self._make_room(layer, k, n, T)
        vbuf = self._v[layer]
        buf.narrow(2, n, T).copy_(k)  # written in place: positions n .. n + T - 1
        vbuf.narrow(2, n, T).copy_(v)
        self._filled[layer] = n + T
        return buf.narrow(2, 0, n + T), vbuf.narrow(2, 0, n + T)

    def _make_room(self, layer: int, k: Tensor, n: int, T: int) -> Tensor:
        """Allocate ``layer``'s buffers for n + T positions, keeping the n filled ones; check
        first."""
        if self.capacity is not None and n + T > self.capacity:
            raise ValueError(
                f"the cache holds capacity={self.capacity} positions, {n} are filled; {T} more do "
                "not fit"
            )
        buf = self._k[layer]
        if n and (
            k.shape[:2] != buf.shape[:2]
            or k.shape[3] != buf.shape[3]
            or k.dtype != buf.dtype
            or k.device != buf.device
        ):
            raise ValueError(
                f"k ({tuple(k.shape)}, {k.dtype}, {k.device}) does not continue the cached "
                f"({tuple(buf.shape)}, {buf.dtype}, {buf.device})"
            )
        size = self.capacity or max(n + T, 2 * (0 if buf is None else buf.shape[2]), 16)
        for store in (self._k, self._v):
            new = k.new_empty(
                k.shape[0], k.shape[1], size, k.shape[3]
            )  # (B, n_kv_heads, size, d_head)
            if n:
                new[:, :, :n] = store[layer][:, :, :n]
            store[layer] = new
        return self._k[layer]


def check_cache(cache: object, n_layers: int) -> None:
    """Raise ``ValueError`` unless ``cache`` is None or a :class:`KVCache` of ``n_layers``
    layers."""
    if cache is not None and (not isinstance(cache, KVCache) or cache.n_layers != n_layers):
        got = (
            f"{cache.n_layers} layers"
            if isinstance(cache, KVCache)
            else f"type {type(cache).__name__}"
        )
        raise ValueError(f"cache has {got}; the model needs a KVCache of n_layers={n_layers}")
