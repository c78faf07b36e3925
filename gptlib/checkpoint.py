"""Infrastructure: a GPT's weights in and out of files — gptlib's own format and GPT-2's from Hugging Face.

gptlib's format is a directory with ``config.json`` (the :class:`GPTConfig`) and ``model.safetensors``
(the state dict, tied W_U = W_E^T stored once as ``embed.W_E``). GPT-2 checkpoints in Hugging Face's
layout are read from a local directory, from a ``transformers`` model object, or (online only) from
the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from .model import GPT, GPTConfig
from .runtime import atomic_write

__all__ = ["save", "load", "load_state_checked", "tied_aliases", "from_hf", "from_pretrained"]

# Hugging Face's names for GPT-2's activations, mapped to gptlib's (gptlib.mlp.ACTIVATIONS).
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Second names of shared parameters (a tied ``unembed.W_E``), each mapped to the first name.

    safetensors refuses two names for one tensor, so :func:`save` writes the first name only and
    :func:`load_state_checked` restores the others.
    """
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def load_state_checked(model: nn.Module, state: dict[str, Tensor], source: str = "state dict") -> None:
    """``load_state_dict`` with errors that name the missing, unexpected or mis-shaped tensor.

    A shared parameter may be given under its first name only (:func:`tied_aliases`).
    """
    state = dict(state)
    for alias, name in tied_aliases(model).items():
        if alias not in state and name in state:
            state[alias] = state[name]
        elif alias in state and name in state and not torch.equal(state[alias], state[name]):
            raise ValueError(f"{source}: tensors {alias!r} and {name!r} differ although the model ties them")
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


def _read_safetensors(path: Path, map_location: str | torch.device) -> dict[str, Tensor]:
    try:
        return load_file(str(path), device=str(map_location))
    except SafetensorError as e:
        raise ValueError(f"{path} is not a valid safetensors file: {e}") from None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def save(model: GPT, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (atomically, deterministically).

    ``dtype`` (e.g. ``torch.float16``) stores the floating-point tensors in that type, halving the file;
    it must be a floating type, and a weight it cannot hold (beyond its range) is an error, not an
    infinity. :func:`load` casts back to the model's own type.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point type, got {dtype}")
    directory = Path(directory)
    aliases = tied_aliases(model)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items() if k not in aliases}
    if dtype is not None:
        for k, v in tensors.items():
            if v.is_floating_point():
                cast = v.to(dtype)
                if not torch.isfinite(cast).all() and torch.isfinite(v).all():
                    raise ValueError(f"tensor {k!r} does not fit in dtype {dtype}: values up to {v.abs().max():.3g}")
                tensors[k] = cast
    atomic_write(directory / "model.safetensors", safetensors_bytes(tensors, metadata={"format": "gptlib"}))
    atomic_write(directory / "config.json", json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n")
    return directory


def load(directory: str | Path, map_location: str | torch.device = "cpu") -> GPT:
    """Read a model written by :func:`save`; a file that does not match its config is an error."""
    directory = Path(directory)
    cfg_path, w_path = directory / "config.json", directory / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist")
    config = GPTConfig.from_dict(_read_json(cfg_path))
    state = _read_safetensors(w_path, map_location)
    model = GPT(config).to(map_location)
    load_state_checked(model, state, source=str(w_path))
    return model


def from_hf(hf_model) -> GPT:
    """A gptlib GPT with the weights of a ``transformers`` ``GPT2LMHeadModel``.

    Duck-typed: only ``hf_model.config`` (``to_dict()``) and ``hf_model.state_dict()`` are used,
    so gptlib does not import transformers. HF stores GPT-2's matrices in ``Conv1D`` layers as
    (in, out), the same x @ W layout as gptlib: only the fused ``c_attn`` needs splitting.
    """
    cfg = hf_model.config.to_dict() if hasattr(hf_model.config, "to_dict") else dict(vars(hf_model.config))
    return _from_hf_parts(cfg, hf_model.state_dict(), source=type(hf_model).__name__)


def from_pretrained(name_or_path: str | Path, map_location: str | torch.device = "cpu") -> GPT:
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
        from huggingface_hub import hf_hub_download  # optional, online only (Colab): imported when used

        try:
            cfg_file = Path(hf_hub_download(str(name_or_path), "config.json"))
            weight_file = Path(hf_hub_download(str(name_or_path), "model.safetensors"))
        except Exception as e:  # noqa: BLE001 - offline, unknown repo, no safetensors file, ...
            raise OSError(
                f"could not fetch {name_or_path!r} from the Hugging Face Hub ({type(e).__name__}: {e}); "
                "offline, pass a local directory with config.json and model.safetensors"
            ) from e
    cfg = _read_json(cfg_file)
    if weight_file.suffix == ".safetensors":
        state = _read_safetensors(weight_file, map_location)
    else:
        try:
            state = torch.load(weight_file, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt file
            raise ValueError(f"{weight_file} could not be read as a weights-only checkpoint: {e}") from None
    return _from_hf_parts(cfg, state, source=str(weight_file)).to(map_location)


def _hf_config(cfg: dict, source: str) -> GPTConfig:
    act = cfg.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{source}: activation_function {act!r} is not supported")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if cfg.get(flag):
            raise ValueError(f"{source}: config option {flag}=True is not supported")
    if cfg.get("scale_attn_weights", True) is False:
        raise ValueError(f"{source}: scale_attn_weights=False is not supported")
    try:
        return GPTConfig(
            d_vocab=cfg["vocab_size"], n_ctx=cfg["n_positions"], d_model=cfg["n_embd"],
            n_heads=cfg["n_head"], n_layers=cfg["n_layer"], d_mlp=cfg.get("n_inner") or None,
            ln_eps=cfg.get("layer_norm_epsilon", 1e-5), activation=HF_ACTIVATIONS[act],
            tie_weights=cfg.get("tie_word_embeddings", True),
        )
    except KeyError as e:
        raise ValueError(f"{source}: config lacks the field {e.args[0]!r}") from None


def _from_hf_parts(cfg: dict, state: dict[str, Tensor], source: str) -> GPT:
    config = _hf_config(cfg, source)
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
        ours["unembed.W_U"] = lm_head.T
    elif lm_head is not None and not torch.equal(lm_head, ours["embed.W_E"]):
        raise ValueError(f"{source}: lm_head.weight differs from wte.weight although the config ties them")
    if sd:
        raise ValueError(f"{source} has unexpected tensor(s) {sorted(sd)[:5]}")
    model = GPT(config)
    load_state_checked(model, {k: v.detach().to(torch.float32).contiguous() for k, v in ours.items()}, source)
    return model
