"""Nothing silent: a non-finite weight shows, a tampered checkpoint is refused, every loss and
objective checks its targets, masks, beta and eps, and a bad path says what is wrong with it.

Every model here is ``GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2)``.
"""

import math
import os
import re

import pytest
import torch
from page_twins import TokenizerStub

from gptlib import files
from gptlib.attention import attend, non_finite_rows
from gptlib.model import GPT, GPTConfig
from gptlib.modern import ModernConfig, ModernGPT
from gptlib.parallel.context import blockwise_attention
from gptlib.parallel.pipeline import stage_layers
from gptlib.rlhf.objectives import (
    RewardModel,
    dpo_loss,
    group_advantages,
    kl_penalty,
    ppo_loss,
    sequence_logprob,
    token_logprobs,
)
from gptlib.runtime import check_file, check_finite, check_mask, check_targets
from gptlib.sampling import generate
from gptlib.trainer import TrainConfig, Trainer
from gptlib.training import (
    cross_entropy_from_formula,
    lm_loss,
    lr_at,
    make_windows,
    perplexity,
    windows_loss,
)
from gptlib.widgets.sampling import continuation_tree

pytestmark = pytest.mark.usefixtures("one_thread")

NAN = float("nan")
CFG = GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2)


def small_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2, **kw))


def ids_of(T, B=1, seed=0):
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(seed))


# --- 1. a NaN weight is not hidden by the forward pass ------------------------------------------
@pytest.mark.parametrize("T", [1, 2, 5, 7, 8, 16])
@pytest.mark.parametrize("weight", ["W_Q", "W_K", "W_V", "W_O"])
@pytest.mark.parametrize("grad", [False, True])
def test_a_nan_attention_weight_makes_the_logits_nan(T, weight, grad):
    m = small_gpt()
    getattr(m.blocks[0].attn, weight).data.fill_(NAN)
    with torch.set_grad_enabled(grad):
        assert not torch.isfinite(m(ids_of(T))).any()


@pytest.mark.parametrize("T", [1, 3, 16])
def test_the_fused_kernel_propagates_a_non_finite_query_or_key(T):
    """The CPU's fused kernel gives a row whose scores are all NaN the output 0; non_finite_rows
    restores NaN."""
    g = torch.Generator().manual_seed(0)
    for which in range(2):
        for bad in (NAN, math.inf):
            q, k, v = (torch.randn(1, 2, T, 4, generator=g) for _ in range(3))
            (q, k)[which][..., 0, :] = bad
            fused = attend(q, k, v, fused=True) + non_finite_rows(q, k)[:, None]
            readable = attend(q, k, v, fused=False)
            assert not torch.isfinite(fused[..., 0, :]).any()
            assert not (
                torch.isfinite(fused) & ~torch.isfinite(readable)
            ).any()  # the formula's NaN shows
            if bad != bad:  # a NaN: exactly the rows the formula makes NaN
                assert torch.equal(torch.isfinite(fused), torch.isfinite(readable))


def test_a_nan_weight_shows_in_modern_gpt_windows_loss_and_the_sampling_view():
    modern = ModernGPT(
        ModernConfig(
            d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_kv_heads=1, n_layers=2, d_mlp=32
        )
    )
    modern.blocks[0].attn.W_K.data.fill_(NAN)
    with torch.no_grad():
        assert not torch.isfinite(modern(ids_of(4))).any()
    m = small_gpt()
    m.blocks[0].attn.W_Q.data.fill_(NAN)
    x, y = make_windows(torch.arange(40) % 64, n_ctx=4, stride=4)
    assert not math.isfinite(windows_loss(m, x, y).nats_per_token)
    from gptlib.tokenizers.simple import CharTokenizer
    from gptlib.widgets.sampling import SamplingView

    tok = CharTokenizer([chr(48 + i) for i in range(64)])
    with pytest.raises(ValueError, match="NaN"):
        SamplingView.from_model(m, tok, ["12"], depth=1, branch=1, n_logits=4, n_logits_deep=4)


# --- 2. non-finite weights are refused on loading -----------------------------------------------
def written_anyway(model, path):
    """The file ``model.save`` would write, written though a weight is not finite (``save``
    refuses it): what a damaged or foreign writer leaves."""
    return files.write_file(path, files.model_tensors(model), files.model_fields(model))


