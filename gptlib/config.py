"""Chapters 5 and 6: the shape of a GPT — one frozen configuration that the blocks and the model
read.

A block needs d_model, n_heads, d_head, d_mlp, its kind, the activation, dropout, biases and the
LayerNorm's epsilon; the whole model adds d_vocab, n_ctx, n_layers, the positions and the tied
unembedding. Every value is checked once, here: sizes are positive ints, floats finite and in
range, switches bools, names one of the known kinds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .attention import d_head_of
from .mlp import ACTIVATIONS
from .runtime import check_float, check_positive_int

__all__ = ["POSITIONAL_KINDS", "BLOCK_KINDS", "GPTConfig", "PRESETS", "named_preset"]

POSITIONAL_KINDS = ("learned", "sinusoidal")
BLOCK_KINDS = ("pre_ln", "post_ln", "parallel")


def named_preset(presets: dict, name: str, **overrides):
    """``presets[name]`` (a frozen config) with ``overrides`` replaced; an unknown name is a
    ``ValueError``.

    >>> from gptlib.model import PRESETS
    >>> named_preset(PRESETS, "tiny", n_layers=3).n_layers
    3
    """
    if name not in presets:
        raise ValueError(f"name must be one of {sorted(presets)}, got {name!r}")
    return dataclasses.replace(presets[name], **overrides)


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT. Derived values (``d_head``, ``d_mlp``) are checked on construction.

    >>> GPTConfig.preset("gpt2").d_head
    64
    >>> GPTConfig(ln_eps=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: ln_eps must be a finite number, got nan
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
        # Sizes are stored as Python ints (a NumPy integer is accepted and converted), so a
        # config always writes to JSON.
        for name in ("d_vocab", "n_ctx", "d_model", "n_heads", "n_layers"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name)))
        object.__setattr__(self, "d_head", d_head_of(self.d_model, self.n_heads, self.d_head))
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        object.__setattr__(self, "d_mlp", check_positive_int("d_mlp", self.d_mlp))
        object.__setattr__(
            self, "dropout", check_float("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        )
        object.__setattr__(self, "ln_eps", check_float("ln_eps", self.ln_eps, 0.0))
        for name in ("bias", "tie_weights", "attn_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, kinds in (
            ("positional", POSITIONAL_KINDS),
            ("block", BLOCK_KINDS),
            ("activation", tuple(ACTIVATIONS)),
        ):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in kinds:
                raise ValueError(f"{name} must be one of {kinds}, got {value!r}")
        if self.attn_only and self.block != "pre_ln":
            raise ValueError(f"attn_only needs block='pre_ln', got block={self.block!r}")

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        """A named configuration (see :data:`PRESETS`), optionally with fields overridden."""
        return named_preset(PRESETS, name, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _gpt3(d_model: int, n_heads: int, n_layers: int, d_head: int | None = None) -> GPTConfig:
    return GPTConfig(
        d_vocab=50257,
        n_ctx=2048,
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
        d_head=d_head,
    )


PRESETS: dict[str, GPTConfig] = {
    # GPT-2 (Radford et al. 2019), vocabulary 50257, context 1024.
    "gpt2": GPTConfig(d_model=768, n_heads=12, n_layers=12),
    "gpt2-medium": GPTConfig(d_model=1024, n_heads=16, n_layers=24),
    "gpt2-large": GPTConfig(d_model=1280, n_heads=20, n_layers=36),
    "gpt2-xl": GPTConfig(d_model=1600, n_heads=25, n_layers=48),
    # GPT-3 (Brown et al. 2020, Table 2.1), context 2048. (GPT-3's alternating sparse
    # attention is not modelled.)
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
