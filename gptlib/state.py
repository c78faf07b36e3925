"""Infrastructure: what a model or a training run consists of, checked before anything is loaded.

* :func:`check_state` and :func:`load_state_checked`: a state dict against a model (names,
  shapes, dtypes, finite values; a tied parameter stored once, :func:`tied_aliases`);
* :func:`check_optimizer_state` and :func:`check_random_states`: an optimiser's moments and the
  random generators' states, the rest of a training run;
* :func:`pack` and :func:`unpack`: a tree of values (dicts, lists, numbers, tensors) as a JSON
  structure plus named tensors, the form in which :mod:`gptlib.files` stores it.

Each check raises ``ValueError`` naming its source and changes nothing. This module imports no
model: the models import it (dependencies run maths -> model -> I/O).
"""

from __future__ import annotations

import json
import math
import numbers
import random
from typing import Any

import torch
from torch import Tensor, nn

from .runtime import all_finite

__all__ = [
    "FLOAT_DTYPES",
    "tied_aliases",
    "check_state",
    "load_state_checked",
    "check_optimizer_state",
    "check_random_states",
    "pack",
    "unpack",
]

# The widths a floating-point tensor may be stored in; loading casts to the model's own type.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --- state dicts --------------------------------------------------------------------------------
def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Second names of shared parameters (a tied ``unembed.W_E``), each mapped to the first name.

    safetensors refuses two names for one tensor, so :func:`gptlib.files.save_model` writes the
    first name only
    and :func:`load_state_checked` restores the others.
    """
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _few(names: list[str]) -> str:
    return f"{names[:5]}{' …' if len(names) > 5 else ''}"


def check_state(
    model: nn.Module, state: dict[str, Tensor], source: str = "state dict"
) -> dict[str, Tensor]:
    """The full state dict for ``model`` (tied names filled in), or ``ValueError`` naming ``source``
    and the missing, unexpected, mis-shaped, mistyped or non-finite tensor. Changes nothing.

    A floating-point tensor may come in any width of :data:`FLOAT_DTYPES` (it is cast on loading);
    any other tensor must have the model's dtype: an int32 tensor is never read into a float weight.
    """
    state = dict(state)
    for alias, name in tied_aliases(model).items():
        if alias not in state and name in state:
            state[alias] = state[name]
        elif alias in state and name in state and not torch.equal(state[alias], state[name]):
            raise ValueError(
                f"{source}: tensors {alias!r} and {name!r} differ although the model ties them"
            )
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise ValueError(f"{source} lacks tensor(s) {_few(missing)}")
    if unexpected:
        raise ValueError(f"{source} has unexpected tensor(s) {_few(unexpected)}")
    for k, v in state.items():
        if not isinstance(v, Tensor):
            raise ValueError(f"{source}: {k!r} is a {type(v).__name__}, not a tensor")
        want = expected[k]
        if tuple(v.shape) != tuple(want.shape):
            raise ValueError(
                f"{source}: tensor {k!r} has shape {tuple(v.shape)}, the model expects "
                f"{tuple(want.shape)}"
            )
        ok = v.dtype in FLOAT_DTYPES if want.is_floating_point() else v.dtype == want.dtype
        if not ok:
            allowed = (
                "one of float16, bfloat16, float32, float64"
                if want.is_floating_point()
                else str(want.dtype)
            )
            raise ValueError(
                f"{source}: tensor {k!r} has dtype {v.dtype}, the model expects {allowed}"
            )
    floats = [
        (k, v)
        for k, v in state.items()
        if v.is_floating_point() and v.numel() and v.device.type != "meta"
    ]
    if not all_finite([v for _, v in floats]):  # one sync while every tensor is finite
        k = next(k for k, v in floats if not bool(v.isfinite().all()))
        raise ValueError(f"{source}: tensor {k!r} holds NaN or infinite values")
    return state


def load_state_checked(
    model: nn.Module, state: dict[str, Tensor], source: str = "state dict"
) -> None:
    """``load_state_dict`` after :func:`check_state`: every error names the tensor, and nothing
    is loaded unless every tensor fits. A shared parameter may be given under its first name
    only."""
    model.load_state_dict(check_state(model, state, source))


# --- the rest of a training run --------------------------------------------------------------
# Settings that say how an optimiser computes, not what: a run on a GPU uses the fused kernel, the
# same run resumed on a CPU cannot, and both compute the same update.
_IMPLEMENTATION_SETTINGS = {"fused"}


def _adam_moments(optimizer: torch.optim.Optimizer, group: dict) -> set[str] | None:
    """The per-parameter state an Adam or AdamW step leaves, or None for another optimiser."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    return {"step", "exp_avg", "exp_avg_sq"} | (
        {"max_exp_avg_sq"} if group.get("amsgrad") else set()
    )