def test_loading_refuses_non_finite_weights_naming_the_tensor_and_the_file(tmp_path):
    m = small_gpt()
    m.blocks[1].mlp.W_in.data[0, 0] = NAN
    name = "blocks.1.mlp.W_in"
    path = written_anyway(m, tmp_path / "nan.safetensors")
    with pytest.raises(
        ValueError, match=re.escape(f"{path}: tensor {name!r} holds NaN or infinite values")
    ):
        GPT.load(path)
    modern = ModernGPT(
        ModernConfig(
            d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_kv_heads=1, n_layers=2, d_mlp=32
        )
    )
    modern.W_E.data[3, 1] = math.inf
    path = written_anyway(modern, tmp_path / "inf.safetensors")
    with pytest.raises(
        ValueError, match=re.escape(f"{path}: tensor 'W_E' holds NaN or infinite values")
    ):
        ModernGPT.load(path)


def test_a_gguf_holding_a_nan_is_refused_by_the_reader_and_the_converter(tmp_path):
    pytest.importorskip("gguf")
    from test_gguf import write_gguf

    from gptlib.gguf import export_gguf, read_gguf, state_from_gguf

    torch.manual_seed(0)
    modern = ModernGPT(ModernConfig.preset("tiny"))
    bad = f"blocks.{modern.config.n_layers - 1}.mlp.W_out"
    modern.get_parameter(bad).data[-1, -1] = NAN
    path = write_gguf(tmp_path / "nan.gguf", modern)
    config, state = state_from_gguf(read_gguf(path))
    with pytest.raises(ValueError, match=rf"nan.gguf.*{re.escape(bad)}.*NaN or infinite"):
        ModernGPT.from_state(config, state, source=str(path))
    with pytest.raises(ValueError, match="nan.gguf.*NaN or infinite"):
        export_gguf(path, tmp_path / "w.safetensors", tmp_path / "t.json")
    assert not (tmp_path / "w.safetensors").exists()


# --- 3. a checkpoint's optimiser state must fit the run ------------------------------------------
def windows():
    x, y = make_windows(torch.arange(200) % 64, n_ctx=8, stride=4)
    return x, y


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "c.safetensors"
    t = Trainer(
        small_gpt(), windows(), None, TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2)
    )
    t.run(2)
    t.save_checkpoint(path)
    return path


def tampered(checkpoint, tmp_path, edit):
    """The checkpoint with ``edit(optimizer_state_dict, tree)`` applied, rewritten with a valid
    digest."""
    from gptlib.state import pack, unpack

    tensors, fields = files.read_file(checkpoint)
    tree = unpack(fields["trainer"], tensors, "t", "trainer")
    edit(tree["optimizer"], tree)
    structure, trainer_tensors = pack(tree, "trainer")
    model = {k: v for k, v in tensors.items() if "/" not in k}
    fields = {k: v for k, v in fields.items() if k not in ("version", "sha256")}
    path = tmp_path / "tampered.safetensors"
    files.write_file(path, {**model, **trainer_tensors}, {**fields, "trainer": structure})
    return path


def set_group(key, value):
    def edit(opt, tree):
        for g in opt["param_groups"]:
            g[key] = value

    return edit


def set_state(key, fn):
    def edit(opt, tree):
        for st in opt["state"].values():
            st[key] = fn(st[key])

    return edit


