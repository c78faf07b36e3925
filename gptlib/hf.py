"""Infrastructure: models to and from Hugging Face's ``transformers``, the book's peers.

* :func:`from_hf` and :func:`from_pretrained` read GPT-2 in Hugging Face's layout (a
  ``GPT2LMHeadModel`` object, a local directory with ``config.json`` and ``model.safetensors`` or
  ``pytorch_model.bin``, or, online only, a Hub name) into a :class:`gptlib.model.GPT`;
* :func:`to_hf_llama` builds Hugging Face's ``LlamaForCausalLM`` with the weights of a
  :class:`gptlib.modern.ModernGPT`, the peer of Chapter 12.

gptlib does not import ``transformers`` itself: the GPT-2 readers use only a model's ``config``
and ``state_dict()``, and :func:`to_hf_llama` imports it when called. This module imports the
models; no model imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from .embedding import skip_init
from .files import read_tensors
from .model import GPT, GPTConfig
from .modern import ModernGPT
from .runtime import check_file, check_float, check_positive_int
from .state import load_state_checked

__all__ = ["from_hf", "from_pretrained", "to_hf_llama", "unpermute_rope", "HF_ACTIVATIONS"]

# Hugging Face's names for GPT-2's activations, mapped to gptlib's (gptlib.mlp.ACTIVATIONS).
HF_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


def _read_json(path: Path) -> dict:
    path = check_file(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return d


# --- GPT-2
# -----------------------------------------------------------------------------------------
def from_hf(hf_model) -> GPT:
    """A gptlib GPT with the weights of a ``transformers`` ``GPT2LMHeadModel``.

    Duck-typed: only ``hf_model.config`` (``to_dict()``) and ``hf_model.state_dict()`` are used,
    so gptlib does not import transformers. HF stores GPT-2's matrices in ``Conv1D`` layers as
    (in, out), the same x @ W layout as gptlib: only the fused ``c_attn`` needs splitting.
    """
    cfg = (
        hf_model.config.to_dict()
        if hasattr(hf_model.config, "to_dict")
        else dict(vars(hf_model.config))
    )
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
        from huggingface_hub import (
            hf_hub_download,  # optional, online only (Colab): imported when used
        )

        try:
            cfg_file = Path(hf_hub_download(str(name_or_path), "config.json"))
            weight_file = Path(hf_hub_download(str(name_or_path), "model.safetensors"))
        except Exception as e:
            raise OSError(
                f"could not fetch {name_or_path!r} from the Hugging Face Hub ({type(e).__name__}: "
                f"{e}); "
                "offline, pass a local directory with config.json and model.safetensors"
            ) from e
    cfg = _read_json(cfg_file)
    if weight_file.suffix == ".safetensors":
        state = read_tensors(weight_file, map_location)
    else:
        try:
            state = torch.load(weight_file, map_location=map_location, weights_only=True)
        except Exception as e:
            raise ValueError(
                f"{weight_file} could not be read as a weights-only checkpoint: {e}"
            ) from None
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
        eps = check_float("layer_norm_epsilon", cfg.get("layer_norm_epsilon", 1e-5), 0.0)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    try:
        return GPTConfig(
            d_vocab=cfg["vocab_size"],
            n_ctx=cfg["n_positions"],
            d_model=cfg["n_embd"],
            n_heads=cfg["n_head"],
            n_layers=cfg["n_layer"],
            d_mlp=cfg.get("n_inner") or None,
            ln_eps=eps,
            activation=HF_ACTIVATIONS[act],
            tie_weights=cfg.get("tie_word_embeddings", True),
        )
    except KeyError as e:
        raise ValueError(f"{source}: config lacks the field {e.args[0]!r}") from None


def _from_hf_parts(cfg: dict, state: dict[str, Tensor], source: str) -> GPT:
    config = _hf_config(cfg, source)
    # Checkpoints saved from GPT2Model lack the "transformer." prefix; accept both.
    sd = {
        (k[len("transformer.") :] if k.startswith("transformer.") else k): v
        for k, v in state.items()
    }
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
            raise ValueError(
                f"{source}: tensor {h}attn.c_attn.weight has shape {tuple(W_qkv.shape)}, expected "
                f"{(d, 3 * d)}"
            )
        for name, W, b in zip("QKV", W_qkv.split(d, dim=1), b_qkv.split(d)):
            ours[o + f"attn.W_{name}"], ours[o + f"attn.b_{name}"] = W, b
        ours[o + "attn.W_O"], ours[o + "attn.b_O"] = (
            take(h + "attn.c_proj.weight"),
            take(h + "attn.c_proj.bias"),
        )
        ours[o + "mlp.W_in"], ours[o + "mlp.b_in"] = (
            take(h + "mlp.c_fc.weight"),
            take(h + "mlp.c_fc.bias"),
        )
        ours[o + "mlp.W_out"], ours[o + "mlp.b_out"] = (
            take(h + "mlp.c_proj.weight"),
            take(h + "mlp.c_proj.bias"),
        )
        for ln in ("ln_1", "ln_2"):
            ours[o + f"{ln}.w"], ours[o + f"{ln}.b"] = (
                take(h + f"{ln}.weight"),
                take(h + f"{ln}.bias"),
            )
    ours["ln_f.w"], ours["ln_f.b"] = take("ln_f.weight"), take("ln_f.bias")
    lm_head = sd.pop("lm_head.weight", None)
    if not config.tie_weights:
        if lm_head is None:
            raise ValueError(f"{source} lacks tensor 'lm_head.weight' (weights are not tied)")
        ours["unembed.W_U"] = lm_head.T
    elif lm_head is not None and not torch.equal(lm_head, ours["embed.W_E"]):
        raise ValueError(
            f"{source}: lm_head.weight differs from wte.weight although the config ties them"
        )
    if sd:
        raise ValueError(f"{source} has unexpected tensor(s) {sorted(sd)[:5]}")
    with skip_init():  # no random initial weights: every one is loaded below
        model = GPT(config)
    load_state_checked(
        model, {k: v.detach() for k, v in ours.items()}, source
    )  # float widths cast, nothing else
    return model


# --- Llama (Chapter 12) ---------------------------------------------------------------------------
def unpermute_rope(W: Tensor, n_heads: int) -> Tensor:
    """ModernGPT, like llama.cpp, rotates the adjacent coordinates (2i, 2i+1) of each head by RoPE;
    Hugging Face's Llama rotates (i, i + d_head/2). This reorders the columns of each head of a
    weight (d_model, n_heads*d_head) from the first convention to the second (an exact permutation).

    >>> unpermute_rope(torch.arange(4.0)[None], 1).tolist()
    [[0.0, 2.0, 1.0, 3.0]]
    """
    check_positive_int("n_heads", n_heads)
    if W.dim() != 2 or W.shape[1] % (2 * n_heads):
        raise ValueError(
            f"W must be (d_model, n_heads*d_head) with d_head even, got {tuple(W.shape)} for "
            f"n_heads={n_heads}"
        )
    d_in, d_out = W.shape
    d_head = d_out // n_heads
    return W.reshape(d_in, n_heads, d_head // 2, 2).transpose(-1, -2).reshape(d_in, d_out)


def to_hf_llama(model: ModernGPT):
    """The peer: Hugging Face's ``LlamaForCausalLM`` with the same weights (float32, eval mode)."""
    if not isinstance(model, ModernGPT):
        raise ValueError(f"model must be a ModernGPT, got {type(model).__name__}")
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.d_vocab,
        hidden_size=c.d_model,
        intermediate_size=c.d_mlp,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.d_head,
        max_position_embeddings=c.n_ctx,
        rms_norm_eps=c.ln_eps,
        rope_theta=c.rope_base,
        tie_word_embeddings=c.tie_weights,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
    )
    hf_config.rope_parameters = {"rope_type": "default", "rope_theta": c.rope_base}
    sd = {
        "model.embed_tokens.weight": model.W_E,
        "model.norm.weight": model.ln_f.w,
        "lm_head.weight": model.W_U.T,
    }
    for l, blk in enumerate(model.blocks):
        p, a, m = f"model.layers.{l}.", blk.attn, blk.mlp
        sd[p + "input_layernorm.weight"] = blk.ln_1.w
        sd[p + "post_attention_layernorm.weight"] = blk.ln_2.w
        sd[p + "self_attn.q_proj.weight"] = unpermute_rope(a.W_Q, c.n_heads).T
        sd[p + "self_attn.k_proj.weight"] = unpermute_rope(a.W_K, c.n_kv_heads).T
        sd[p + "self_attn.v_proj.weight"] = a.W_V.T
        sd[p + "self_attn.o_proj.weight"] = a.W_O.T
        sd[p + "mlp.gate_proj.weight"] = m.W_gate.T
        sd[p + "mlp.up_proj.weight"] = m.W_up.T
        sd[p + "mlp.down_proj.weight"] = m.W_out.T
    try:  # the weights are overwritten below: skip the random initialisation (seconds at 135M)
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        hf = LlamaForCausalLM(hf_config)
    if c.tie_weights:
        del sd["lm_head.weight"]  # Llama's lm_head is its embedding, tied again below
    # One copy of each weight, float32 and contiguous, which the peer then holds (assign: no
    # second copy into the memory its constructor allocated); a copy, so that changing the model's
    # weights later does not change the peer's
    missing, unexpected = hf.load_state_dict(
        {
            k: v.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
            for k, v in sd.items()
        },
        strict=False,
        assign=True,
    )
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ValueError(
            f"Hugging Face's Llama does not match: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}"
        )
    if c.tie_weights:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    return hf.eval()
