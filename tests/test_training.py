"""gptlib.training: windows, losses, schedule, optimiser groups, training, checkpoints and
resume."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlib.model import GPT, GPTConfig
from gptlib.trainer import TrainConfig, Trainer
from gptlib.training import (
    cross_entropy_from_formula,
    lr_at,
    make_windows,
    param_groups,
    perplexity,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is as fast


def test_make_windows_stride_and_errors():
    x, y = make_windows(torch.arange(11), n_ctx=4, stride=2)
    assert x.tolist() == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert torch.equal(y, x + 1)
    assert torch.equal(make_windows(list(range(11)), 4, 2, d_vocab=11)[0], x)
    with pytest.raises(ValueError, match="stride"):
        make_windows(torch.arange(10), 4, 0)
    with pytest.raises(ValueError, match="n_ctx"):
        make_windows(torch.arange(3), 4, 1)


def test_make_windows_refuses_what_is_not_token_ids():
    """Issue 24.14: ids are ints (no floats, no bools), >= 0, and < d_vocab when it is given."""
    for bad, match in [
        (torch.arange(10.0), "integer token ids, got dtype torch.float32"),
        ([0, 1, 2.5] * 4, "ints, got 2.5"),
        ([0, True] * 6, "ints, got True"),
        (torch.tensor([3, -1] * 6), "ids must be >= 0, got -1"),
        ("abcdefgh", "tensor or a list of ints"),
        (torch.zeros(3, 4, dtype=torch.long), "1-D"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_windows(bad, 2, 1)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\), got values in \[0, 9\]"):
        make_windows(torch.arange(10), 4, 1, d_vocab=5)
    for name, kw in [("n_ctx", dict(n_ctx=2.0, stride=1)), ("stride", dict(n_ctx=2, stride=True))]:
        with pytest.raises(ValueError, match=name):
            make_windows(torch.arange(10), **kw)


def test_cross_entropy_formula_equals_torch_and_uniform_is_log_v():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    torch.testing.assert_close(
        cross_entropy_from_formula(logits, targets),
        F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)),
    )
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
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == m.num_parameters()
    # the decision, as in GPT-2 and nanoGPT: every matrix decays, the (tied) embedding and
    # W_pos included
    assert any(p is m.W_E for p in decay["params"]) and any(
        p is m.pos.W_pos for p in decay["params"]
    )


def test_train_config_validation():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=0)
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(steps=5, warmup=6)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_lr", math.inf),
        ("max_lr", math.nan),
        ("max_lr", 0.0),
        ("min_lr", math.nan),
        ("min_lr", -1e-4),
        ("min_lr", 1.0),
        ("grad_clip", math.nan),
        ("grad_clip", math.inf),
        ("weight_decay", math.nan),
        ("weight_decay", -0.1),
        ("betas", (0.9, 1.0)),
        ("betas", (math.nan, 0.95)),
        ("betas", (0.9,)),
        ("steps", 10.0),
        ("batch_size", True),
        ("warmup", 2.5),
        ("eval_every", "5"),
        ("seed", -1),
        ("seed", 1.5),
    ],
)
def test_train_config_refuses_non_finite_and_out_of_range_values(field, value):
    """Issue 24.5: every float finite and in its range, every int an int; the error names the
    field."""
    with pytest.raises(ValueError, match=f"^{field}"):
        TrainConfig(**{field: value})
    assert TrainConfig(betas=[0.8, 0.9]).betas == (0.8, 0.9)  # a list (from JSON) becomes the tuple


def _setup(seed=0, steps=12, dropout=0.1):
    torch.manual_seed(seed)
    ids = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(5))
    ids = ids % 8 + (torch.arange(2000) % 3) * 8  # a learnable pattern
    model = GPT(GPTConfig.preset("tiny", d_vocab=64, n_ctx=16, dropout=dropout))
    tc = TrainConfig(
        steps=steps, batch_size=8, warmup=2, eval_every=4, eval_batches=2, max_lr=1e-2, min_lr=1e-3
    )
    return Trainer(model, make_windows(ids[:1500], 16, 8), make_windows(ids[1500:], 16, 16), tc)


@pytest.fixture(scope="module")
def uninterrupted():
    """The history of _setup()'s 12 steps run without a stop: what every resumed run must repeat."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests that compare with it (one_thread)
    try:
        return _setup().run()
    finally:
        torch.set_num_threads(n)


def test_training_lowers_the_loss():
    t = _setup(steps=40)
    h = t.run()
    assert len(h.loss) == 40 and h.eval_step == list(range(4, 41, 4)) and len(h.eval_loss) == 10
    assert sum(h.loss[-5:]) / 5 < h.loss[0] - 0.5
    assert h.loss[0] == pytest.approx(math.log(64), abs=0.3)  # starts near ln |V|


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path, uninterrupted):
    from gptlib.files import read_file

    full = uninterrupted
    t = _setup()
    t.run(5)
    path = t.save_checkpoint(tmp_path / "ckpt.safetensors")
    resumed = _setup(seed=123)  # different initial weights: all must come from the checkpoint
    resumed.load_checkpoint(path)
    h = resumed.run()
    assert h.loss == full.loss and h.eval_loss == full.eval_loss and h.lr == full.lr
    tensors, fields = read_file(path)  # one safetensors file: tensors, and JSON for the rest
    assert fields["model"] == "GPT" and fields["config"] == t.model.config.to_dict()
    assert fields["trainer"]["step"] == 5 and "trainer/optimizer/state/0/exp_avg" in tensors
    assert torch.equal(GPT.load(path).W_E, t.model.W_E)  # a checkpoint is also a model file