def check_optimizer_state(
    optimizer: torch.optim.Optimizer,
    sd: Any,
    source: str,
    step: int | None = None,
    lr: float | None = None,
) -> dict:
    """``sd`` if ``optimizer.load_state_dict(sd)`` would restore a state this optimiser can reach,
    else ``ValueError`` naming ``source`` and the setting or tensor. Changes nothing.

    * The same groups and parameters, and every setting of each group (betas, eps, weight decay,
      amsgrad, maximize, foreach, ...) equal to the optimiser's own, except ``lr``, which must be a
      finite number >= 0 and, if ``lr`` is given, equal it; ``fused`` (an implementation) may
      differ.
    * Each per-parameter tensor finite, of its parameter's shape (a scalar ``step``); a ``step`` an
      integer >= 0, equal to ``step`` if given; second moments (``exp_avg_sq``) >= 0.
    * For Adam and AdamW, with ``step`` given: no state at step 0, and after it the state of every
      parameter, with exactly the moments a step leaves.
    """
    ours = optimizer.state_dict()
    if (
        not isinstance(sd, dict)
        or set(sd) != {"state", "param_groups"}
        or not isinstance(sd["param_groups"], list)
    ):
        raise ValueError(f"{source} is not an optimiser state (state, param_groups)")
    if len(sd["param_groups"]) != len(ours["param_groups"]):
        raise ValueError(
            f"{source} has {len(sd['param_groups'])} parameter groups, the optimiser "
            f"{len(ours['param_groups'])}"
        )
    for i, (g, o) in enumerate(zip(sd["param_groups"], ours["param_groups"])):
        if not isinstance(g, dict) or set(g) != set(o) or g["params"] != o["params"]:
            raise ValueError(
                f"{source}: param_groups[{i}] does not match the optimiser's parameters and "
                "settings"
            )
        for key in sorted(set(o) - {"params", "lr"} - _IMPLEMENTATION_SETTINGS):
            if type(g[key]) is not type(o[key]) or g[key] != o[key]:
                raise ValueError(
                    f"{source}: param_groups[{i}][{key!r}] is {g[key]!r}, this run's is {o[key]!r}"
                )
        g_lr = g.get("lr")
        if (
            isinstance(g_lr, bool)
            or not isinstance(g_lr, (int, float))
            or not math.isfinite(g_lr)
            or g_lr < 0
            or (lr is not None and g_lr != lr)
        ):
            want = "a finite number >= 0" if lr is None else repr(lr)
            raise ValueError(f"{source}: param_groups[{i}]['lr'] is {g_lr!r}, this run's is {want}")
    groups = [g for g in optimizer.param_groups for _ in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not isinstance(sd["state"], dict) or not set(sd["state"]) <= set(range(len(params))):
        raise ValueError(f"{source}: state names parameters the optimiser does not have")
    if step is not None and _adam_moments(optimizer, optimizer.param_groups[0]) is not None:
        if step == 0 and sd["state"]:
            raise ValueError(
                f"{source}: state holds moments of {len(sd['state'])} parameters at step 0, before "
                "any update"
            )
        missing = sorted(set(range(len(params))) - set(sd["state"]))
        if step > 0 and missing:
            raise ValueError(
                f"{source}: state lacks the moments of parameter(s) {missing[:5]} at step {step}"
            )
    for i, st in sd["state"].items():
        if not isinstance(st, dict):
            raise ValueError(f"{source}: state[{i}] is not a mapping")
        keys = _adam_moments(optimizer, groups[i])
        if keys is not None and set(st) != keys:
            raise ValueError(
                f"{source}: state[{i}] holds {sorted(st)}, an Adam step of this run leaves "
                f"{sorted(keys)}"
            )
        for k, t in st.items():
            want = () if k == "step" else tuple(params[i].shape)
            if not isinstance(t, Tensor) or tuple(t.shape) != want or not t.is_floating_point():
                raise ValueError(
                    f"{source}: state[{i}][{k!r}] must be a float tensor of shape {want}"
                )
            if not bool(t.isfinite().all()):
                raise ValueError(f"{source}: state[{i}][{k!r}] holds NaN or infinite values")
            if k in ("exp_avg_sq", "max_exp_avg_sq") and bool((t < 0).any()):
                raise ValueError(
                    f"{source}: state[{i}][{k!r}] holds negative values; a mean of squares cannot"
                )
            if k == "step":
                n = float(t)
                if n < 0 or n != int(n) or (step is not None and n != step):
                    want = "an integer >= 0" if step is None else f"this run's step {step}"
                    raise ValueError(f"{source}: state[{i}]['step'] is {n!r}, it must be {want}")
    return sd


def check_random_states(rng: Any, source: str) -> dict:
    """``rng`` (name -> state) with each state checked: ``"python"`` a state of :mod:`random`,
    ``"cuda"`` a list of CUDA generator states, every other entry a torch generator's state
    (a uint8 tensor). Returns it with the Python state as :func:`random.setstate` takes it."""
    if not isinstance(rng, dict):
        raise ValueError(f"{source} is not a mapping of random states")
    out = dict(rng)
    for name, state in rng.items():
        try:
            if name == "python":
                out[name] = (state[0], tuple(state[1]), state[2])
                random.Random().setstate(out[name])
            elif name == "cuda":
                if not (
                    isinstance(state, list)
                    and all(isinstance(t, Tensor) and t.dtype == torch.uint8 for t in state)
                ):
                    raise TypeError("not a list of uint8 tensors")
            else:
                torch.Generator().set_state(state)
        except (TypeError, ValueError, IndexError, OverflowError, RuntimeError) as e:
            raise ValueError(f"{source}: {name!r} is not a valid random state: {e}") from None
    return out


# --- trees of values: JSON structure + tensors --------------------------------------------------
def pack(tree: Any, prefix: str = "tree") -> tuple[Any, dict[str, Tensor]]:
    """Split ``tree`` into a JSON structure and the tensors it refers to by name.

    A tree is None, a bool, int, float, str, tensor, or a list, tuple or dict of trees. In the
    structure a tensor becomes ``{"$tensor": name}`` (named by its path under ``prefix``), a tuple
    ``{"$tuple": [...]}``, a non-finite float ``{"$float": "nan"}``, and a dict whose keys are not
    all strings (or start with ``$``) ``{"$dict": [[key, value], ...]}``; :func:`unpack` inverts it.
    Tensors are copied to the CPU. Anything else raises ``ValueError`` naming its path.

    >>> structure, tensors = pack({"step": 3, "betas": (0.9, 0.95), "m": torch.zeros(2)})
    >>> structure
    {'step': 3, 'betas': {'$tuple': [0.9, 0.95]}, 'm': {'$tensor': 'tree/m'}}
    >>> unpack(structure, tensors)["betas"]
    (0.9, 0.95)
    """
    tensors: dict[str, Tensor] = {}

    def enc(x: Any, path: str) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, numbers.Integral):
            return int(x)
        if isinstance(x, numbers.Real):
            x = float(x)
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, Tensor):
            name = path
            while name in tensors:
                name += "#"
            tensors[name] = x.detach().to("cpu").clone(memory_format=torch.contiguous_format)
            return {"$tensor": name}
        if isinstance(x, list):
            return [enc(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"$tuple": [enc(v, f"{path}/{i}") for i, v in enumerate(x)]}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v, f"{path}/{k}") for k, v in x.items()}
            for k in x:
                if isinstance(k, Tensor) or not (
                    k is None or isinstance(k, (bool, str, numbers.Real, tuple))
                ):
                    raise ValueError(
                        f"{path}: a dict key of type {type(k).__name__} cannot be stored"
                    )
            return {"$dict": [[enc(k, f"{path}/key"), enc(v, f"{path}/{k}")] for k, v in x.items()]}
        raise ValueError(
            f"{path}: a {type(x).__name__} cannot be stored (tensors, numbers, strings, None, "
            "lists, tuples and dicts can)"
        )

    return enc(tree, prefix), tensors


