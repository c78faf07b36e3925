"""Tests for gptlib.efficiency: bytes per parameter, activation memory, accumulation, checkpointing,
reduced precision and the ZeRO table, against byte counts of real tensors and published numbers."""

from __future__ import annotations

import pytest
import torch

from gptlib import efficiency as E
from gptlib.block import Block
from gptlib.model import GPT, GPTConfig

TINY = GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2)


def _model(seed: int = 0, config: GPTConfig = TINY) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def _batch(B: int = 4, T: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, TINY.d_vocab, (B, T + 1), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def test_bytes_per_parameter_layouts():
    assert E.adamw_bytes_per_parameter("mixed") == {
        "weights": 2,
        "gradients": 2,
        "master weights": 4,
        "moments": 8,
    }
    assert (
        sum(E.adamw_bytes_per_parameter("mixed").values())
        == sum(E.adamw_bytes_per_parameter("fp32").values())
        == 16
    )
    with pytest.raises(ValueError, match="layout"):
        E.adamw_bytes_per_parameter("fp8")


def test_tensor_bytes_counts_each_storage_once():
    x = torch.zeros(6, 4)
    assert E.tensor_bytes([x, x.t(), x[1:3], None]) == 96
    assert (
        E.tensor_bytes([torch.zeros(3, dtype=torch.float16), torch.zeros(2, dtype=torch.float64)])
        == 22
    )


def _one_step(model, opt, x, y):
    loss = E.lm_loss(model(x), y)
    loss.backward()
    opt.step()


def test_fp32_adamw_state_is_16_bytes_per_parameter():
    model = _model()
    N = model.num_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _one_step(model, opt, *_batch())
    b = E.model_state_bytes(model, opt)
    n_tensors = len(list(model.parameters()))
    assert b["weights"] == 4 * N and b["gradients"] == 4 * N and b["master weights"] == 0
    assert b["optimizer"] == 8 * N + 4 * n_tensors  # two moments + one fp32 step counter per tensor


def test_mixed_precision_state_is_16_bytes_per_parameter_and_steps_like_fp32():
    model = _model().to(torch.bfloat16)
    N = model.num_parameters()
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-2)
    x, y = _batch()
    E.lm_loss(model(x), y).backward()
    grads = [p.grad.float().clone() for p in model.parameters()]
    # the reference: AdamW on fp32 copies with the same (upcast bf16) gradients
    ref = [m.detach().clone().requires_grad_(True) for m in master]
    for r, g in zip(ref, grads):
        r.grad = g
    torch.optim.AdamW(ref, lr=1e-2).step()
    E.master_weights_step(model, master, opt)
    for p, m, r in zip(model.parameters(), master, ref):
        torch.testing.assert_close(m.detach(), r.detach(), rtol=0, atol=0)
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
        assert m.grad is None
    b = E.model_state_bytes(model, opt, master)
    n_tensors = len(master)
    assert (b["weights"], b["gradients"], b["master weights"]) == (2 * N, 2 * N, 4 * N)
    assert b["optimizer"] == 8 * N + 4 * n_tensors
    with pytest.raises(ValueError, match="master"):
        E.master_weights_step(model, master[:-1], opt)
    with pytest.raises(ValueError, match="master"):
        E.master_weights_step(model, [m.detach().double() for m in master], opt)


@pytest.mark.parametrize("B,T,d_model,n_heads", [(2, 16, 32, 4), (3, 10, 48, 6), (1, 7, 24, 3)])
@pytest.mark.parametrize("attention", ["fused", "pattern"])
def test_activation_formula_equals_the_bytes_autograd_saves(B, T, d_model, n_heads, attention):
    torch.manual_seed(0)
    blk = Block(GPTConfig(d_model=d_model, n_heads=n_heads))
    x = torch.randn(B, T, d_model, requires_grad=True)
    blk.attn.fused = attention == "fused"  # False: the readable path, which forms the pattern
    _, saved = E.saved_tensor_bytes(blk, x, exclude=blk.parameters())
    assert saved == 4 * E.activation_elements(B, T, d_model, n_heads, attention=attention)


def test_activation_elements_arguments():
    assert E.activation_elements(2, 3, 8, 2) == 2 * 3 * (16 * 8 + 2 + 4)
    assert (
        E.activation_elements(1, 4, 8, 2, attention="pattern") - E.activation_elements(1, 4, 8, 2)
        == 2 * (3 * 16 + 2 * 4) - 4 * 2
    )
    for kwargs, name in (
        ({"B": 0}, "B"),
        ({"T": -1}, "T"),
        ({"n_heads": 3}, "n_heads"),
        ({"attention": "flash"}, "attention"),
    ):
        args = {"B": 1, "T": 2, "d_model": 8, "n_heads": 2} | kwargs
        with pytest.raises(ValueError, match=name):
            E.activation_elements(**args)


