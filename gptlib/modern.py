"""Chapter 12: today's GPTs — rotary positions, RMSNorm, SwiGLU and grouped-query attention.

Four changes turn the GPT-2 block of Chapters 4–6 into the block of Llama-style models such as
SmolLM2 (all linear maps without biases, rows times weights as everywhere in the book):

    RoPE:     q_t = x_t W_Q rho_t,  k_s = x_s W_K rho_s,  rho_t block-diagonal rotations by t
    omega_i,
              omega_i = base^(-2i/d_head), so q_t . k_s = x_t W_Q rho_(t-s) (x_s W_K)^T depends on t
              - s only
    RMSNorm:  x / sqrt(mean(x^2) + eps) * w                       (LayerNorm without centring)
    SwiGLU:   (silu(x W_gate) * (x W_up)) W_out                    (a gated MLP, three matrices)
    GQA:      n_heads query heads share n_kv_heads key/value heads, group G = n_heads / n_kv_heads

    X_0 = one_hot(ids) W_E                      (no positional matrix: positions enter through RoPE)
    X_l = X_(l-1) + Attn(ln_1(X_(l-1))),  then  X_l + SwiGLU(ln_2(X_l))    (ln_1, ln_2, ln_f:
    RMSNorms)
    logits = ln_f(X_L) W_U,  W_U = W_E^T when tied
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import runtime
from .attention import attend, d_head_of, non_finite_rows
from .config import named_preset
from .files import config_from_dict, read_model, save_model
from .hooks import HookPoint, logit_lens
from .kvcache import KVCache, check_cache
from .positional import sinusoidal_frequencies
from .runtime import check_float, check_int, check_positive_int
from .state import check_state

__all__ = [
    "rope_angles",
    "apply_rope",
    "rms_norm",
    "RMSNorm",
    "swiglu",
    "SwiGLU",
    "kv_cache_bytes",
    "GroupedQueryAttention",
    "ModernConfig",
    "MODERN_PRESETS",
    "ModernBlock",
    "ModernGPT",
    "logit_lens",  # gptlib.hooks.logit_lens, which reads GPT and ModernGPT alike
]


# --- rotary position embedding ------------------------------------------------------------------
def rope_angles(T: int, d_head: int, base: float = 10000.0, offset: int = 0, device=None) -> Tensor:
    """The rotation angles (offset + t) omega_i, omega_i = base^(-2i/d_head): shape (T, d_head/2).

    The frequencies are those of the sinusoidal encoding (Chapter 2), computed in float64.

    >>> rope_angles(2, 4, base=100.0)
    tensor([[0.0000, 0.0000],
            [1.0000, 0.1000]], dtype=torch.float64)
    """
    check_positive_int("T", T)
    check_int("offset", offset, lo=0)
    theta = sinusoidal_frequencies(d_head, base).to(device)  # (d_head/2,)
    t = torch.arange(offset, offset + T, dtype=torch.float64, device=device)  # (T,)
    return t[:, None] * theta[None, :]  # (T, d_head/2)


def apply_rope(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate each coordinate pair (x_2i, x_2i+1) of the rows of x by its angle: x R_t.

    x: (..., T, d_head), angles: (T, d_head/2). With row vectors, pair i maps to
    (x_2i cos a - x_2i+1 sin a, x_2i sin a + x_2i+1 cos a), a = angles[t, i], computed as
    x * (cos a, cos a) + (x_2i+1, x_2i) * (-sin a, sin a): the same products and sums, so the same
    numbers bit for bit, in four operations on the whole row (an exported graph of the step runs
    them as four nodes, not a split, a stack and a dozen small ones per rotation).

    >>> import math
    >>> rotated = apply_rope(torch.tensor([[1.0, 0.0]]), torch.tensor([[math.pi / 2]]))
    >>> (rotated.round(decimals=4) + 0.0).tolist()
    [[0.0, 1.0]]
    """
    if x.shape[-1] % 2 or x.dim() < 2 or tuple(angles.shape) != (x.shape[-2], x.shape[-1] // 2):
        raise ValueError(
            f"angles must have shape (T, d_head/2) for x of shape {tuple(x.shape)}, got "
            f"{tuple(angles.shape)}"
        )
    # contiguous, as the stack of the pairs made it: the products that read it take the same path
    return _rotate_pairs(x, *_rope_tables(angles, x.dtype)).contiguous()  # (..., T, d_head)


def _rope_tables(angles: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(cos a, cos a) and (-sin a, sin a) for each pair's angle a, in ``dtype``: (T, d_head)."""
    cos, sin = torch.cos(angles), torch.sin(angles)  # (T, d_head/2)
    c = torch.stack([cos, cos], dim=-1).flatten(-2).to(dtype)
    s = torch.stack([-sin, sin], dim=-1).flatten(-2).to(dtype)
    return c, s


def _rotate_pairs(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    """x * c + (x_2i+1, x_2i) * s: :func:`apply_rope` with its tables (broadcast against x)."""
    swap = torch.arange(x.shape[-1], device=x.device) ^ 1  # 1, 0, 3, 2, ...: each pair swapped
    return x * c + x.index_select(-1, swap) * s


# --- RMSNorm and SwiGLU -------------------------------------------------------------------------
def rms_norm(x: Tensor, w: Tensor, eps: float = 1e-5) -> Tensor:
    """Each row divided by its root mean square, times the gain: x / sqrt(mean(x^2) + eps) * w.

    >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), eps=0.0)
    tensor([[0.8485, 1.1314]])
    """
    eps = check_float("eps", eps, 0.0)
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with gain ``w`` (d_model,) and no bias."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        check_positive_int("d_model", d_model)
        self.d_model, self.eps = d_model, check_float("eps", eps, 0.0)
        self.w = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.w, self.eps)


def swiglu(x: Tensor, W_gate: Tensor, W_up: Tensor, W_out: Tensor) -> Tensor:
    """The gated MLP (silu(x W_gate) * (x W_up)) W_out, silu(z) = z sigmoid(z).

    >>> I = torch.eye(2)
    >>> swiglu(torch.tensor([[1.0, -1.0]]), I, I, I)
    tensor([[0.7311, 0.2689]])
    """
    return (F.silu(x @ W_gate) * (x @ W_up)) @ W_out


def _normal_init(*shape: int) -> nn.Parameter:
    """A parameter of the given shape drawn from N(0, 0.02^2). On the meta device (shapes only, as
    :meth:`ModernGPT.from_state` builds a model) there are no values to scale, and PyTorch's
    arithmetic on meta tensors imports torch._dynamo (about 2 s of CPU, once per process): the meta
    tensor is kept as it is.

    >>> with torch.device("meta"):
    ...     W = _normal_init(2, 3)
    >>> tuple(W.shape), W.is_meta, _normal_init(2, 3).is_meta
    ((2, 3), True, False)
    """
    W = torch.randn(*shape)  # (*shape), on the default device
    return nn.Parameter(W if W.is_meta else W * 0.02)


class SwiGLU(nn.Module):
    """SwiGLU MLP: W_gate, W_up (d_model, d_mlp) and W_out (d_mlp, d_model); 3 d_model d_mlp
    parameters."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_mlp", d_mlp)
        self.W_gate = _normal_init(d_model, d_mlp)
        self.W_up = _normal_init(d_model, d_mlp)
        self.W_out = _normal_init(d_mlp, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x, self.W_gate, self.W_up, self.W_out)


# --- grouped-query attention --------------------------------------------------------------------
def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, d_head: int, T: int, bytes_per_number: int = 2
) -> int:
    """Memory of a KV cache: keys and values, per layer, per kv head, per position.

    >>> kv_cache_bytes(30, 3, 64, 8192)  # SmolLM2-135M at its full context, in 16-bit numbers
    188743680
    """
    for name, v in (
        ("n_layers", n_layers),
        ("n_kv_heads", n_kv_heads),
        ("d_head", d_head),
        ("T", T),
        ("bytes_per_number", bytes_per_number),
    ):
        check_positive_int(name, v)
    return 2 * n_layers * n_kv_heads * d_head * T * bytes_per_number


class GroupedQueryAttention(nn.Module):
    """Causal attention with RoPE and n_kv_heads key/value heads shared by groups of query heads.

    W_Q (d_model, n_heads*d_head), W_K, W_V (d_model, n_kv_heads*d_head), W_O (n_heads*d_head,
    d_model);
    no biases. A :class:`KVCache` stores the n_kv_heads keys and values (rotated at their
    positions), which is the memory GQA saves. The attention itself is
    :func:`gptlib.attention.attend`:
    ``fused`` and ``hook_pattern`` mean what they mean in
    :class:`gptlib.attention.MultiHeadAttention`;
    ``layer`` is this layer's index in the cache.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        *,
        rope_base: float = 10000.0,
        layer: int = 0,
        fused: bool = True,
    ):
        super().__init__()
        for name, v in (
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("n_kv_heads", n_kv_heads),
            ("d_head", d_head),
        ):
            check_positive_int(name, v)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        if d_head % 2:
            raise ValueError(f"d_head must be even for RoPE, got {d_head}")
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = (
            d_model,
            n_heads,
            n_kv_heads,
            d_head,
        )
        self.rope_base = check_float("rope_base", rope_base, 1.0, lo_open=True)
        if not isinstance(fused, bool):
            raise ValueError(f"fused must be True or False, got {fused!r}")
        self.group, self.layer, self.fused = (
            n_heads // n_kv_heads,
            check_int("layer", layer, lo=0),
            fused,
        )
        self.W_Q = _normal_init(d_model, n_heads * d_head)
        self.W_K = _normal_init(d_model, n_kv_heads * d_head)
        self.W_V = _normal_init(d_model, n_kv_heads * d_head)
        self.W_O = _normal_init(n_heads * d_head, d_model)
        self.hook_pattern = HookPoint()  # (B, n_heads, T, T_k), on the readable path only
        self.hook_q = HookPoint()  # (B, n_heads, T, d_head): the queries after RoPE

    def head_weights(self, h: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_Q^h, W_K^g, W_V^g (d_model, d_head) and W_O^h (d_head, d_model), g = h // group."""
        h = check_int("h", h, 0, self.n_heads - 1)
        s, g = slice(h * self.d_head, (h + 1) * self.d_head), h // self.group
        sg = slice(g * self.d_head, (g + 1) * self.d_head)
        return self.W_Q[:, s], self.W_K[:, sg], self.W_V[:, sg], self.W_O[s, :]

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        B, T, _ = x.shape
        offset = (
            0 if cache is None else cache.offset(self.layer)
        )  # the position of the first row of x
        angles = rope_angles(
            T, self.d_head, self.rope_base, offset=offset, device=x.device
        )  # (T, d_head/2)
        # apply_rope's rotation, on the rows before the heads are moved forward (its tables
        # broadcast over the heads), then (B, heads, T, d_head) made contiguous as apply_rope
        # returns it: the same numbers, and an exported graph transposes each once
        c, s = (t[:, None] for t in _rope_tables(angles, x.dtype))  # (T, 1, d_head)
        q = _rotate_pairs((x @ self.W_Q).view(B, T, self.n_heads, self.d_head), c, s)
        k = _rotate_pairs((x @ self.W_K).view(B, T, self.n_kv_heads, self.d_head), c, s)
        q = self.hook_q(q.transpose(1, 2).contiguous())  # (B, n_heads, T, d_head)
        k = k.transpose(1, 2).contiguous()  # (B, n_kv_heads, T, d_head)
        v = (x @ self.W_V).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(self.layer, k, v)  # (B, n_kv_heads, T_k, d_head), T_k = offset + T
        z = attend(
            q, k, v, fused=self.fused, hook_pattern=self.hook_pattern
        )  # (B, n_heads, T, d_head)
        z = z.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, n_heads*d_head)
        return z @ self.W_O + non_finite_rows(q, k)  # (B, T, d_model); see non_finite_rows


# --- the model ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModernConfig:
    """The shape of a Llama-style GPT; ``d_head`` defaults to d_model // n_heads.

    >>> c = ModernConfig.preset("smollm2-135m")
    >>> c.d_head, c.n_heads // c.n_kv_heads
    (64, 3)
    """

    d_vocab: int = 49152
    n_ctx: int = 8192
    d_model: int = 576
    n_layers: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    d_mlp: int = 1536
    d_head: int | None = None
    rope_base: float = 100000.0
    ln_eps: float = 1e-5
    tie_weights: bool = True

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_mlp"):
            # stored as a Python int (NumPy integers converted), so the config writes to JSON
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        object.__setattr__(self, "d_head", d_head_of(self.d_model, self.n_heads, self.d_head))
        if self.d_head % 2:
            raise ValueError(f"d_head must be a positive even int, got {self.d_head!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        object.__setattr__(
            self, "rope_base", check_float("rope_base", self.rope_base, 1.0, lo_open=True)
        )
        object.__setattr__(self, "ln_eps", check_float("ln_eps", self.ln_eps, 0.0))
        if not isinstance(self.tie_weights, bool):
            raise ValueError(f"tie_weights must be True or False, got {self.tie_weights!r}")

    @classmethod
    def preset(cls, name: str, **overrides) -> ModernConfig:
        return named_preset(MODERN_PRESETS, name, **overrides)


MODERN_PRESETS: dict[str, ModernConfig] = {
    # SmolLM2-135M (Hugging Face, 2024): the model of Chapter 12.
    "smollm2-135m": ModernConfig(),
    # A few-thousand-parameter model for tests.
    "tiny": ModernConfig(
        d_vocab=300,
        n_ctx=32,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_mlp=48,
        rope_base=10000.0,
    ),
}


class ModernBlock(nn.Module):
    """Pre-norm block: x + Attn(ln_1(x)), then x + SwiGLU(ln_2(x)); ``hook_resid`` sees the output.

    ``ln_1`` and ``ln_2`` are RMSNorms with gain ``w``, named as in :class:`gptlib.block.Block`,
    whose ``ln_1``, ``ln_2`` are LayerNorms: a norm is named by its place in the block."""

    def __init__(self, config: ModernConfig, layer: int = 0):
        super().__init__()
        c = config
        self.ln_1 = RMSNorm(c.d_model, c.ln_eps)
        self.attn = GroupedQueryAttention(
            c.d_model, c.n_heads, c.n_kv_heads, c.d_head, rope_base=c.rope_base, layer=layer
        )
        self.ln_2 = RMSNorm(c.d_model, c.ln_eps)
        self.mlp = SwiGLU(c.d_model, c.d_mlp)
        self.hook_resid = HookPoint()  # (B, T, d_model)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return self.hook_resid(x + self.mlp(self.ln_2(x)))


class ModernGPT(nn.Module):
    """A Llama-style decoder: ids (B, T) -> logits (B, T, d_vocab), ``ln_f(X_L) W_U`` with ``ln_f``
    the final RMSNorm (as :class:`gptlib.model.GPT`'s ``ln_f``). ``hook_resid`` points see the
    residual stream after the embedding and after every block (n_layers + 1 in all)."""

    def __init__(self, config: ModernConfig):
        super().__init__()
        if not isinstance(config, ModernConfig):
            raise ValueError(f"config must be a ModernConfig, got {type(config).__name__}")
        c = self.config = config
        self.W_E = _normal_init(c.d_vocab, c.d_model)
        self.hook_resid = HookPoint()
        self.blocks = nn.ModuleList(ModernBlock(c, layer) for layer in range(c.n_layers))
        self.ln_f = RMSNorm(c.d_model, c.ln_eps)
        self.W_U_untied = None if c.tie_weights else _normal_init(c.d_model, c.d_vocab)

    @property
    def W_U(self) -> Tensor:
        """The unembedding (d_model, d_vocab): W_E^T when the weights are tied."""
        return self.W_E.T if self.W_U_untied is None else self.W_U_untied

    @property
    def W_U_rows(self) -> Tensor:
        """W_U^T (d_vocab, d_model) as the model holds it: the embedding W_E itself when the
        weights are tied (no transposed copy), else the transpose of ``W_U_untied``.

        >>> model = ModernGPT(ModernConfig.preset("tiny"))
        >>> model.W_U_rows is model.W_E, tuple(model.W_U_rows.shape) == tuple(model.W_U.T.shape)
        (True, True)
        """
        return self.W_E if self.W_U_untied is None else self.W_U_untied.T

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def read_out(self, x: Tensor) -> Tensor:
        """logits = ln_f(x) W_U, (B, T, d_vocab), from the last residual stream x,
        (B, T, d_model)."""
        return self.ln_f(x) @ self.W_U

    def forward(
        self, ids: Tensor, cache: KVCache | None = None, *, check_ids: bool = True
    ) -> Tensor:
        """Logits (B, T, d_vocab). With a cache, ``ids`` continue the cached positions. The ids'
        values are checked (ints in [0, d_vocab)) unless ``check_ids=False``, as in
        :class:`gptlib.model.GPT`."""
        if (
            not isinstance(ids, Tensor)
            or ids.dim() != 2
            or min(ids.shape) < 1
            or ids.dtype not in (torch.int64, torch.int32)
        ):
            shape = (ids.dtype, tuple(ids.shape)) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(
                f"ids must be an int64 or int32 tensor of shape (B, T) with B, T >= 1, got {shape}"
            )
        runtime.check_not_meta(self.W_E, ids)  # a meta model gives no values for real ids
        if check_ids:
            runtime.check_ids(ids, self.config.d_vocab)
        check_cache(cache, self.config.n_layers)
        offset = 0 if cache is None else cache.offset(0)  # len(cache), kept symbolic when traced
        if offset + ids.shape[1] > self.config.n_ctx:
            raise ValueError(
                f"ids has {offset + ids.shape[1]} positions, more than n_ctx={self.config.n_ctx}; "
                "crop the context first"
            )
        x = self.hook_resid(F.embedding(ids, self.W_E))  # (B, T, d_model)
        for blk in self.blocks:
            x = blk(x, cache)
        return self.read_out(x)  # (B, T, d_vocab)

    # --- files: one safetensors file with the config inside (gptlib.state) ----------------------
    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write the weights and the config as one safetensors file, in one atomic step; returns it.
        ``path`` and ``dtype`` as in :meth:`gptlib.model.GPT.save`."""
        return save_model(self, path, dtype)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> ModernGPT:
        """Read a model written by :meth:`save`; a damaged file, or one that does not match its
        config, raises ``ValueError`` naming the file and the field or tensor."""
        config, state, _, source = read_model(path, cls.__name__)
        return cls.from_state(config_from_dict(ModernConfig, config, source), state, source).to(
            map_location
        )

    @classmethod
    def from_state(
        cls, config: ModernConfig, state: dict[str, Tensor], source: str = "state dict"
    ) -> ModernGPT:
        """A model that holds the given tensors (no copy, no random initialisation first; float
        widths are cast to the model's); a missing, unexpected, mis-shaped or mistyped tensor raises
        ``ValueError`` naming it."""
        with torch.device("meta"):
            model = cls(config)
        state = check_state(model, state, source)
        expected = model.state_dict()
        model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, assign=True)
        return model.eval()
