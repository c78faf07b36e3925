"""Infrastructure: gptlib's one file format.

Everything gptlib writes for a model, a training checkpoint or a distributed worker's results is one
safetensors file: the tensors, and one metadata entry ``"gptlib"`` holding a JSON object with
these keys (the typed metadata):

=========== ==================================================================================
``version`` ``1``, this format
``sha256``  the digest of everything else in the file, tensors and fields (:func:`content_sha256`)
``model``   ``"GPT"`` or ``"ModernGPT"``: the class whose state dict the tensors without a ``/``
            in their name are (a shared parameter stored once, under its first name)
``config``  that model's config dataclass, field by field
``trainer`` a :class:`~gptlib.trainer.Trainer`'s state (step, config, history, optimiser
            moments, random states) as a tree (:func:`gptlib.state.pack`), tensors ``trainer/…``
``tree``    any other tree of values (a worker's results), its tensors named ``tree/…``
=========== ==================================================================================

A writer may add keys of its own (the SmolLM2 export records its GGUF file's sha256). The file is
written in one atomic step (:func:`gptlib.runtime.atomic_write`): a crash leaves the old file or
the new one, never a mixture, and weights cannot meet the wrong config because both are in the same
file. Reading checks the format, the digest and every field it uses, and each error names the file
and the field. Random states and optimiser moments are tensors; everything else is JSON.

This module imports no model: the models import it (dependencies run maths -> model -> I/O).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from .runtime import atomic_write, check_file, check_finite_weights
from .state import FLOAT_DTYPES, pack, tied_aliases, unpack

__all__ = [
    "VERSION",
    "content_sha256",
    "write_file",
    "read_file",
    "read_fields",
    "read_tensors",
    "model_file",
    "model_tensors",
    "model_fields",
    "check_savable",
    "save_model",
    "read_model",
    "config_from_dict",
    "save_tree",
    "load_tree",
]

VERSION = 1
KEY = "gptlib"  # the one metadata entry


# --- the file -----------------------------------------------------------------------------------
def _canonical(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def content_sha256(fields: dict, tensors: dict[str, Tensor]) -> str:
    """sha256 of the fields (canonical JSON, without ``sha256``) and then, by name, each tensor's
    name, dtype, shape and bytes. Independent of how safetensors lays the file out.

    >>> expected = hashlib.sha256(b'{"version":1}').hexdigest()
    >>> content_sha256({"version": 1, "sha256": "…"}, {}) == expected
    True
    """
    h = hashlib.sha256(_canonical({k: v for k, v in fields.items() if k != "sha256"}))
    for name in sorted(tensors):
        t = tensors[name]
        h.update(_canonical([name, str(t.dtype).removeprefix("torch."), list(t.shape)]))
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def write_file(path: str | Path, tensors: dict[str, Tensor], fields: dict) -> Path:
    """Write ``tensors`` and the JSON ``fields`` (plus ``version`` and ``sha256``) as one
    safetensors file, in one atomic step. The same content, dicts in the same order, always gives
    the same bytes; reading gives the dicts back in that order."""
    fields = {**fields, "version": VERSION}
    try:
        fields["sha256"] = content_sha256(fields, tensors)
        meta = json.dumps(fields, ensure_ascii=False, allow_nan=False)  # dicts keep their order
    except (TypeError, ValueError) as e:
        raise ValueError(f"fields must be JSON values with finite numbers: {e}") from None
    data = safetensors_bytes(
        {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, metadata={KEY: meta}
    )
    return atomic_write(path, data)


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _open_header(path: Path) -> dict[str, str]:
    """The safetensors metadata of ``path``, a file already checked by :func:`check_file`."""
    try:
        with safe_open(str(path), "pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is not a valid safetensors file: {e}") from None


def read_fields(path: str | Path) -> dict:
    """The JSON fields of a gptlib file, from its header only (the digest is not checked here)."""
    return _fields(check_file(path))


def _fields(path: Path) -> dict:
    """:func:`read_fields` of a file already checked by :func:`check_file`."""
    meta = _open_header(path)
    if KEY not in meta:
        raise ValueError(
            f"{path} is not a gptlib file (no {KEY!r} entry in its safetensors metadata)"
        )
    try:
        fields = json.loads(meta[KEY], parse_constant=_no_constants)
    except ValueError as e:
        raise ValueError(f"{path}: its {KEY!r} metadata is not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: its {KEY!r} metadata must be a JSON object")
    if fields.get("version") != VERSION:
        raise ValueError(
            f"{path}: field 'version' is {fields.get('version')!r}; this gptlib reads version "
            f"{VERSION}"
        )
    return fields


def read_tensors(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Every tensor of a safetensors file (any writer's), or ``ValueError`` naming the file."""
    return _tensors(check_file(path), map_location)