def test_saved_tensor_bytes_excludes_given_tensors():
    w = torch.randn(50, 50, requires_grad=True)
    x = torch.randn(3, 50, requires_grad=True)
    _, with_w = E.saved_tensor_bytes(lambda: (x @ w).sum())
    _, without_w = E.saved_tensor_bytes(lambda: (x @ w).sum(), exclude=[w])
    assert with_w - without_w == 50 * 50 * 4
    assert without_w == 3 * 50 * 4  # mm keeps x for w's gradient and w for x's


@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_gradient_accumulation_equals_the_large_batch(n_micro):
    x, y = _batch(B=8)
    big = _model()
    loss = E.lm_loss(big(x), y)
    loss.backward()
    acc = _model()
    mean = E.accumulate_gradients(acc, x, y, n_micro)
    assert abs(mean - loss.item()) < 1e-5
    for (n, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)
    with pytest.raises(ValueError, match="n_micro"):
        E.accumulate_gradients(acc, x, y, 3)
    with pytest.raises(ValueError, match="n_micro"):
        E.accumulate_gradients(acc, x, y, 0)


def test_checkpointing_same_gradients_and_keeps_only_block_inputs():
    x, y = _batch()
    plain, ckpt = _model(), _model()
    E.lm_loss(plain(x), y).backward()
    logits = E.checkpointed_logits(ckpt, x)
    torch.testing.assert_close(logits, plain(x))
    E.lm_loss(logits, y).backward()
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)
    _, full = E.saved_tensor_bytes(plain, x, exclude=plain.parameters())
    _, kept = E.saved_tensor_bytes(E.checkpointed_logits, ckpt, x, exclude=ckpt.parameters())
    B, T = x.shape
    c = TINY
    per_block = 4 * E.activation_elements(B, T, c.d_model, c.n_heads)
    assert full - kept == c.n_layers * (per_block - 4 * B * T * c.d_model)
    with pytest.raises(ValueError, match="ids"):
        E.checkpointed_logits(ckpt, x[0])


def test_live_bytes_follows_allocations_and_frees():
    w = torch.randn(40, 40, requires_grad=True)
    with E.LiveBytes(exclude=[w]) as mem:
        h = torch.randn(10, 40) @ w  # h (1600 bytes) and the input, which mm saves for w's gradient
        assert mem.now == 3200
        torch.randn(1000)  # made and freed at once: only the peak remembers it
        assert (mem.now, mem.peak) == (3200, 7200)
        y = h.sum()
        y.backward()  # frees the saved input; creates w.grad (6400 bytes)
    del h, y
    assert mem.now == 6400  # only w.grad is left of what was created
    assert mem.reset_peak() >= mem.now == mem.peak


@pytest.mark.parametrize("n_layers", [1, 3])
def test_checkpointed_backward_peaks(n_layers):
    """Block turns step down by one block's saved tensors (plain) or by one block input
    (checkpointed);
    the read-out's turn differs by exactly what checkpointing removed from the forward pass."""
    config = GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=n_layers)
    x, y = _batch()
    plain, ckpt = _model(config=config), _model(config=config)
    f_plain, t_plain = E.backward_turn_peaks(plain, x, y)
    f_ckpt, t_ckpt = E.backward_turn_peaks(ckpt, x, y, checkpointed=True)
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    B, T = x.shape
    M_act = 4 * E.activation_elements(B, T, 16, 2)
    BTd = 4 * B * T * 16
    assert len(t_plain) == len(t_ckpt) == n_layers + 1
    assert f_plain - f_ckpt == t_plain[0] - t_ckpt[0] == n_layers * (M_act - BTd)
    assert all(a - b == M_act for a, b in zip(t_plain[1:], t_plain[2:]))
    assert all(a - b == BTd for a, b in zip(t_ckpt[1:], t_ckpt[2:]))


def test_checkpointing_with_dropout_replays_the_same_masks():
    config = GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2, dropout=0.3)
    x, y = _batch()
    a, b = _model(config=config).train(), _model(config=config).train()
    torch.manual_seed(5)
    E.lm_loss(a(x), y).backward()
    torch.manual_seed(5)
    E.lm_loss(E.checkpointed_logits(b, x), y).backward()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_unit_roundoff_and_measured_rounding_error():
    assert E.unit_roundoff(torch.bfloat16) == 2.0**-8
    assert E.unit_roundoff(torch.float16) == 2.0**-11
    assert E.unit_roundoff(torch.float32) == 2.0**-24
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        err = E.relative_rounding_error(x[x.abs() > 1e-3], dtype)
        u = E.unit_roundoff(dtype)
        assert 0.9 * u < err <= u, (dtype, err, u)  # the bound is attained, nearly, by some entry
    with pytest.raises(ValueError, match="dtype"):
        E.unit_roundoff(torch.int32)
    with pytest.raises(ValueError, match="x"):
        E.relative_rounding_error(torch.zeros(3), torch.bfloat16)