TAMPERS = {
    "betas": (set_group("betas", (0.5, 0.6)), "betas"),
    "betas out of range": (set_group("betas", (5.0, -3.0)), "betas"),
    "weight_decay": (set_group("weight_decay", 0.5), "weight_decay"),
    "eps": (set_group("eps", 1.0), "eps"),
    "maximize": (set_group("maximize", True), "maximize"),
    "amsgrad": (set_group("amsgrad", True), "amsgrad"),
    "foreach": (set_group("foreach", True), "foreach"),
    "lr": (set_group("lr", 0.5), "lr"),
    "negative exp_avg_sq": (set_state("exp_avg_sq", lambda t: -t - 1), "exp_avg_sq"),
    "negative step": (set_state("step", lambda t: torch.full_like(t, -5.0)), "step"),
    "fractional step": (set_state("step", lambda t: t + 0.5), "step"),
    "step of another run": (set_state("step", lambda t: t + 1), "step"),
    "empty state": (lambda opt, tree: opt["state"].clear(), "state"),
    "a parameter's state missing": (lambda opt, tree: opt["state"].pop(0), "state"),
    "a moment missing": (lambda opt, tree: opt["state"][0].pop("exp_avg"), "exp_avg"),
    "an extra moment": (
        lambda opt, tree: opt["state"][0].update(max_exp_avg_sq=torch.zeros(1)),
        "max_exp_avg_sq",
    ),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_optimiser_state_is_refused_before_anything_changes(
    checkpoint, tmp_path, tamper
):
    edit, field = TAMPERS[tamper]
    path = tampered(checkpoint, tmp_path, edit)
    t = Trainer(
        small_gpt(seed=1),
        windows(),
        None,
        TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2),
    )
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt_before = repr(t.opt.state_dict())
    with pytest.raises(
        ValueError, match=rf"tampered.safetensors: field 'trainer.optimizer'.*{field}"
    ):
        t.load_checkpoint(path)
    assert t.step == 0 and repr(t.opt.state_dict()) == opt_before
    assert all(torch.equal(v, before[k]) for k, v in t.model.state_dict().items())


def test_an_untampered_rewrite_still_loads_and_resumes(checkpoint, tmp_path):
    path = tampered(checkpoint, tmp_path, lambda opt, tree: None)
    t = Trainer(
        small_gpt(seed=1),
        windows(),
        None,
        TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2),
    )
    t.load_checkpoint(path)
    assert t.step == 2
    t.run()


def test_a_step_zero_state_holds_no_moments(tmp_path):
    t = Trainer(
        small_gpt(), windows(), None, TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2)
    )
    fresh = t.save_checkpoint(tmp_path / "fresh.safetensors")
    t.load_checkpoint(fresh)
    other = Trainer(
        small_gpt(), windows(), None, TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2)
    )
    other.run(1)
    moments = other.opt.state_dict()["state"]
    path = tampered(fresh, tmp_path, lambda opt, tree: opt["state"].update(moments))
    with pytest.raises(ValueError, match="step"):
        t.load_checkpoint(path)


# --- 4 and 5. loss targets: ints in [0, d_vocab), never -100, never empty ----------------------
@pytest.mark.parametrize(
    "targets",
    [
        torch.full((1, 2), -100),
        torch.tensor([[0, 1, 2, -100, 3, 4]]),
        torch.tensor([[5, 0]]),
        torch.tensor([[-1, 0]]),
    ],
)
def test_lm_loss_refuses_targets_out_of_range(targets):
    logits = torch.zeros(1, targets.shape[1], 5)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 5\)"):
        lm_loss(logits, targets)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 5\)"):
        cross_entropy_from_formula(logits, targets)


def test_minus_100_is_refused_with_a_word_on_ignore_index():
    with pytest.raises(ValueError, match="ignore_index"):
        lm_loss(torch.zeros(1, 2, 5), torch.full((1, 2), -100))


def test_windows_loss_refuses_targets_out_of_range():
    m = small_gpt()
    x, y = make_windows(torch.arange(40) % 64, n_ctx=4, stride=4)
    for bad in (torch.full_like(y, -100), torch.full_like(y, 64)):
        with pytest.raises(ValueError, match=r"y must lie in \[0, 64\)"):
            windows_loss(m, x, bad)
    with pytest.raises(ValueError, match=r"x must lie in \[0, 64\)"):
        windows_loss(m, x + 64, y)


def test_empty_batches_are_refused():
    with pytest.raises(ValueError, match="targets .*empty"):
        lm_loss(torch.zeros(1, 0, 5), torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="targets .*empty"):
        cross_entropy_from_formula(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))
    e = torch.zeros(0)
    with pytest.raises(ValueError, match="logp .*empty"):
        ppo_loss(e, e, e)
    with pytest.raises(ValueError, match="logp_chosen .*empty"):
        dpo_loss(e, e, e, e, beta=0.1)


# --- 6. no bare error from inside torch ----------------------------------------------------------
@pytest.mark.parametrize(
    "ids", [torch.tensor([[0, 9, 1]]), torch.tensor([[0, -1, 1]]), torch.tensor([[0.0, 1.0, 2.0]])]
)
def test_token_logprobs_checks_its_ids(ids):
    with pytest.raises(ValueError, match="ids must"):
        token_logprobs(torch.zeros(1, 3, 4), ids)


