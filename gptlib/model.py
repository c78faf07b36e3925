"""Chapter 6: the full transformer — embedding, decoder stack, final LayerNorm, unembedding.

    X_0 = one_hot(ids) W_E + W_pos[:T]                    (T, d_model)
    X_l = Block_l(X_{l-1}),  l = 1, …, n_layers
    logits = LN_f(X_L) W_U                                (T, d_vocab)
    P(next token | ids[:t+1]) = softmax(logits[t])
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .attention import KVCache
from .block import BLOCK_KINDS, Block, LayerNorm
from .embedding import Embedding, Unembedding
from .hooks import capture_patterns
from .mlp import ACTIVATIONS
from .positional import LearnedPositional, SinusoidalPositional
from .runtime import check_positive_int, named_preset
from .files import config_from_dict, read_model, save_model
from .state import load_state_checked

__all__ = ["GPTConfig", "PRESETS", "GPT"]

POSITIONAL_KINDS = ("learned", "sinusoidal")


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT. Derived values (``d_head``, ``d_mlp``) are checked on construction.

    >>> GPTConfig.preset("gpt2").d_head
    64
    """

    d_vocab: int = 50257
    n_ctx: int = 1024
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_mlp: int | None = None  # default 4 * d_model
    d_head: int | None = None  # default d_model // n_heads
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    positional: str = "learned"
    block: str = "pre_ln"
    activation: str = "gelu_tanh"
    ln_eps: float = 1e-5
    attn_only: bool = False  # blocks without MLPs (Chapter 8's induction heads); pre-LN only

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx", "d_model", "n_heads", "n_layers"):
            check_positive_int(name, getattr(self, name))
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model} (or give d_head)")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check_positive_int("d_head", self.d_head)
        check_positive_int("d_mlp", self.d_mlp)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"positional must be one of {POSITIONAL_KINDS}, got {self.positional!r}")
        if self.block not in BLOCK_KINDS:
            raise ValueError(f"block must be one of {BLOCK_KINDS}, got {self.block!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.ln_eps < 0:
            raise ValueError(f"ln_eps must be >= 0, got {self.ln_eps}")
        if self.attn_only and self.block != "pre_ln":
            raise ValueError(f"attn_only needs block='pre_ln', got block={self.block!r}")

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        """A named configuration (see :data:`PRESETS`), optionally with fields overridden."""
        return named_preset(PRESETS, name, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"config has unknown fields {unknown}")
        return cls(**d)


def _gpt3(d_model: int, n_heads: int, n_layers: int, d_head: int | None = None) -> GPTConfig:
    return GPTConfig(d_vocab=50257, n_ctx=2048, d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_head=d_head)


PRESETS: dict[str, GPTConfig] = {
    # GPT-2 (Radford et al. 2019), vocabulary 50257, context 1024.
    "gpt2": GPTConfig(d_model=768, n_heads=12, n_layers=12),
    "gpt2-medium": GPTConfig(d_model=1024, n_heads=16, n_layers=24),
    "gpt2-large": GPTConfig(d_model=1280, n_heads=20, n_layers=36),
    "gpt2-xl": GPTConfig(d_model=1600, n_heads=25, n_layers=48),
    # GPT-3 (Brown et al. 2020, Table 2.1), context 2048. (GPT-3's alternating sparse attention is not modelled.)
    "gpt3-small": _gpt3(768, 12, 12),
    "gpt3-medium": _gpt3(1024, 16, 24),
    "gpt3-large": _gpt3(1536, 16, 24, d_head=96),
    "gpt3-xl": _gpt3(2048, 24, 24, d_head=128),
    "gpt3-2.7b": _gpt3(2560, 32, 32),
    "gpt3-6.7b": _gpt3(4096, 32, 32),
    "gpt3-13b": _gpt3(5120, 40, 40),
    "gpt3-175b": _gpt3(12288, 96, 96),
    # Small models for the book: each trains or runs in seconds on a 2-core CPU.
    "tiny": GPTConfig(d_vocab=512, n_ctx=64, d_model=64, n_heads=4, n_layers=2),
    "book-small": GPTConfig(d_vocab=2048, n_ctx=128, d_model=128, n_heads=4, n_layers=4),
}


class GPT(nn.Module):
    """A decoder-only transformer: ids (B, T) -> logits (B, T, d_vocab)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.embed = Embedding(c.d_vocab, c.d_model)
        self.pos = LearnedPositional(c.n_ctx, c.d_model) if c.positional == "learned" else SinusoidalPositional(c.n_ctx, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.d_model, c.n_heads, c.d_mlp, d_head=c.d_head, kind=c.block, dropout=c.dropout,
                  bias=c.bias, activation=c.activation, ln_eps=c.ln_eps, layer=layer, attn_only=c.attn_only)
            for layer in range(c.n_layers)
        )
        self.ln_f = LayerNorm(c.d_model, c.ln_eps, c.bias)
        self.unembed = Unembedding(c.d_model, c.d_vocab, tied_to=self.embed if c.tie_weights else None)
        # GPT-2's initialisation: N(0, 0.02), with the two projections that write into the
        # residual stream scaled by 1/sqrt(2 n_layers) so its variance does not grow with depth.
        for blk in self.blocks:
            nn.init.normal_(blk.attn.W_O, std=0.02 / math.sqrt(2 * c.n_layers))
            if blk.mlp is not None:
                nn.init.normal_(blk.mlp.W_out, std=0.02 / math.sqrt(2 * c.n_layers))

    # --- names of the notes -----------------------------------------------------------------
    @property
    def W_E(self) -> Tensor:
        return self.embed.W_E

    @property
    def W_U(self) -> Tensor:
        return self.unembed.W_U

    def num_parameters(self, exclude_positional: bool = False) -> int:
        """The number of trainable numbers; tied W_U = W_E^T is counted once."""
        seen, n = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or (exclude_positional and name.startswith("pos.")):
                continue
            seen.add(id(p))
            n += p.numel()
        return n

    # --- forward ----------------------------------------------------------------------------
    def _trunk(self, ids: Tensor, cache: KVCache | None) -> Tensor:
        if ids.dim() == 1:
            raise ValueError(f"ids must have shape (B, T); got shape {tuple(ids.shape)} (use ids[None])")
        if ids.dim() != 2 or ids.shape[1] < 1:
            raise ValueError(f"ids must have shape (B, T) with T >= 1, got {tuple(ids.shape)}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be int64 or int32, got {ids.dtype}")
        B, T = ids.shape
        offset = 0 if cache is None else len(cache)
        if offset + T > self.config.n_ctx:
            raise ValueError(
                f"ids has {offset + T} positions{' including the cache' if offset else ''}, "
                f"more than n_ctx={self.config.n_ctx}; crop the context first"
            )
        if cache is not None and cache.n_layers != self.config.n_layers:
            raise ValueError(f"cache has {cache.n_layers} layers, the model {self.config.n_layers}")
        x = self.drop(self.embed(ids) + self.pos(T, offset))  # (B, T, d_model)
        for blk in self.blocks:
            x = blk(x, cache)
        return self.ln_f(x)  # (B, T, d_model)

    def forward(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits (B, T, d_vocab).

        With a :class:`KVCache`, ``ids`` are the positions after the cached ones; the cache is
        extended in place. Positions beyond ``n_ctx`` raise ``ValueError``: cropping the context
        is the caller's decision (see :func:`gptlib.sampling.generate`), never a silent one.
        """
        return self.unembed(self._trunk(ids, cache))  # (B, T, d_vocab)

    def hidden_states(self, ids: Tensor) -> Tensor:
        """The final residual stream after LN_f, (B, T, d_model): what W_U turns into logits."""
        return self._trunk(ids, None)

    @torch.no_grad()
    def attention_patterns(self, ids: Tensor) -> Tensor:
        """Every layer's and head's attention pattern from one forward pass: (B, n_layers, n_heads, T, T).

        The layers run their readable path while the patterns are recorded (:func:`capture_patterns`).
        """
        with capture_patterns(self) as patterns:
            self(ids)
        return torch.stack(patterns, dim=1)

    # --- files: one safetensors file with the config inside (gptlib.state) ----------------------
    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write the weights and the config as one safetensors file, in one atomic step; returns it.

        ``path`` is a ``.safetensors`` file or a directory (then ``path/model.safetensors``).
        ``dtype`` (float16, bfloat16, float32, float64) stores the floating-point weights in that
        width: float16 halves the file, and a weight beyond its range is an error, not an infinity.
        The same weights always give the same bytes. See :func:`gptlib.state.save_model`.
        """
        return save_model(self, path, dtype)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "GPT":
        """Read a model written by :meth:`save` (or the model of a training checkpoint).

        A file that is damaged, holds another class's model, or whose tensors do not match its
        config (names, shapes, dtypes: float widths are cast, nothing else) raises ``ValueError``
        naming the file and the field or tensor.
        """
        config, state, _, source = read_model(path, cls.__name__)
        model = cls(config_from_dict(GPTConfig, config, source))
        load_state_checked(model, state, source)
        return model.to(map_location)