def unpack(
    structure: Any, tensors: dict[str, Tensor], source: str = "tree", prefix: str = "tree"
) -> Any:
    """The tree that :func:`pack` split into ``structure`` and ``tensors``; a malformed structure,
    a missing tensor, or a tensor under ``prefix/`` that the structure does not use raises
    ``ValueError`` naming ``source``."""
    used: set[str] = set()

    def dec(s: Any) -> Any:
        if s is None or isinstance(s, (bool, int, float, str)):
            return s
        if isinstance(s, list):
            return [dec(v) for v in s]
        if isinstance(s, dict) and len(s) == 1 and next(iter(s)).startswith("$"):
            tag, v = next(iter(s.items()))
            if tag == "$tensor" and isinstance(v, str) and v in tensors and v not in used:
                used.add(v)
                return tensors[v]
            if tag == "$tuple" and isinstance(v, list):
                return tuple(dec(x) for x in v)
            if tag == "$float" and v in ("nan", "inf", "-inf"):
                return float(v)
            if (
                tag == "$dict"
                and isinstance(v, list)
                and all(isinstance(p, list) and len(p) == 2 for p in v)
            ):
                return {dec(k): dec(x) for k, x in v}
            raise ValueError(f"{source}: malformed entry {json.dumps(s)[:80]}")
        if isinstance(s, dict) and not any(k.startswith("$") for k in s):
            return {k: dec(v) for k, v in s.items()}
        raise ValueError(f"{source}: malformed entry {json.dumps(s)[:80]}")

    tree = dec(structure)
    unused = sorted(k for k in tensors if k.startswith(prefix + "/") and k not in used)
    if unused:
        raise ValueError(f"{source}: tensor(s) {_few(unused)} are not part of the stored tree")
    return tree