def test_reward_model_lengths_are_ints():
    r = RewardModel(small_gpt())
    for lengths in (torch.tensor([2.0]), torch.tensor([True])):
        with pytest.raises(ValueError, match="lengths must"):
            r(ids_of(3), lengths=lengths)
    with pytest.raises(ValueError, match="ids must"):
        r(torch.tensor([[0, 64]]))


def test_blockwise_attention_checks_its_shapes_and_names_its_own_parameters():
    q, k, v = torch.zeros(1, 4, 8), torch.zeros(1, 4, 6), torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="q and k must"):
        blockwise_attention(q, k, v, n_blocks=2)
    with pytest.raises(ValueError, match="n_blocks"):
        blockwise_attention(q, q, v, n_blocks=0)
    with pytest.raises(ValueError, match="k and v must"):
        blockwise_attention(q, q, torch.zeros(1, 3, 8), n_blocks=1)


# --- 7. beta and eps are finite -----------------------------------------------------------------
def test_beta_and_eps_must_be_finite_and_in_range():
    a = torch.tensor([-1.0, -2.0])
    for beta in (math.inf, NAN, -1.0):
        with pytest.raises(ValueError, match="beta must"):
            kl_penalty(a, a, beta=beta)
        with pytest.raises(ValueError, match="beta must"):
            dpo_loss(a, a, a, a, beta=beta)
    for eps in (NAN, -1e-6, 0.0, math.inf):
        with pytest.raises(ValueError, match="eps must"):
            group_advantages(torch.ones(1, 3), eps=eps)
    for clip_eps in (NAN, 0.0, 1.0):
        with pytest.raises(ValueError, match="clip_eps must"):
            ppo_loss(a, a, a, clip_eps=clip_eps)


def test_rewards_and_log_probabilities_must_be_finite():
    with pytest.raises(ValueError, match="rewards must be finite"):
        group_advantages(torch.tensor([[1.0, NAN]]))
    a = torch.tensor([-1.0, NAN])
    with pytest.raises(ValueError, match="logp must be finite"):
        kl_penalty(a, torch.zeros(2), beta=0.1)


# --- 8. a mask is a mask ------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [torch.tensor([[0.0, 0.5, 7.0]]), torch.tensor([[0, 5, 5]])])
def test_a_mask_that_is_not_a_mask_is_refused(mask):
    with pytest.raises(ValueError, match="response_mask must"):
        sequence_logprob(small_gpt(), ids_of(3), mask)
    a = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="mask must"):
        ppo_loss(a, a, a, mask=mask)


def test_a_0_1_float_mask_equals_the_boolean_one():
    m, ids = small_gpt(), ids_of(3)
    b = torch.tensor([[False, True, True]])
    assert torch.equal(sequence_logprob(m, ids, b), sequence_logprob(m, ids, b.float()))


# --- 9. a callback's batch is checked ------------------------------------------------------------
def test_continuation_tree_refuses_a_short_batch():
    with pytest.raises(ValueError, match=r"next_logits .*\(2, d_vocab\).*\(1, 3\)"):
        continuation_tree(
            lambda c: torch.zeros(1, 3), [0], depth=2, branch=2, n_logits=3, n_logits_deep=3
        )
    with pytest.raises(ValueError, match="next_logits"):
        continuation_tree(
            lambda c: torch.zeros(3), [0], depth=1, branch=1, n_logits=3, n_logits_deep=3
        )


def test_the_sampling_view_refuses_a_short_batch():
    from gptlib.tokenizers.simple import CharTokenizer
    from gptlib.widgets.sampling import SamplingView

    tok = CharTokenizer(list("abc"))
    with pytest.raises(ValueError, match="next_logits"):
        SamplingView.from_model(
            lambda c: torch.zeros(1, 3), tok, ["ab"], depth=2, branch=2, n_logits=3, n_logits_deep=3
        )


