"""gptlib.training: windows, losses, schedule, optimiser groups, training, checkpoints and resume."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlib.model import GPT, GPTConfig
from gptlib.training import (
    Trainer,
    TrainConfig,
    cross_entropy_from_formula,
    lr_at,
    make_windows,
    param_groups,
    perplexity,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is faster than several (no spin-waiting on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_make_windows_stride_and_errors():
    x, y = make_windows(torch.arange(11), n_ctx=4, stride=2)
    assert x.tolist() == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert torch.equal(y, x + 1)
    with pytest.raises(ValueError, match="stride"):
        make_windows(torch.arange(10), 4, 0)
    with pytest.raises(ValueError, match="n_ctx"):
        make_windows(torch.arange(3), 4, 1)


def test_cross_entropy_formula_equals_torch_and_uniform_is_log_v():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    torch.testing.assert_close(cross_entropy_from_formula(logits, targets), F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)))
    uniform = cross_entropy_from_formula(torch.zeros(5, 11), torch.arange(5))
    assert float(uniform) == pytest.approx(math.log(11))
    assert perplexity(uniform) == pytest.approx(11)
    with pytest.raises(ValueError, match="targets"):
        cross_entropy_from_formula(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))


def test_lr_schedule():
    assert lr_at(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 100) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_at(100, 1.0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_at(55, 1.0, 10, 100, 0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="warmup"):
        lr_at(0, 1.0, 10, 5)


def test_weight_decay_only_on_matrices():
    m = GPT(GPTConfig.preset("tiny"))
    decay, no_decay = param_groups(m, 0.1)
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == m.num_parameters()
    # the decision, as in GPT-2 and nanoGPT: every matrix decays, the (tied) embedding and W_pos included
    assert any(p is m.W_E for p in decay["params"]) and any(p is m.pos.W_pos for p in decay["params"])


def test_train_config_validation():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=0)
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(steps=5, warmup=6)


def _setup(seed=0, steps=12):
    torch.manual_seed(seed)
    ids = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(5))
    ids = ids % 8 + (torch.arange(2000) % 3) * 8  # a learnable pattern
    model = GPT(GPTConfig.preset("tiny", d_vocab=64, n_ctx=16, dropout=0.1))
    tc = TrainConfig(steps=steps, batch_size=8, warmup=2, eval_every=4, eval_batches=2, max_lr=1e-2, min_lr=1e-3)
    return Trainer(model, make_windows(ids[:1500], 16, 8), make_windows(ids[1500:], 16, 16), tc)


def test_training_lowers_the_loss():
    t = _setup(steps=40)
    h = t.run()
    assert len(h.loss) == 40 and h.eval_step == list(range(4, 41, 4)) and len(h.eval_loss) == 10
    assert sum(h.loss[-5:]) / 5 < h.loss[0] - 0.5
    assert h.loss[0] == pytest.approx(math.log(64), abs=0.3)  # starts near ln |V|


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    full = _setup().run()
    t = _setup()
    t.run(5)
    t.save_checkpoint(tmp_path / "ckpt.pt")
    resumed = _setup(seed=123)  # different initial weights: all must come from the checkpoint
    resumed.load_checkpoint(tmp_path / "ckpt.pt")
    h = resumed.run()
    assert h.loss == full.loss and h.eval_loss == full.eval_loss and h.lr == full.lr
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)  # plain tensors and values only
    assert state["step"] == 5


def test_checkpoint_for_another_config_names_the_tensor(tmp_path):
    t = _setup()
    t.save_checkpoint(tmp_path / "c.pt")
    other = Trainer(GPT(GPTConfig.preset("tiny", d_vocab=64, n_ctx=16, d_model=32)), (t.train_x, t.train_y), None, t.config)
    with pytest.raises(ValueError, match="embed.W_E|shape"):
        other.load_checkpoint(tmp_path / "c.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="checkpoint"):
        t.load_checkpoint(tmp_path / "junk.pt")


def test_train_step_equals_the_written_out_step():
    from gptlib.training import train_step

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), lr=0.1), torch.optim.AdamW(b.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for _ in range(3):
        loss_a = a(x).square().sum()
        assert train_step(a, loss_a, opt_a, grad_clip=0.5) == float(loss_a.detach())
        opt_b.zero_grad()
        b(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="grad_clip"):
        train_step(a, a(x).sum(), opt_a, grad_clip=0.0)
