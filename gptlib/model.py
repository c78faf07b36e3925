"""Chapter 6: the full transformer — embedding, decoder stack, final LayerNorm, unembedding.

    X_0 = one_hot(ids) W_E + W_pos[:T]                    (T, d_model)
    X_l = Block_l(X_{l-1}),  l = 1, …, n_layers
    logits = LN_f(X_L) W_U                                (T, d_vocab)
    P(next token | ids[:t+1]) = softmax(logits[t])
"""

from __future__ import annotations

import dataclasses
import json
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
from .runtime import atomic_write

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

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model} (or give d_head)")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if self.d_head < 1:
            raise ValueError(f"d_head must be >= 1, got {self.d_head}")
        if self.d_mlp < 1:
            raise ValueError(f"d_mlp must be >= 1, got {self.d_mlp}")
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

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        """A named configuration (see :data:`PRESETS`), optionally with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"name must be one of {sorted(PRESETS)}, got {name!r}")
        return dataclasses.replace(PRESETS[name], **overrides)

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
                  bias=c.bias, activation=c.activation, ln_eps=c.ln_eps, layer=layer)
            for layer in range(c.n_layers)
        )
        self.ln_f = LayerNorm(c.d_model, c.ln_eps, c.bias)
        self.unembed = Unembedding(c.d_model, c.d_vocab, tied_to=self.embed if c.tie_weights else None)
        # GPT-2's initialisation: N(0, 0.02), with the two projections that write into the
        # residual stream scaled by 1/sqrt(2 n_layers) so its variance does not grow with depth.
        for blk in self.blocks:
            nn.init.normal_(blk.attn.W_O, std=0.02 / math.sqrt(2 * c.n_layers))
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

    # --- GPT-2 weights from Hugging Face ---------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model) -> "GPT":
        """A gptlib GPT with the weights of a ``transformers`` ``GPT2LMHeadModel``.

        Duck-typed: only ``hf_model.config`` (``to_dict()``) and ``hf_model.state_dict()`` are used,
        so gptlib does not import transformers. HF stores GPT-2's matrices in ``Conv1D`` layers as
        (in, out), the same x @ W layout as gptlib: only the fused ``c_attn`` needs splitting.
        """
        cfg = hf_model.config.to_dict() if hasattr(hf_model.config, "to_dict") else dict(vars(hf_model.config))
        return cls._from_hf_parts(cfg, hf_model.state_dict(), source=type(hf_model).__name__)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, map_location: str | torch.device = "cpu") -> "GPT":
        """GPT-2 weights in HF layout: a local directory (``config.json`` + ``model.safetensors`` or
        ``pytorch_model.bin``) or, online, a Hub name such as ``"gpt2"`` (via ``huggingface_hub``)."""
        path = Path(name_or_path)
        if path.is_dir():
            cfg_file = path / "config.json"
            weights = [path / "model.safetensors", path / "pytorch_model.bin"]
            if not cfg_file.is_file():
                raise FileNotFoundError(f"{cfg_file} does not exist")
            weight_file = next((w for w in weights if w.is_file()), None)
            if weight_file is None:
                raise FileNotFoundError(f"{path} has neither model.safetensors nor pytorch_model.bin")
        else:
            if str(name_or_path).startswith((".", "/")) or path.suffix:
                raise FileNotFoundError(f"{name_or_path} is not a directory")
            from huggingface_hub import hf_hub_download  # online only: Colab, not the tests

            try:
                cfg_file = Path(hf_hub_download(str(name_or_path), "config.json"))
                weight_file = Path(hf_hub_download(str(name_or_path), "model.safetensors"))
            except Exception as e:  # noqa: BLE001 - offline, unknown repo, no safetensors file, ...
                raise OSError(
                    f"could not fetch {name_or_path!r} from the Hugging Face Hub ({type(e).__name__}: {e}); "
                    "offline, pass a local directory with config.json and model.safetensors"
                ) from e
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_file} is not valid JSON: {e}") from None
        if weight_file.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                state = load_file(str(weight_file), device=str(map_location))
            except SafetensorError as e:
                raise ValueError(f"{weight_file} is not a valid safetensors file: {e}") from None
        else:
            try:
                state = torch.load(weight_file, map_location=map_location, weights_only=True)
            except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt file
                raise ValueError(f"{weight_file} could not be read as a weights-only checkpoint: {e}") from None
        return cls._from_hf_parts(cfg, state, source=str(weight_file)).to(map_location)

    @classmethod
    def _from_hf_parts(cls, cfg: dict, state: dict[str, Tensor], source: str) -> "GPT":
        activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
        act = cfg.get("activation_function", "gelu_new")
        if act not in activation:
            raise ValueError(f"{source}: activation_function {act!r} is not supported")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise ValueError(f"{source}: config option {flag}=True is not supported")
        if cfg.get("scale_attn_weights", True) is False:
            raise ValueError(f"{source}: scale_attn_weights=False is not supported")
        try:
            config = GPTConfig(
                d_vocab=cfg["vocab_size"], n_ctx=cfg["n_positions"], d_model=cfg["n_embd"],
                n_heads=cfg["n_head"], n_layers=cfg["n_layer"], d_mlp=cfg.get("n_inner") or None,
                ln_eps=cfg.get("layer_norm_epsilon", 1e-5), activation=activation[act],
                tie_weights=cfg.get("tie_word_embeddings", True),
            )
        except KeyError as e:
            raise ValueError(f"{source}: config lacks the field {e.args[0]!r}") from None
        # Checkpoints saved from GPT2Model lack the "transformer." prefix; accept both.
        sd = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in state.items()}
        sd = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        d = config.d_model

        def take(key: str) -> Tensor:
            if key not in sd:
                raise ValueError(f"{source} lacks tensor {key!r}")
            return sd.pop(key)

        ours: dict[str, Tensor] = {"embed.W_E": take("wte.weight"), "pos.W_pos": take("wpe.weight")}
        for i in range(config.n_layers):
            h, o = f"h.{i}.", f"blocks.{i}."
            W_qkv, b_qkv = take(h + "attn.c_attn.weight"), take(h + "attn.c_attn.bias")
            if W_qkv.shape != (d, 3 * d):
                raise ValueError(f"{source}: tensor {h}attn.c_attn.weight has shape {tuple(W_qkv.shape)}, expected {(d, 3 * d)}")
            for name, W, b in zip("QKV", W_qkv.split(d, dim=1), b_qkv.split(d)):
                ours[o + f"attn.W_{name}"], ours[o + f"attn.b_{name}"] = W, b
            ours[o + "attn.W_O"], ours[o + "attn.b_O"] = take(h + "attn.c_proj.weight"), take(h + "attn.c_proj.bias")
            ours[o + "mlp.W_in"], ours[o + "mlp.b_in"] = take(h + "mlp.c_fc.weight"), take(h + "mlp.c_fc.bias")
            ours[o + "mlp.W_out"], ours[o + "mlp.b_out"] = take(h + "mlp.c_proj.weight"), take(h + "mlp.c_proj.bias")
            for ln in ("ln_1", "ln_2"):
                ours[o + f"{ln}.w"], ours[o + f"{ln}.b"] = take(h + f"{ln}.weight"), take(h + f"{ln}.bias")
        ours["ln_f.w"], ours["ln_f.b"] = take("ln_f.weight"), take("ln_f.bias")
        lm_head = sd.pop("lm_head.weight", None)
        if not config.tie_weights:
            if lm_head is None:
                raise ValueError(f"{source} lacks tensor 'lm_head.weight' (weights are not tied)")
            ours["unembed.W_U_param"] = lm_head.T
        elif lm_head is not None and not torch.equal(lm_head, ours["embed.W_E"]):
            raise ValueError(f"{source}: lm_head.weight differs from wte.weight although the config ties them")
        if sd:
            raise ValueError(f"{source} has unexpected tensor(s) {sorted(sd)[:5]}")
        model = cls(config)
        load_state_checked(model, {k: v.detach().to(torch.float32).contiguous() for k, v in ours.items()}, source)
        return model

    # --- files ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` and ``config.json`` into ``directory`` (atomically, deterministically)."""
        from safetensors.torch import save

        directory = Path(directory)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        atomic_write(directory / "model.safetensors", save(tensors, metadata={"format": "gptlib"}))
        atomic_write(directory / "config.json", json.dumps(self.config.to_dict(), indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, map_location: str | torch.device = "cpu") -> "GPT":
        """Read a model written by :meth:`save`; a file that does not match its config is an error."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg_path, w_path = directory / "config.json", directory / "model.safetensors"
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise FileNotFoundError(f"{p} does not exist")
        try:
            config = GPTConfig.from_dict(json.loads(cfg_path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None
        try:
            state = load_file(str(w_path), device=str(map_location))
        except SafetensorError as e:
            raise ValueError(f"{w_path} is not a valid safetensors file: {e}") from None
        model = cls(config).to(map_location)
        load_state_checked(model, state, source=str(w_path))
        return model


def load_state_checked(model: nn.Module, state: dict[str, Tensor], source: str = "state dict") -> None:
    """``load_state_dict`` with errors that name the missing, unexpected or mis-shaped tensor."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise ValueError(f"{source} lacks tensor(s) {missing[:5]}{' …' if len(missing) > 5 else ''}")
    if unexpected:
        raise ValueError(f"{source} has unexpected tensor(s) {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise ValueError(f"{source}: tensor {k!r} has shape {tuple(v.shape)}, the model expects {tuple(expected[k].shape)}")
    model.load_state_dict(state)
