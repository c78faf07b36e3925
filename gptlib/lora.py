"""Chapter 14: LoRA, a frozen weight plus a trained update of rank at most r.

In the book's row convention a linear map is ``x W`` with W (d_in, d_out). LoRA (Hu et al. 2021)
freezes W and trains two factors,

    W + s A B,    A (d_in, r),  B (r, d_out),  s = alpha / r,    B = 0 at the start,

so the adapted map starts as the original one, trains (d_in + d_out) r numbers instead of
d_in d_out, and merges into one matrix W' = W + s A B that costs nothing at inference. (Hu et al.
write columns, h = W_0 x + B A x; transposed, that is x (W_0^T + A^T B^T): their A^T is the A here,
their B^T the B here, and in both the zero factor is the one next to the output.)

:class:`LoRA` adapts any set of 2-D parameters of a model by name, without touching the model's
code: its forward pass evaluates the model with each named W replaced by W + s A B
(``torch.func.functional_call``), and :meth:`LoRA.merged` writes the merged weights into a copy.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .runtime import check_float, check_int, check_positive_int

__all__ = ["lora_forward", "lora_parameters", "LoRA", "attention_mlp_targets"]


def lora_forward(x: Tensor, W: Tensor, A: Tensor, B: Tensor, scale: float) -> Tensor:
    """x W + scale (x A) B for rows x (..., d_in): the adapted map, with the update applied through
    the two thin products (d_in r + r d_out multiplications per row) instead of a d_in x d_out
    matrix.

    >>> W, A, B = torch.eye(2), torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0, 3.0]])
    >>> lora_forward(torch.tensor([[1.0, 2.0]]), W, A, B, scale=0.5)  # [1, 2] + 0.5 * 1 * [0, 3]
    tensor([[1.0000, 3.5000]])
    """
    for name, t in (("x", x), ("W", W), ("A", A), ("B", B)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if (
        W.dim() != 2
        or A.dim() != 2
        or B.dim() != 2
        or A.shape != (W.shape[0], A.shape[1])
        or B.shape != (A.shape[1], W.shape[1])
    ):
        raise ValueError(
            f"need W (d_in, d_out), A (d_in, r), B (r, d_out), got {tuple(W.shape)}, "
            f"{tuple(A.shape)}, {tuple(B.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != W.shape[0]:
        raise ValueError(f"x must be rows (..., d_in={W.shape[0]}), got {tuple(x.shape)}")
    scale = check_float("scale", scale)
    return x @ W + scale * ((x @ A) @ B)


def lora_parameters(d_in: int, d_out: int, r: int) -> int:
    """The numbers LoRA trains for one (d_in, d_out) matrix: (d_in + d_out) r.

    >>> lora_parameters(256, 1024, 4), 256 * 1024  # against full fine-tuning of the matrix
    (5120, 262144)
    """
    for name, v in (("d_in", d_in), ("d_out", d_out), ("r", r)):
        check_positive_int(name, v)
    return (d_in + d_out) * r


def attention_mlp_targets(model: nn.Module) -> list[str]:
    """The names of every matrix (2-D parameter) of every block's attention and MLP, block by
    block, in the model's order: W_Q, W_K, W_V, W_O, W_in, W_out in a :class:`gptlib.model.GPT`;
    W_gate, W_up, W_out for a :class:`gptlib.modern.ModernGPT`'s SwiGLU.

    >>> from gptlib.model import GPT, GPTConfig
    >>> attention_mlp_targets(GPT(GPTConfig.preset("tiny")))[:3]
    ['blocks.0.attn.W_Q', 'blocks.0.attn.W_K', 'blocks.0.attn.W_V']
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(model, nn.Module) or not isinstance(blocks, nn.ModuleList) or not blocks:
        raise ValueError(
            f"model must be a gptlib model with blocks (GPT, ModernGPT), got {type(model).__name__}"
        )
    names = []
    for layer, blk in enumerate(blocks):
        for part in ("attn", "mlp"):
            module = getattr(blk, part, None)
            if not isinstance(module, nn.Module):
                raise ValueError(f"model's block {layer} has no {part} module")
            names += [
                f"blocks.{layer}.{part}.{n}" for n, p in module.named_parameters() if p.dim() == 2
            ]
    return names