# --- 10. files, and the smaller numbers ---------------------------------------------------------
def test_a_directory_or_an_unreadable_file_is_named_as_such(tmp_path):
    from gptlib.gguf import read_gguf

    t = Trainer(
        small_gpt(), windows(), None, TrainConfig(steps=4, batch_size=2, warmup=1, eval_every=2)
    )
    (tmp_path / "d.safetensors").mkdir()
    for load in (t.load_checkpoint, read_gguf, files.read_tensors, files.read_fields):
        with pytest.raises(ValueError, match="is a directory, not a file"):
            load(tmp_path / "d.safetensors")
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load(tmp_path / "none.safetensors")
    if os.name == "posix" and os.geteuid() != 0:
        locked = t.save_checkpoint(tmp_path / "locked.safetensors")
        locked.chmod(0)
        try:
            with pytest.raises(PermissionError, match="cannot be read"):
                t.load_checkpoint(locked)
        finally:
            locked.chmod(0o644)


def test_check_file_says_what_is_wrong(tmp_path):
    assert check_file(tmp_path / "x", "path", must_exist=False) == tmp_path / "x"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_file(tmp_path / "x")
    with pytest.raises(ValueError, match="is a directory"):
        check_file(tmp_path)
    with pytest.raises(ValueError, match="path must be a str or a path"):
        check_file(3)


def test_asset_path_says_a_directory_is_a_directory(tmp_path, monkeypatch):
    from gptlib import assets

    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    name = next(iter(assets.ASSETS))
    (tmp_path / assets.ASSETS[name].filename).mkdir(parents=True)
    with pytest.raises(ValueError, match="is a directory"):
        assets.asset_path(name)


def test_perplexity_and_the_schedule_check_their_range():
    with pytest.raises(ValueError, match="loss must"):
        perplexity(-1)
    with pytest.raises(ValueError, match="loss must"):
        perplexity(1000)
    assert perplexity(700) == pytest.approx(math.exp(700))
    with pytest.raises(ValueError, match="min_lr"):
        lr_at(5, 1e-3, 2, 10, min_lr=1e-2)


def test_windows_loss_checks_the_byte_lengths():
    m = small_gpt()
    x, y = make_windows(torch.arange(40) % 64, n_ctx=4, stride=4)
    with pytest.raises(ValueError, match="byte_lengths"):
        windows_loss(m, x, y, byte_lengths=[0] * 64)
    with pytest.raises(ValueError, match="byte_lengths"):
        windows_loss(m, x, y, byte_lengths=[-1] * 64)
    with pytest.raises(ValueError, match="byte_lengths"):
        windows_loss(m, x, y, byte_lengths=[1.5] * 64)


def test_generate_refuses_an_absurd_number_of_tokens():
    with pytest.raises(ValueError, match="max_new_tokens must be"):
        generate(small_gpt(), ids_of(2), max_new_tokens=2**40)


def test_playground_source_stays_under_static():
    from gptlib.widgets.playground import PlaygroundView

    with pytest.raises(ValueError, match="source must"):
        PlaygroundView(small_gpt(), TokenizerStub(), "ab", source="../../../x.json")


def test_stage_layers_names_its_own_parameters():
    with pytest.raises(ValueError, match="n_stages"):
        stage_layers(4, 0, 0)
    with pytest.raises(ValueError, match="stage"):
        stage_layers(4, 2, 2)


# --- the shared validators -----------------------------------------------------------------------
def test_the_shared_validators():
    check_targets(torch.tensor([[0, 4]]), 5)
    with pytest.raises(ValueError, match="ignore_index"):
        check_targets(torch.tensor([-100]), 5)
    check_finite("W", torch.ones(2))
    with pytest.raises(ValueError, match="W must be finite"):
        check_finite("W", torch.tensor([1.0, math.inf]))
    assert check_mask("mask", torch.tensor([1.0, 0.0]), (2,)).dtype == torch.bool
    with pytest.raises(ValueError, match=r"mask must have shape \(3,\)"):
        check_mask("mask", torch.tensor([True, False]), (3,))
    with pytest.raises(ValueError, match="mask must be boolean"):
        check_mask("mask", torch.tensor([2, 0]), (2,))


def test_an_additive_mask_is_not_a_boolean_one():
    from gptlib.attention import attention_pattern

    q = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="mask must be an additive float tensor"):
        attention_pattern(q, q, torch.ones(2, 2, dtype=torch.bool).tril())


def test_a_nan_score_makes_no_preference_pair():
    from gptlib.rlhf.objectives import preference_pairs

    with pytest.raises(ValueError, match="scores must be finite"):
        preference_pairs(torch.arange(3)[:, None], torch.tensor([[0.0, NAN, 1.0]]))
