"""The arithmetic of training: FLOPs per token, model FLOPs utilisation, a measured matmul rate.

One convention, used by Chapter 10, every benchmark and the tests:

* a matrix product of (n, k) by (k, m) costs 2 n k m FLOPs (one multiply and one add per
  multiply-add), and every matrix product of the forward pass is counted;
* attention's two products, the scores Q K^T and the weighted sum A V, are counted over all
  n_ctx keys of every query, as a dense kernel computes them, the causal mask notwithstanding;
* the embedding lookup, biases, LayerNorms, softmax and the loss are O(d_model) per token and
  left out;
* the backward pass costs twice the forward (dL/dX = dL/dY W^T and dL/dW = X^T dL/dY, each a
  product of the forward's size), so training costs three forward passes.

Derivation. With d_attn = n_heads d_head, a block's products are X [W_Q | W_K | W_V]
(2 · 3 d_model d_attn per token), z W_O (2 d_attn d_model), X W_in and H W_out
(2 · 2 d_model d_mlp), the scores q_i K^T and the sum a_i V (2 · n_ctx d_attn each); after
the blocks comes the unembedding (2 d_model d_vocab). With the weights of matrix products

    N_mm = n_layers (4 d_model d_attn + 2 d_model d_mlp) + d_model d_vocab,

    forward FLOPs per token   C_fwd   = 2 N_mm + 4 n_layers n_ctx d_attn,
    training FLOPs per token  C_train = 3 C_fwd = 6 N_mm + 12 n_layers n_ctx d_attn.

This is the count PaLM (Chowdhery et al. 2022, appendix B) defines model FLOPs utilisation by,
and that nanoGPT and Megatron-LM report: MFU figures computed with it compare with theirs. It
is also exactly what ``torch.utils.flop_counter.FlopCounterMode`` counts on the readable
attention path (the tests check it to the FLOP). A causal kernel that skips the masked half of
the scores does about half of the attention term; the convention counts it all anyway. Kaplan
et al. (2020) write 6 N + 6 n_layers n_ctx d_attn, half this attention term (and N with biases):
a few per cent of the total at GPT-2's sizes.
"""

from __future__ import annotations

import time

import torch

from .config import GPTConfig
from .runtime import check_float, check_int, check_positive_int

__all__ = [
    "matmul_weights",
    "forward_flops_per_token",
    "training_flops",
    "moe_flops_per_token",
    "model_flops_utilization",
    "matmul_flops_per_s",
]


def _check_config(config: object) -> None:
    """The count is that of GPT-2's blocks: full-width K and V, a two-matrix MLP. A Llama-style
    config (grouped K and V, SwiGLU's three matrices) has other products and is refused."""
    if not isinstance(config, GPTConfig):
        raise ValueError(
            "config must be a GPTConfig (the count is that of GPT-2's blocks), got "
            f"{type(config).__name__}"
        )


def matmul_weights(config) -> int:
    """N_mm: the weights that enter matrix products, once per token (biases, LayerNorms and the
    positional table left out; a tied W_U counted, since the unembedding is a product).

    >>> from gptlib.model import GPTConfig
    >>> matmul_weights(GPTConfig.preset("tiny"))  # 2 (4 * 64 * 64 + 2 * 64 * 256) + 64 * 512
    131072
    """
    _check_config(config)
    d, d_attn = config.d_model, config.n_heads * config.d_head
    return config.n_layers * (4 * d * d_attn + 2 * d * config.d_mlp) + d * config.d_vocab


def forward_flops_per_token(config, n_ctx: int | None = None) -> int:
    """C_fwd = 2 N_mm + 4 n_layers n_ctx d_attn: one forward pass's FLOPs per token (module
    docstring).

    ``n_ctx`` defaults to ``config.n_ctx``: the number of keys each query's attention spans.

    >>> from gptlib.model import GPTConfig
    >>> forward_flops_per_token(GPTConfig.preset("tiny"))  # 2 * 131072 + 4 * 2 * 64 * 64
    294912
    """
    _check_config(config)
    T = config.n_ctx if n_ctx is None else n_ctx
    check_positive_int("n_ctx", T)
    return 2 * matmul_weights(config) + 4 * config.n_layers * T * config.n_heads * config.d_head


def training_flops(config, tokens: int, n_ctx: int | None = None) -> int:
    """C_train · tokens = 3 C_fwd · tokens: FLOPs to train on ``tokens`` tokens (the backward
    costs two forwards).

    >>> from gptlib.model import GPTConfig
    >>> training_flops(GPTConfig.preset("tiny"), 1000)
    884736000
    """
    check_int("tokens", tokens, lo=0)
    return 3 * forward_flops_per_token(config, n_ctx) * tokens


def moe_flops_per_token(d_model: int, d_mlp: int, n_experts: int, top_k: int) -> int:
    """Forward matrix-product FLOPs per token of a mixture-of-experts MLP (:mod:`gptlib.moe`), by
    the
    convention above: the router's product 2 d_model n_experts, plus top_k expert MLPs of
    4 d_model d_mlp each. Apart from the router, independent of n_experts.

    >>> moe_flops_per_token(8, 32, 4, 2)
    2112
    """
    for name, value in (("d_model", d_model), ("d_mlp", d_mlp), ("n_experts", n_experts)):
        check_positive_int(name, value)
    check_int("top_k", top_k, 1, n_experts)
    return 2 * d_model * n_experts + top_k * 4 * d_model * d_mlp


def model_flops_utilization(model_flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """MFU: the model's FLOPs per second achieved, as a fraction of a peak rate.

    >>> model_flops_utilization(6e12, 10.0, 1e12)
    0.6
    """
    check_float("model_flops", model_flops, 0.0)
    check_float("seconds", seconds, 0.0, lo_open=True)
    check_float("peak_flops_per_s", peak_flops_per_s, 0.0, lo_open=True)
    return model_flops / seconds / peak_flops_per_s


def matmul_flops_per_s(
    n: int = 512,
    repeats: int = 5,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    products: int = 1,
) -> float:
    """The best FLOP/s over ``repeats`` timings of ``products`` back-to-back (n, n) @ (n, n)
    products.

    A measured stand-in for the peak rate: a GPU's peak comes from its data sheet (an A100:
    312e12 bf16 FLOP/s, an H100 SXM 989e12), a CPU's is rarely published. On a GPU, time
    several ``products`` per timing so that the launch and the synchronisation do not count.
    """
    for name, value in (("n", n), ("repeats", repeats), ("products", products)):
        check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up
        a @ b
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(products):
            a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * products / max(best, 1e-9)