def _small_grad_problem():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(16, 8)
    return lin, (
        lambda: (lin(x).float() * 1e-8).sum()
    )  # dL/d(output) = 1e-8 < fp16's smallest 6e-8


def test_fp16_gradient_underflows_without_loss_scaling_and_survives_with_it():
    lin, loss_fn = _small_grad_problem()
    ref = E.amp_gradients(lin, loss_fn, None)
    fp16 = E.amp_gradients(lin, loss_fn, torch.float16)
    scaled = E.amp_gradients(lin, loss_fn, torch.float16, loss_scale=2.0**16)
    bf16 = E.amp_gradients(lin, loss_fn, torch.bfloat16)
    for n, g in ref.items():
        assert g.abs().min() > 0
        assert torch.count_nonzero(fp16[n]) == 0, n  # every gradient flushed to zero
        scale = float(
            g.abs().max()
        )  # errors relative to the largest entry (sums of 16 products cancel)
        torch.testing.assert_close(scaled[n], g, rtol=0, atol=2e-3 * scale)
        torch.testing.assert_close(bf16[n], g, rtol=0, atol=1e-2 * scale)  # bf16 has fp32's range
    with pytest.raises(ValueError, match="loss_scale"):
        E.amp_gradients(lin, loss_fn, torch.float16, loss_scale=0)


def test_zero_table_matches_the_zero_paper():
    # ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, 64 GPUs, K = 12.
    got = [E.zero_bytes_per_device(7.5e9, 64, s) / 1e9 for s in range(4)]
    assert [round(g, 2) for g in got] == [120.0, 31.41, 16.64, 1.88]
    assert E.zero_bytes_per_device(1e9, 8, 3) == E.zero_bytes_per_device(1e9, 8, 0) / 8
    assert E.zero_bytes_per_device(1e9, 1, 3) == E.zero_bytes_per_device(1e9, 1, 0)
    for kwargs, name in (
        ({"n_params": 0}, "n_params"),
        ({"n_devices": 0}, "n_devices"),
        ({"stage": 4}, "stage"),
    ):
        args = {"n_params": 1e9, "n_devices": 8, "stage": 1} | kwargs
        with pytest.raises(ValueError, match=name):
            E.zero_bytes_per_device(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocated_memory_matches_the_saved_tensor_count():
    B, T, d_model, n_heads = 4, 128, 256, 4
    torch.manual_seed(0)
    blk = Block(GPTConfig(d_model=d_model, n_heads=n_heads)).cuda()
    x = torch.randn(B, T, d_model, device="cuda", requires_grad=True)
    # warm-up: cuBLAS's workspace and the gradients are allocated now, not below
    blk(x).sum().backward()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = blk(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before  # what the forward pass left behind
    peak = torch.cuda.max_memory_allocated() - before
    _, saved = E.saved_tensor_bytes(blk, x, exclude=blk.parameters())
    formula = 4 * E.activation_elements(B, T, d_model, n_heads)
    assert abs(saved - formula) <= 0.01 * formula, (saved, formula)
    # the saved tensors include the input x, allocated before `before`; the output is held
    expected = saved - 4 * x.numel() + 4 * out.numel()
    assert abs(held - expected) <= 0.01 * expected, (held, expected)
    assert peak >= held


def test_float_arguments_must_be_finite():
    with pytest.raises(ValueError, match="n_params"):
        E.zero_bytes_per_device(float("inf"), 8, 1)
    with pytest.raises(ValueError, match="n_params"):
        E.zero_bytes_per_device(float("nan"), 8, 1)
    with pytest.raises(ValueError, match="loss_scale"):
        E.amp_gradients(
            torch.nn.Linear(2, 1), lambda: torch.zeros(()), None, loss_scale=float("inf")
        )
    with pytest.raises(ValueError, match="n_devices"):
        E.zero_bytes_per_device(1e9, True, 1)


def test_rounding_error_refuses_non_finite_input():
    with pytest.raises(ValueError, match="finite"):
        E.relative_rounding_error(torch.tensor([1.0, float("nan")]), torch.bfloat16)