def test_checkpoint_for_another_model_or_config_names_the_field(tmp_path):
    t = _setup()
    path = t.save_checkpoint(tmp_path / "c.safetensors")
    other = Trainer(
        GPT(GPTConfig.preset("tiny", d_vocab=64, n_ctx=16, d_model=32)),
        (t.train_x, t.train_y),
        None,
        t.config,
    )
    with pytest.raises(
        ValueError,
        match=r"c.safetensors: field 'config' differs from this trainer's model in "
        r"\['d_model', 'dropout'\]",
    ):
        other.load_checkpoint(path)
    longer = Trainer(
        GPT(GPTConfig.preset("tiny", d_vocab=64, n_ctx=16, dropout=0.1)),
        (t.train_x, t.train_y),
        None,
        TrainConfig(**{**t.config.__dict__, "steps": 99}),
    )
    with pytest.raises(
        ValueError,
        match=r"field 'trainer.train_config' differs from this trainer's config in \['steps'\]",
    ):
        longer.load_checkpoint(path)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.safetensors is not a valid safetensors file"):
        t.load_checkpoint(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="field 'trainer' is missing"):
        t.load_checkpoint(t.model.save(tmp_path / "model.safetensors"))


def _snapshot(t):
    return (
        {k: v.clone() for k, v in t.model.state_dict().items()},
        t.step,
        list(t.history.loss),
        t.gen.get_state(),
        {i: {k: v.clone() for k, v in st.items()} for i, st in t.opt.state_dict()["state"].items()},
    )


def _same(a, b):
    (wa, sa, ha, ga, oa), (wb, sb, hb, gb, ob) = a, b
    return (
        all(torch.equal(wa[k], wb[k]) for k in wa)
        and sa == sb
        and ha == hb
        and torch.equal(ga, gb)
        and oa.keys() == ob.keys()
        and all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i])
    )


def test_a_bad_checkpoint_is_refused_whole_naming_the_field(tmp_path):
    """Issue 24.3 and 24.5: everything is validated before anything is restored; the error names the
    file and the field; a step that is negative or not an int is refused."""
    from gptlib.files import read_file, write_file

    src = _setup()
    src.run(3)
    tensors, fields = read_file(src.save_checkpoint(tmp_path / "good.safetensors"))
    trainer = fields["trainer"]
    other_opt = _setup()
    other_opt.opt.param_groups[1]["params"] = other_opt.opt.param_groups[1]["params"][
        :-1
    ]  # one parameter fewer
    cases = {
        "missing optimizer": (
            {k: v for k, v in trainer.items() if k != "optimizer"},
            {k: v for k, v in tensors.items() if not k.startswith("trainer/optimizer/")},
            "field 'trainer' must hold",
        ),
        "string step": (
            {**trainer, "step": "3"},
            tensors,
            r"field 'trainer.step' must be an int in \[0, 12\], got '3'",
        ),
        "negative step": (
            {**trainer, "step": -5},
            tensors,
            r"field 'trainer.step' must be an int in \[0, 12\], got -5",
        ),
        "float step": ({**trainer, "step": 3.0}, tensors, "field 'trainer.step' must be an int"),
        "history": (
            {**trainer, "history": {**trainer["history"], "loss": [1.0]}},
            tensors,
            "field 'trainer.history'",
        ),
        "rng": (
            {**trainer, "rng": {**trainer["rng"], "python": [3, [1, 2], None]}},
            tensors,
            "field 'trainer.rng': 'python' is not a valid random state",
        ),
        "moments": (
            trainer,
            {**tensors, "trainer/optimizer/state/0/exp_avg": torch.zeros(3)},
            r"field 'trainer.optimizer': state\[0\]\['exp_avg'\] must be a float tensor of shape",
        ),
        "nan moments": (
            trainer,
            {
                **tensors,
                "trainer/optimizer/state/1/exp_avg_sq": tensors[
                    "trainer/optimizer/state/1/exp_avg_sq"
                ]
                * math.nan,
            },
            r"state\[1\]\['exp_avg_sq'\] holds NaN",
        ),
        "weights": (
            trainer,
            {k: v for k, v in tensors.items() if k != "ln_f.b"},
            r"lacks tensor\(s\) \['ln_f.b'\]",
        ),
    }
    t = _setup(seed=7)  # one trainer for every case: each must leave it as it was
    t.run(1)
    for name, (tr, ts, match) in cases.items():
        path = write_file(tmp_path / f"{name}.safetensors", ts, {**fields, "trainer": tr})
        before = _snapshot(t)
        with pytest.raises(ValueError, match=f"{name}.safetensors.*{match}"):
            t.load_checkpoint(path)
        assert _same(before, _snapshot(t)), f"{name}: the trainer changed"
    with pytest.raises(ValueError, match=r"param_groups\[1\] does not match"):
        other_opt.load_checkpoint(tmp_path / "good.safetensors")


