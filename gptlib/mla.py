"""Chapter 14: multi-head latent attention (DeepSeek-V2), a low-rank cache of keys and values.

Every head's keys and values are read from one shared latent row c (d_c numbers per token), and
the position enters through a separate rotary key k^R shared by the heads (d_R numbers):

    c = x W_DKV,   K_h = c W_UK^h,   V_h = c W_UV^h,   k^R = RoPE(x W_KR),   q^R_h = RoPE(x W_QR^h)
    score_h(t, s) = (q_h(t) . K_h(s) + q^R_h(t) . k^R(s)) / sqrt(d_head + d_R)
    out = sum_h (A_h V_h) W_O^h

with W_DKV (d_model, d_c), W_UK, W_UV (d_c, n_heads d_head), W_KR (d_model, d_R), W_QR
(d_model, n_heads d_R). Since q_h K_h^T = (x W_Q^h W_UK^{h T}) c^T and (A_h V_h) W_O^h =
(A_h c)(W_UV^h W_O^h), the up-projections can be absorbed into the query and output maps, so a
:class:`LatentCache` keeps [c | k^R], d_c + d_R numbers per token and layer, against 2 n_heads
d_head
for multi-head attention's :class:`gptlib.attention.KVCache`. ``absorb=True`` computes the absorbed
form, ``absorb=False`` the form above; the two agree up to rounding. :func:`mla_model` puts the
layer into a :class:`gptlib.modern.ModernGPT` in place of grouped-query attention.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .attention import attend, causal_mask, softmax
from .hooks import HookPoint
from .kvcache import KVCache
from .modern import ModernConfig, ModernGPT, apply_rope, rope_angles
from .runtime import check_float, check_int, check_positive_int

__all__ = ["LatentCache", "MultiHeadLatentAttention", "absorbed_weights", "mla_model"]


class LatentCache(KVCache):
    """A :class:`KVCache` for latent attention: per layer one buffer (B, positions, d_c + d_R)
    holding [c | k^R], instead of keys and values per head. ``len(cache)`` and ``offset(layer)``
    are those of a KVCache, so a model passes it where it passes one.

    >>> cache = LatentCache(n_layers=1, capacity=8)
    >>> c, k_R = cache.append_latent(0, torch.ones(1, 3, 4), torch.zeros(1, 3, 2))
    >>> len(cache), tuple(c.shape), tuple(k_R.shape), cache.allocated_numbers()
    (3, (1, 3, 4), (1, 3, 2), 48)
    """

    def __init__(self, n_layers: int, capacity: int | None = None):
        super().__init__(n_layers, capacity)
        self._latent: list[Tensor | None] = [None] * n_layers  # (B, buffer length, d_c + d_R)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise ValueError("a LatentCache holds latent rows, not keys and values: use append_latent")

    def append_latent(self, layer: int, c: Tensor, k_R: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's c (B, T, d_c) and rotated k^R (B, T, d_R) for ``layer``; return all so
        far."""
        layer = check_int("layer", layer, 0, self.n_layers - 1)
        if c.dim() != 3 or k_R.dim() != 3 or c.shape[:2] != k_R.shape[:2]:
            raise ValueError(
                f"c and k_R must be (B, T, d_c) and (B, T, d_R), got {tuple(c.shape)}, "
                f"{tuple(k_R.shape)}"
            )
        n, T, d_c = self._filled[layer], c.shape[1], c.shape[2]
        row = torch.cat([c, k_R], dim=-1)  # (B, T, d_c + d_R)
        buf = self._latent[layer]
        if (
            buf is None
            or n + T > buf.shape[1]
            or buf.shape[0] != row.shape[0]
            or buf.shape[2] != row.shape[2]
        ):
            if self.capacity is not None and n + T > self.capacity:
                raise ValueError(
                    f"the cache holds capacity={self.capacity} positions, {n} are filled; {T} more "
                    "do not fit"
                )
            if n and (buf.shape[0] != row.shape[0] or buf.shape[2] != row.shape[2]):
                raise ValueError(
                    f"c and k_R {tuple(row.shape)} do not continue the cached {tuple(buf.shape)}"
                )
            size = self.capacity or max(n + T, 2 * (0 if buf is None else buf.shape[1]), 16)
            new = row.new_empty(row.shape[0], size, row.shape[2])  # (B, size, d_c + d_R)
            if n:
                new[:, :n] = buf[:, :n]
            buf = self._latent[layer] = new
        buf[:, n : n + T] = row
        self._filled[layer] = n + T
        full = buf[:, : n + T]  # (B, offset + T, d_c + d_R)
        return full[..., :d_c], full[..., d_c:]

    def allocated_numbers(self) -> int:
        """The numbers the buffers hold, over every layer (filled or not)."""
        return sum(b.numel() for b in self._latent if b is not None)


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention with a decoupled rotary key; no biases.

    W_Q (d_model, n_heads d_head), W_QR (d_model, n_heads d_R), W_DKV (d_model, d_c), W_KR
    (d_model, d_R), W_UK, W_UV (d_c, n_heads d_head), W_O (n_heads d_head, d_model). ``absorb``
    (default ``False``) selects the absorbed computation, which reads only c and k^R;
    ``fused`` is used by the unabsorbed one (:func:`gptlib.attention.attend`). ``layer`` is this
    layer's index in a :class:`LatentCache` (its ``cache_type``, which
    :func:`gptlib.sampling.new_cache` makes for a model of these layers).
    """

    cache_type = LatentCache

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        d_c: int,
        d_R: int,
        *,
        rope_base: float = 10000.0,
        layer: int = 0,
        fused: bool = True,
        absorb: bool = False,
    ):
        super().__init__()
        for name, v in (
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("d_head", d_head),
            ("d_c", d_c),
            ("d_R", d_R),
        ):
            check_positive_int(name, v)
        if d_R % 2:
            raise ValueError(f"d_R must be even for RoPE, got {d_R}")
        for name, value in (("fused", fused), ("absorb", absorb)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.d_model, self.n_heads, self.d_head, self.d_c, self.d_R = (
            d_model,
            n_heads,
            d_head,
            d_c,
            d_R,
        )
        self.rope_base = check_float("rope_base", rope_base, 1.0, lo_open=True)
        self.layer, self.fused, self.absorb = check_int("layer", layer, lo=0), fused, absorb
        d_attn = n_heads * d_head

        def init(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape) * 0.02)

        self.W_Q, self.W_QR = init(d_model, d_attn), init(d_model, n_heads * d_R)
        self.W_DKV, self.W_KR = init(d_model, d_c), init(d_model, d_R)
        self.W_UK, self.W_UV = init(d_c, d_attn), init(d_c, d_attn)
        self.W_O = init(d_attn, d_model)
        self.hook_pattern = HookPoint()  # (B, n_heads, T, T_k), on the readable unabsorbed path

    def head_weights(self, h: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_Q^h (d_model, d_head), W_UK^h, W_UV^h (d_c, d_head) and W_O^h (d_head, d_model)."""
        h = check_int("h", h, 0, self.n_heads - 1)
        s = slice(h * self.d_head, (h + 1) * self.d_head)
        return self.W_Q[:, s], self.W_UK[:, s], self.W_UV[:, s], self.W_O[s, :]

    def forward(self, x: Tensor, cache: LatentCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). With a cache, x holds the positions after the cached
        ones."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        if cache is not None and not isinstance(cache, LatentCache):
            raise ValueError(f"cache must be a LatentCache, got {type(cache).__name__}")
        B, T, _ = x.shape
        H, d_head, d_R = self.n_heads, self.d_head, self.d_R
        offset = 0 if cache is None else cache.offset(self.layer)
        angles = rope_angles(T, d_R, self.rope_base, offset=offset, device=x.device)  # (T, d_R/2)
        q = (x @ self.W_Q).view(B, T, H, d_head).transpose(1, 2)  # (B, H, T, d_head)
        q_R = apply_rope(
            (x @ self.W_QR).view(B, T, H, d_R).transpose(1, 2), angles
        )  # (B, H, T, d_R)
        c = x @ self.W_DKV  # (B, T, d_c)
        k_R = apply_rope(x @ self.W_KR, angles)  # (B, T, d_R)
        if cache is not None:
            c, k_R = cache.append_latent(self.layer, c, k_R)  # (B, T_k, d_c), (B, T_k, d_R)
        T_k = c.shape[1]
        if not self.absorb:
            k = (c @ self.W_UK).view(B, T_k, H, d_head).transpose(1, 2)  # (B, H, T_k, d_head)
            v = (c @ self.W_UV).view(B, T_k, H, d_head).transpose(1, 2)  # (B, H, T_k, d_head)
            k = torch.cat(
                [k, k_R[:, None].expand(B, H, T_k, d_R)], dim=-1
            )  # (B, H, T_k, d_head + d_R)
            z = attend(
                torch.cat([q, q_R], dim=-1), k, v, fused=self.fused, hook_pattern=self.hook_pattern
            )  # (B, H, T, d_head)
            return z.transpose(1, 2).reshape(B, T, H * d_head) @ self.W_O  # (B, T, d_model)
        W_QK, W_VO = absorbed_weights(self)  # (H, d_head, d_c), (H, d_c, d_model)
        q_c = q @ W_QK  # (B, H, T, d_c): the query read against c directly
        scores = (
            q_c @ c[:, None].transpose(-1, -2) + q_R @ k_R[:, None].transpose(-1, -2)
        ) / math.sqrt(d_head + d_R)
        pattern = softmax(scores + causal_mask(T, T_k, device=x.device))  # (B, H, T, T_k)
        z_c = pattern @ c[:, None]  # (B, H, T, d_c)
        return torch.einsum("bhtc,hcm->btm", z_c, W_VO)  # (B, T, d_model)