class LoRA(nn.Module):
    """A frozen ``model`` with a rank-``r`` update s A B on each parameter named in ``targets``.

    A is drawn N(0, 1/d_in) from ``generator``, B is zero, s = ``alpha`` / r. The model's own
    weights are frozen here by reading them detached: no gradient reaches them, while the caller's
    model keeps its ``requires_grad`` flags (it is not changed). The factors ``A[i]``, ``B[i]`` for
    ``targets[i]`` are the only parameters trained (:meth:`trained_parameters`, which an
    optimiser is given; the Trainer skips parameters that get no gradient). ``forward`` takes what
    the model takes.

    >>> from gptlib.model import GPT, GPTConfig
    >>> base = GPT(GPTConfig.preset("tiny")).eval()
    >>> g = torch.Generator().manual_seed(0)
    >>> lora = LoRA(base, ["blocks.0.attn.W_Q"], r=2, alpha=4.0, generator=g)
    >>> ids = torch.tensor([[1, 2, 3]])
    >>> torch.equal(lora(ids), base(ids))  # B = 0: the adapted model starts as the original
    True
    >>> lora.num_parameters(), (64 + 64) * 2
    (256, 256)
    """

    def __init__(
        self,
        model: nn.Module,
        targets: list[str],
        r: int,
        alpha: float,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}"
            )
        r = check_int("r", r, lo=1)
        self.r, self.alpha = r, check_float("alpha", alpha, 0.0, lo_open=True)
        self.scale = self.alpha / r
        if (
            not isinstance(targets, (list, tuple))
            or not targets
            or len(set(targets)) != len(targets)
        ):
            raise ValueError(
                f"targets must be a non-empty list of distinct parameter names, got {targets!r}"
            )
        params = dict(model.named_parameters())
        for name in targets:
            if not isinstance(name, str) or name not in params or params[name].dim() != 2:
                raise ValueError(f"targets: {name!r} is not a 2-D parameter of the model")
            W = params[name]
            if not W.is_floating_point() or W.device.type == "meta":
                raise ValueError(f"targets: {name!r} is {W.dtype} on {W.device}, no float weights")
        self.model, self.targets = model, list(targets)
        self.config = getattr(model, "config", None)
        self.A, self.B = nn.ParameterList(), nn.ParameterList()
        for name in self.targets:
            W = params[name]
            d_in, d_out = W.shape
            A = torch.randn(d_in, r, generator=generator, dtype=W.dtype) / d_in**0.5  # (d_in, r)
            self.A.append(nn.Parameter(A.to(W.device)))
            self.B.append(nn.Parameter(W.new_zeros(r, d_out)))  # (r, d_out)

    def delta(self, i: int) -> Tensor:
        """The update s A_i B_i of ``targets[i]``, (d_in, d_out), of rank at most r."""
        return self.scale * (self.A[i] @ self.B[i])

    def adapted_weights(self) -> dict[str, Tensor]:
        """{name: W + s A B} for every target (differentiable in A and B only)."""
        params = dict(self.model.named_parameters())
        return {name: params[name].detach() + self.delta(i) for i, name in enumerate(self.targets)}

    def forward(self, *args, **kwargs):
        frozen = {name: p.detach() for name, p in self.model.named_parameters()}
        return functional_call(self.model, {**frozen, **self.adapted_weights()}, args, kwargs)

    def trained_parameters(self) -> list[nn.Parameter]:
        """The factors A_0, B_0, A_1, B_1, ...: what an optimiser of this module is given."""
        return [p for pair in zip(self.A, self.B) for p in pair]

    def num_parameters(self) -> int:
        """The trained numbers: sum over the targets of (d_in + d_out) r."""
        return sum(p.numel() for p in self.trained_parameters())

    @torch.no_grad()
    def merged(self) -> nn.Module:
        """A copy of the model with W' = W + s A B written into each target: one matrix per map,
        the same function as this module up to rounding, no extra cost at inference. Its
        parameters' ``requires_grad`` are the model's (it trains like the model it came from)."""
        out = copy.deepcopy(self.model)
        new = self.adapted_weights()
        for name, p in out.named_parameters():
            if name in new:
                p.copy_(new[name])
        return out