def test_checkpoint_refused_after_a_step_interrupted_part_way(tmp_path, uninterrupted):
    """Issue 24.13: a Ctrl-C in the middle of a step (here after the optimiser moved the weights,
    before the step was counted) must not give a checkpoint that resumes into a different run."""
    full = uninterrupted
    t = _setup()
    t.run(4)
    real_step = t.opt.step

    def step_then_interrupt(*a, **kw):
        real_step(*a, **kw)
        raise KeyboardInterrupt

    t.opt.step = step_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        t.run()
    t.opt.step = real_step
    with pytest.raises(ValueError, match="step 4 was interrupted part-way"):
        t.save_checkpoint(tmp_path / "torn.safetensors")
    assert not (tmp_path / "torn.safetensors").exists()
    # between steps it works, and loading a good checkpoint makes the trainer whole again
    good = _setup()
    good.run(4)
    good.save_checkpoint(tmp_path / "c.safetensors")
    t.load_checkpoint(tmp_path / "c.safetensors")
    t.save_checkpoint(tmp_path / "again.safetensors")
    assert t.run().loss == full.loss


def test_non_finite_model_or_loss_is_an_error_before_the_weights_move():
    """NaN in W_Q gives a NaN loss and NaN gradients on both attention paths (the CPU's fused
    kernel alone would hide it, pytorch/pytorch#141128); the step refuses."""
    from gptlib.training import train_step

    for fused in (True, False):
        t = _setup(dropout=0.0)  # with dropout the fused kernel takes its NaN-propagating path
        for blk in t.model.blocks:
            blk.attn.fused = fused
        x, y = (
            w[:, :8] for w in t._batch(t.train_x, t.train_y, torch.Generator().manual_seed(0))
        )  # (8, 8)
        with torch.no_grad():
            t.model.blocks[0].attn.W_Q[0, 0] = math.nan
        before = {k: v.clone() for k, v in t.model.state_dict().items()}
        loss = t.loss_on(x, y)
        assert not math.isfinite(float(loss.detach()))  # the NaN shows in the loss on either path
        with pytest.raises(ValueError, match="the loss is .* and the gradient norm nan"):
            train_step(t.model, loss, t.opt, t.config.grad_clip)
        after = t.model.state_dict()
        assert all(torch.equal(before[k], after[k]) or k == "blocks.0.attn.W_Q" for k in before)
        assert t.opt.state_dict()["state"] == {}  # the optimiser did not move
        with pytest.raises(ValueError, match="non-finite weights: blocks.0.attn.W_Q holds NaN"):
            t.run(1)
        with pytest.raises(ValueError, match="non-finite weights: blocks.0.attn.W_Q holds NaN"):
            Trainer(t.model, (t.train_x, t.train_y), None, t.config)
    # a run that diverges stops at the first non-finite loss, its weights those of the step before
    t = _setup()
    t.run(2)
    with torch.no_grad():
        t.model.unembed.W_E.mul_(1e38)  # logits overflow to inf
    with pytest.raises(ValueError, match="the loss is"):
        train_step(
            t.model, t.loss_on(*t._batch(t.train_x, t.train_y, torch.Generator())), t.opt, None
        )


def test_trainer_refuses_bad_windows():
    """Issue 24.14: mismatched x and y, targets beyond the vocabulary, float or negative ids."""
    t = _setup()
    x, y = t.train_x, t.train_y
    cases = [
        ((x, y[:, :-1]), "same shape"),
        ((x[:-1], y), "same shape"),
        ((x, torch.cat([y, y[:, :1]], 1)), "same shape"),
        ((x, y + 64), r"train y must lie in \[0, 64\)"),
        ((x - 1, y), r"train x must lie in \[0, 64\)"),
        ((x.float(), y), "train x must be an integer tensor"),
        ((x[:0], y[:0]), "n_windows >= 1"),
        ((x, y, y), "pair of tensors"),
        ((torch.zeros(2, 17, dtype=torch.long),) * 2, "longer than the model's n_ctx=16"),
    ]
    for train, match in cases:
        with pytest.raises(ValueError, match=match):
            Trainer(t.model, train, None, t.config)
    with pytest.raises(ValueError, match=r"val y must lie in \[0, 64\)"):
        Trainer(t.model, (x, y), (x, y + 64), t.config)
    with pytest.raises(ValueError, match="config must be a TrainConfig"):
        Trainer(t.model, (x, y), None, {"steps": 3})


def test_train_step_equals_the_written_out_step():
    from gptlib.training import train_step

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = (
        torch.optim.AdamW(a.parameters(), lr=0.1),
        torch.optim.AdamW(b.parameters(), lr=0.1),
    )
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