def absorbed_weights(attn: MultiHeadLatentAttention) -> tuple[Tensor, Tensor]:
    """The absorbed maps of every head: W_UK^{h T} (H, d_head, d_c), which turns a query into a
    row read against c, and W_UV^h W_O^h (H, d_c, d_model), which turns A_h c into the output."""
    if not isinstance(attn, MultiHeadLatentAttention):
        raise ValueError(f"attn must be a MultiHeadLatentAttention, got {type(attn).__name__}")
    H, d_head, d_c = attn.n_heads, attn.d_head, attn.d_c
    W_UK = attn.W_UK.view(d_c, H, d_head).permute(1, 2, 0)  # (H, d_head, d_c)
    W_UV = attn.W_UV.view(d_c, H, d_head).transpose(0, 1)  # (H, d_c, d_head)
    return W_UK, W_UV @ attn.W_O.view(
        H, d_head, attn.d_model
    )  # (H, d_head, d_c), (H, d_c, d_model)


def mla_model(config: ModernConfig, d_c: int, d_R: int) -> ModernGPT:
    """A :class:`ModernGPT` whose blocks use :class:`MultiHeadLatentAttention` (latent width d_c,
    rotary width d_R, the config's n_heads and d_head; its n_kv_heads is not used). Evaluate it
    with a :class:`LatentCache`.

    >>> m = mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4)
    >>> ids = torch.tensor([[1, 2, 3, 4]])
    >>> cache = LatentCache(m.config.n_layers, capacity=4)
    >>> step = torch.cat([m(ids[:, :3], cache), m(ids[:, 3:], cache)], dim=1)
    >>> torch.allclose(step, m(ids), atol=1e-6)
    True
    >>> cache.allocated_numbers() // len(cache)  # 2 layers x 12
    24
    """
    if not isinstance(config, ModernConfig):
        raise ValueError(f"config must be a ModernConfig, got {type(config).__name__}")
    model = ModernGPT(config)
    for layer, blk in enumerate(model.blocks):
        blk.attn = MultiHeadLatentAttention(
            config.d_model,
            config.n_heads,
            config.d_head,
            d_c,
            d_R,
            rope_base=config.rope_base,
            layer=layer,
        )
    return model