def _tensors(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """:func:`read_tensors` of a file already checked by :func:`check_file`."""
    try:
        return load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is not a valid safetensors file: {e}") from None


def read_file(path: str | Path, verify: bool = True) -> tuple[dict[str, Tensor], dict]:
    """The tensors (on the CPU) and fields of a gptlib file, after checking its format and, with
    ``verify``, its digest: a file changed since it was written raises ``ValueError`` naming it."""
    path = check_file(path)  # once, for the header and the tensors
    fields, tensors = _fields(path), _tensors(path)
    if verify and content_sha256(fields, tensors) != fields.get("sha256"):
        raise ValueError(
            f"{path}: field 'sha256' does not match the file's contents (changed or damaged "
            "since it was written)"
        )
    return tensors, fields


def model_file(path: str | Path) -> Path:
    """The file a model is saved in: ``path`` itself if it ends in ``.safetensors``, else
    ``path/model.safetensors`` (a directory, created on saving).

    >>> str(model_file("models/english")), str(model_file("m.safetensors"))
    ('models/english/model.safetensors', 'm.safetensors')
    """
    path = Path(path)
    if path.suffix == ".safetensors" and not path.is_dir():
        return path
    if path.suffix and not path.is_dir():
        raise ValueError(f"path must be a .safetensors file or a directory, got {str(path)!r}")
    return path / "model.safetensors"


def model_tensors(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The tensors a model file holds: the state dict on the CPU without tied second names,
    floating-point tensors cast to ``dtype`` (checked to fit) if given."""
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"dtype must be one of {[str(d) for d in FLOAT_DTYPES]} or None, got {dtype}"
        )
    aliases = tied_aliases(model)
    tensors = {
        k: v.detach().to("cpu").contiguous()
        for k, v in model.state_dict().items()
        if k not in aliases
    }
    if dtype is not None:
        for k, v in tensors.items():
            if v.is_floating_point():
                cast = v.to(dtype)
                if not torch.isfinite(cast).all() and torch.isfinite(v).all():
                    raise ValueError(
                        f"tensor {k!r} does not fit in dtype {dtype}: values up to "
                        f"{v.abs().max():.3g}"
                    )
                tensors[k] = cast
    return tensors


def model_fields(model: nn.Module) -> dict:
    """The fields a model file holds: ``model`` (the class name) and ``config`` (if a dataclass)."""
    fields: dict[str, Any] = {"model": type(model).__name__}
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        fields["config"] = json.loads(_canonical(dataclasses.asdict(config)))
    return fields


def check_savable(model: object) -> None:
    """Raise ``ValueError`` unless a file of ``model`` could be read back: a module whose class is
    built from its config alone, ``type(model)(model.config)``, with the tensors that builds (the
    names and shapes), every one of them finite and none on the meta device. Nothing is written
    before this holds, so a refused model never replaces a good file.

    >>> from gptlib.lora import LoRA
    >>> from gptlib.model import GPT, GPTConfig
    >>> check_savable(GPT(GPTConfig.preset("tiny")))
    >>> lora = LoRA(GPT(GPTConfig.preset("tiny")), ["blocks.0.attn.W_Q"], 2, 2.0)
    >>> check_savable(lora)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: a LoRA cannot be saved: it is not built from its config alone, ... lora.merged()...
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    kind = type(model).__name__
    config = getattr(model, "config", None)
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise ValueError(f"a {kind} cannot be saved: it has no config, so no loader could build it")
    try:
        with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
            fresh = type(model)(config)
    except Exception:
        hint = (
            "; save lora.merged(), the plain model with the update merged"
            if hasattr(model, "merged")
            else ""
        )
        raise ValueError(
            f"a {kind} cannot be saved: it is not built from its config alone, so no loader could "
            f"read the file back{hint}"
        ) from None
    want = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if want != got:
        differ = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
        raise ValueError(
            f"a {kind} whose tensors are not those of {kind}(config) cannot be saved (it differs "
            f"in {', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''}): no loader could "
            "read the file back"
        )
    check_finite_weights(model)


def save_model(
    model: nn.Module, path: str | Path, dtype: torch.dtype | None = None, **fields
) -> Path:
    """Write ``model`` (its state dict and config) to :func:`model_file` of ``path`` in one atomic
    step.

    ``dtype`` stores the floating-point tensors in that width (:data:`FLOAT_DTYPES`); a weight it
    cannot hold (beyond its range) is an error, not an infinity. ``fields`` are added to the
    metadata. A model no loader could read back (:func:`check_savable`: its class not built from
    its config, a non-finite weight) is refused before anything is written.
    Returns the file written.
    """
    check_savable(model)
    return write_file(
        model_file(path), model_tensors(model, dtype), {**fields, **model_fields(model)}
    )


def read_model(path: str | Path, kind: str) -> tuple[dict, dict[str, Tensor], dict, str]:
    """``(config, tensors, fields, source)`` of the model of class ``kind`` stored at ``path`` (a
    file, a directory holding ``model.safetensors``, or a training checkpoint); tensors on the
    CPU."""
    file = model_file(path)
    tensors, fields = read_file(file)
    source = str(file)
    if fields.get("model") != kind:
        raise ValueError(f"{source}: field 'model' is {fields.get('model')!r}, not {kind!r}")
    if not isinstance(fields.get("config"), dict):
        raise ValueError(f"{source}: field 'config' is missing or not a JSON object")
    return fields["config"], {k: v for k, v in tensors.items() if "/" not in k}, fields, source


def config_from_dict(cls: type, d: dict, source: str = "config"):
    """``cls(**d)`` for a config dataclass (:class:`~gptlib.config.GPTConfig`,
    :class:`~gptlib.modern.ModernConfig`), with an unknown field or an invalid value reported as
    ``ValueError`` naming ``source`` and the field ``config``. JSON lists become tuples where the
    dataclass's default is a tuple. The inverse of ``dataclasses.asdict``.

    >>> from gptlib.config import GPTConfig
    >>> c = GPTConfig.preset("tiny")
    >>> config_from_dict(GPTConfig, c.to_dict()) == c
    True
    >>> config_from_dict(GPTConfig, {"d_vocab": 10, "colour": "red"})
    Traceback (most recent call last):
    ...
    ValueError: config: field 'config' has unknown entries ['colour']
    """
    if not isinstance(d, dict):
        raise ValueError(f"{source}: field 'config' must be a dict, got {type(d).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"{source}: field 'config' has unknown entries {unknown}")
    d = {
        k: tuple(v) if isinstance(v, list) and isinstance(names[k].default, tuple) else v
        for k, v in d.items()
    }
    try:
        return cls(**d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: field 'config': {e}") from None


def save_tree(path: str | Path, tree: Any, **fields) -> Path:
    """Write a tree of values (:func:`pack`) as one gptlib file, in one atomic step."""
    structure, tensors = pack(tree, "tree")
    return write_file(path, tensors, {**fields, "tree": structure})


def load_tree(path: str | Path) -> Any:
    """The tree written by :func:`save_tree` (tensors on the CPU)."""
    tensors, fields = read_file(path)
    if "tree" not in fields:
        raise ValueError(f"{path}: field 'tree' is missing")
    return unpack(fields["tree"], tensors, f"{path}: field 'tree'", "tree")
