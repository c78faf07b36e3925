"""Chapter 6: the full transformer — embedding, decoder stack, final LayerNorm, unembedding.

    X_0 = Dropout(one_hot(ids) W_E + W_pos[offset : offset + T])   (T, d_model)   input_stream
    X_l = Block_l(X_{l-1}),  l = 1, …, n_layers
    logits = LN_f(X_L) W_U                                         (T, d_vocab)   read_out
    P(next token | ids[:t+1]) = softmax(logits[t])

The configuration (:class:`GPTConfig`, its presets) lives in :mod:`gptlib.config`, where the
blocks read it too; it is imported here, where the book introduces it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn

from .block import Block, LayerNorm
from .config import PRESETS, GPTConfig
from .embedding import Embedding, Unembedding, init_normal_, skip_init
from .files import config_from_dict, read_model, save_model
from .hooks import HookPoint, capture_patterns
from .kvcache import KVCache, check_cache
from .positional import LearnedPositional, SinusoidalPositional
from .runtime import check_not_meta
from .state import load_state_checked

__all__ = ["GPTConfig", "PRESETS", "GPT"]


class GPT(nn.Module):
    """A decoder-only transformer: ids (B, T) -> logits (B, T, d_vocab).

    The forward pass is three steps, each a method that other code reuses (activation
    checkpointing, pipeline stages): :meth:`input_stream`, the blocks, :meth:`read_out`.
    ``hook_resid`` points (:class:`~gptlib.hooks.HookPoint`) see the residual stream X_0 and the
    output of every block (n_layers + 1 in all), as in :class:`gptlib.modern.ModernGPT`, so
    :func:`gptlib.hooks.logit_lens` reads either model.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.embed = Embedding(c.d_vocab, c.d_model)
        self.pos = (
            LearnedPositional(c.n_ctx, c.d_model)
            if c.positional == "learned"
            else SinusoidalPositional(c.n_ctx, c.d_model)
        )
        self.drop = nn.Dropout(c.dropout)
        self.hook_resid = HookPoint()  # (B, T, d_model): X_0
        self.blocks = nn.ModuleList(Block(c, layer) for layer in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model, c.ln_eps, c.bias)
        self.unembed = Unembedding(
            c.d_model, c.d_vocab, tied_to=self.embed if c.tie_weights else None
        )
        # GPT-2's initialisation: N(0, 0.02), with the two projections that write into the
        # residual stream scaled by 1/sqrt(2 n_layers) so its variance does not grow with depth.
        for blk in self.blocks:
            init_normal_(blk.attn.W_O, 0.02 / math.sqrt(2 * c.n_layers))
            if blk.mlp is not None:
                init_normal_(blk.mlp.W_out, 0.02 / math.sqrt(2 * c.n_layers))

    # --- names of the notes -----------------------------------------------------------------
    @property
    def W_E(self) -> Tensor:
        return self.embed.W_E

    @property
    def W_U(self) -> Tensor:
        return self.unembed.W_U

    @property
    def W_U_rows(self) -> Tensor:
        """W_U^T (d_vocab, d_model) as the model holds it: the embedding W_E itself when W_U is
        tied to it (no transposed copy), else the transpose of the parameter W_U.

        >>> from gptlib.model import GPTConfig
        >>> model = GPT(GPTConfig.preset("tiny"))
        >>> model.W_U_rows is model.W_E, tuple(model.W_U_rows.shape) == tuple(model.W_U.T.shape)
        (True, True)
        """
        return self.unembed.W_E if self.unembed.tied else self.unembed.W_U.T

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
    def input_stream(self, ids: Tensor, offset: int = 0, *, check_ids: bool = True) -> Tensor:
        """X_0 = Dropout(W_E[ids] + W_pos[offset : offset + T]): the residual stream entering block
        1,
        (B, T, d_model), for ids (B, T) at positions offset … offset + T - 1.

        The ids' shape and type are always checked; their values (ints in [0, d_vocab)) unless
        ``check_ids=False``, which a caller that has checked them already passes (reading the
        values synchronises with a GPU; :func:`gptlib.sampling.generate` checks once per call).
        """
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            hint = " (use ids[None])" if isinstance(ids, Tensor) and ids.dim() == 1 else ""
            raise ValueError(f"ids must have shape (B, T) with B, T >= 1, got {shape}{hint}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be int64 or int32, got {ids.dtype}")
        check_not_meta(self.embed.W_E, ids)  # a meta model gives no values for real ids
        T = ids.shape[1]
        if offset + T > self.config.n_ctx:
            raise ValueError(
                f"ids has {offset + T} positions{' including the cache' if offset else ''}, "
                f"more than n_ctx={self.config.n_ctx}; crop the context first"
            )
        x = self.drop(self.embed(ids, check_ids=check_ids) + self.pos(T, offset))  # (B, T, d_model)
        return self.hook_resid(x)

    def read_out(self, x: Tensor) -> Tensor:
        """logits = LN_f(x) W_U, (B, T, d_vocab), from the last residual stream x
        (B, T, d_model)."""
        return self.unembed(self.ln_f(x))  # (B, T, d_vocab)

    def _residual_stream(self, ids: Tensor, cache: KVCache | None, check_ids: bool) -> Tensor:
        """X_L, the residual stream after the last block, (B, T, d_model)."""
        check_cache(cache, self.config.n_layers)
        x = self.input_stream(
            ids, 0 if cache is None else cache.offset(0), check_ids=check_ids
        )  # (B, T, d_model)
        for blk in self.blocks:
            x = blk(x, cache)
        return x

    def forward(
        self, ids: Tensor, cache: KVCache | None = None, *, check_ids: bool = True
    ) -> Tensor:
        """Logits (B, T, d_vocab).

        With a :class:`KVCache`, ``ids`` are the positions after the cached ones; the cache is
        extended in place. Positions beyond ``n_ctx`` raise ``ValueError``: cropping the context
        is the caller's decision (see :func:`gptlib.sampling.generate`), never a silent one.
        ``check_ids`` as in :meth:`input_stream`.
        """
        return self.read_out(self._residual_stream(ids, cache, check_ids))  # (B, T, d_vocab)

    def hidden_states(self, ids: Tensor) -> Tensor:
        """The final residual stream after LN_f, (B, T, d_model): what W_U turns into logits."""
        return self.ln_f(self._residual_stream(ids, None, True))

    @torch.no_grad()
    def attention_patterns(self, ids: Tensor) -> Tensor:
        """Every layer's and head's attention pattern from one forward pass: (B, n_layers, n_heads,
        T, T).

        The layers run their readable path while the patterns are recorded
        (:func:`capture_patterns`).
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
        The same weights always give the same bytes. See :func:`gptlib.files.save_model`.
        """
        return save_model(self, path, dtype)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> GPT:
        """Read a model written by :meth:`save` (or the model of a training checkpoint).

        A file that is damaged, holds another class's model, or whose tensors do not match its
        config (names, shapes, dtypes: float widths are cast, nothing else) raises ``ValueError``
        naming the file and the field or tensor.

        The model is built without drawing its initial weights
        (:func:`~gptlib.embedding.skip_init`): every weight is loaded next, and the global random
        generator is left as it was.
        """
        config, state, _, source = read_model(path, cls.__name__)
        config = config_from_dict(GPTConfig, config, source)
        with skip_init():  # every weight is overwritten below, or the model is discarded
            model = cls(config)
        load_state_checked(model, state, source)
        return model.to(map_location)
