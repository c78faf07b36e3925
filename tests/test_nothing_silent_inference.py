"""Nothing silent in the inference, quantization, LoRA, latent-attention and export code: finite
weights stay finite under quantization, NaN weights are named before they are used, every size,
id and probability is checked, and a file that could not be read back is never written.

Each test is one kind of defect that an audit of these modules found (a hostile user's inputs).
"""

import numpy as np
import pytest
import torch
from page_twins import TokenizerStub
from torch import nn

from gptlib import files
from gptlib.attention import non_finite_rows
from gptlib.export import to_onnx
from gptlib.gguf import q4_1_roundtrip
from gptlib.inference.decoding import BigramDraft, speculative_generate
from gptlib.inference.flash import tiled_attend, tiled_attention, use_tiled_attention
from gptlib.inference.quantize import (
    absmax_quantize,
    blockwise_quantize,
    error_bound,
    product_noise_variance,
    q4_1_pack,
    quantize_model,
    quantized_bytes,
)
from gptlib.inference.speculative import (
    accept_or_resample,
    acceptance_rate,
    residual_distribution,
    sequence_distribution,
    speculative_round,
)
from gptlib.lora import LoRA, attention_mlp_targets, lora_forward
from gptlib.mla import mla_model
from gptlib.model import GPT, GPTConfig
from gptlib.modern import ModernConfig, ModernGPT
from gptlib.sampling import generate
from gptlib.step import step, step_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=2)).eval()


def small_modern(seed: int = 0, **kw) -> ModernGPT:
    torch.manual_seed(seed)
    return ModernGPT(ModernConfig.preset("tiny", **kw)).eval()


def poisoned(model: nn.Module, name: str = "blocks.1.mlp.W_in") -> nn.Module:
    with torch.no_grad():
        dict(model.named_parameters())[name][0, 0] = float("nan")
    return model


# --- 1. quantization keeps finite weights finite ----------------------------------------------
def test_blockwise_refuses_a_block_whose_scale_float16_cannot_hold():
    with pytest.raises(ValueError, match="float16"):
        blockwise_quantize(torch.linspace(0, 1e6, 32), 4)
    with pytest.raises(ValueError, match="float16"):
        q4_1_pack(torch.linspace(0, 1e6, 32))
    with pytest.raises(ValueError, match="float16"):
        q4_1_roundtrip(torch.full((32,), 1e5))  # the minimum overflows float16


def test_quantizers_refuse_numbers_beyond_float32():
    with pytest.raises(ValueError, match="float32"):
        absmax_quantize(torch.tensor([1e300, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="float32"):
        blockwise_quantize(torch.full((32,), 1e300, dtype=torch.float64))


def test_quantizers_give_finite_values_for_any_finite_input_they_accept():
    g = torch.Generator().manual_seed(0)
    for scale in (1e-30, 1e-6, 1.0, 1e3, 1e4):
        x = torch.randn(4, 64, generator=g) * scale
        for r in (absmax_quantize(x, 8), blockwise_quantize(x, 4)):
            assert torch.isfinite(r.values).all()
        assert torch.isfinite(q4_1_roundtrip(x)).all()
    x16 = torch.tensor([-65504.0, 65504.0] * 16, dtype=torch.float16)
    for r in (absmax_quantize(x16, 8),):
        assert torch.isfinite(r.values).all()
    with pytest.raises(ValueError, match="float16|finite"):  # q 15 d + min rounds past 65504
        blockwise_quantize(x16, 4)


def test_q4_1_pack_takes_a_parameter():
    p = nn.Parameter(torch.randn(2, 32))
    assert q4_1_pack(p) == q4_1_pack(p.detach())


# --- 2. NaN weights are named, never passed on ---------------------------------------------------
def test_speculative_generate_refuses_nan_weights_at_temperature_0():
    target, draft = poisoned(small_gpt(0)), small_gpt(1)
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in"):
        speculative_generate(target, draft, torch.tensor([1, 2, 3]), 5, 2, temperature=0.0)
    with pytest.raises(ValueError, match="draft.*blocks.1.mlp.W_in"):
        speculative_generate(small_gpt(0), poisoned(small_gpt(1)), torch.tensor([1]), 5, 2)


def test_step_refuses_nan_weights():
    m = poisoned(small_gpt())
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in"):
        step(m, torch.tensor([[1, 2]]), *step_inputs(m))


# --- 3. the draft is checked against the target; the modes are restored -------------------------
def test_speculative_generate_checks_the_draft():
    target = small_gpt(0)
    other = GPT(GPTConfig(d_vocab=32, n_ctx=16, d_model=16, n_heads=2, n_layers=2))
    with pytest.raises(ValueError, match="d_vocab"):
        speculative_generate(target, other, torch.tensor([1, 2]), 4, 2)
    short = GPT(GPTConfig(d_vocab=64, n_ctx=4, d_model=16, n_heads=2, n_layers=2))
    with pytest.raises(ValueError, match="n_ctx"):
        speculative_generate(target, short, torch.tensor([1, 2]), 6, 2)
    with pytest.raises(ValueError, match="draft"):
        speculative_generate(target, nn.Linear(2, 2), torch.tensor([1, 2]), 4, 2)
    with pytest.raises(ValueError, match="target"):
        speculative_generate("gpt", target, torch.tensor([1, 2]), 4, 2)


def test_speculative_generate_refuses_a_draft_of_inf():
    draft = BigramDraft(torch.tensor([0, 1, 2, 3]), 64)
    draft.log_probs[1, 5] = float("inf")
    with pytest.raises(ValueError, match="draft"):
        speculative_generate(small_gpt(), draft, torch.tensor([1]), 4, 2)


def test_speculative_generate_restores_the_modes():
    target, draft = small_gpt(0).train(), small_gpt(1).train()
    speculative_generate(target, draft, torch.tensor([1, 2]), 4, 2)
    assert target.training and draft.training


def test_speculative_generate_takes_the_ids_generate_takes():
    target, draft = small_gpt(0), small_gpt(1)
    ids = torch.tensor([1, 2, 3], dtype=torch.int16)
    out = speculative_generate(target, draft, ids, 5, 2, temperature=0.0)
    assert torch.equal(out.ids, generate(target, ids.long(), 5, temperature=0.0))


# --- 4. the speculative primitives check what they are given ------------------------------------
def test_accept_or_resample_refuses_what_is_not_a_distribution():
    logits = torch.tensor([[2.0, -1.0]])
    q = torch.tensor([[0.5, 0.5]])
    with pytest.raises(ValueError, match="p must"):
        accept_or_resample(logits, q, torch.tensor([0]))
    with pytest.raises(ValueError, match="x must"):
        accept_or_resample(q, q, torch.tensor([2]))
    with pytest.raises(ValueError, match="x must"):
        accept_or_resample(q, q, torch.tensor([0.0]))


def test_residual_distribution_refuses_negative_probabilities():
    with pytest.raises(ValueError, match="p must"):
        residual_distribution(torch.tensor([-0.2, 1.2]), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="shape"):
        residual_distribution(torch.tensor([0.5, 0.5]), torch.tensor([1.0]))


def test_the_distribution_check_names_p_or_q_for_every_bad_entry():
    good = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    for bad in (float("nan"), float("inf"), -float("inf"), -0.1):
        row = torch.tensor([[bad, 0.5]])  # float32 beside float64: both checked
        with pytest.raises(ValueError, match="^p must"):
            acceptance_rate(row, good.float())
        with pytest.raises(ValueError, match="^q must"):
            accept_or_resample(good, row.double(), torch.tensor([0]))
    assert float(acceptance_rate(good, good.flip(-1))) == 0.5  # the two rows valid: no error


def test_speculative_round_checks_its_tokens():
    p = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="drafts must"):
        speculative_round(p, p[:1], torch.tensor([7]))


def test_sequence_distribution_refuses_a_wrong_width():
    with pytest.raises(ValueError, match="d_vocab"):
        sequence_distribution(lambda s: torch.tensor([0.2, 0.3, 0.5]), 2, 2)
    with pytest.raises(ValueError, match="n must"):
        sequence_distribution(lambda s: torch.tensor([0.5, 0.5]), 0, 2)


def test_bigram_draft_checks_its_ids():
    draft = BigramDraft(torch.tensor([0, 1, 2]), 3)
    with pytest.raises(ValueError, match="ids must"):
        draft(torch.tensor([[-1]]))
    with pytest.raises(ValueError, match="ids must"):
        BigramDraft(torch.tensor([], dtype=torch.long), 3)
    with pytest.raises(ValueError, match="ids must"):
        BigramDraft(torch.tensor([0.0, 1.0]), 3)


def test_speculative_generate_of_no_tokens_returns_the_prompt():
    out = speculative_generate(small_gpt(), small_gpt(1), torch.tensor([1, 2]), 0, 2)
    assert out.ids.tolist() == [1, 2] and out.passes == 0
    with pytest.raises(ValueError, match="ids must"):
        speculative_generate(small_gpt(), small_gpt(1), torch.tensor([], dtype=torch.long), 2, 2)


# --- 5. half-precision models: refused by name, not a dtype crash ---------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_step_and_to_onnx_name_a_half_precision_model(dtype):
    m = small_gpt().to(dtype)
    with pytest.raises(ValueError, match=str(dtype)):
        step(m, torch.tensor([[1]]), *step_inputs(m))
    with pytest.raises(ValueError, match=str(dtype)):
        to_onnx(m)


# --- 6. floats and bools are not ids ------------------------------------------------------------
def test_step_inputs_refuses_floats_and_bools():
    m = small_gpt()
    with pytest.raises(ValueError, match="lens"):
        step_inputs(m, lens=[0.9])
    with pytest.raises(ValueError, match="targets"):
        step_inputs(m, targets=[True, 2])
    with pytest.raises(ValueError, match="targets"):
        step_inputs(m, targets=[64])
    with pytest.raises(ValueError, match="P must"):
        step_inputs(m, P=-1)
    assert step_inputs(m, lens=[np.int64(1)], targets=[np.int32(3)])[2].tolist() == [1]


# --- 7. sizes and numbers -----------------------------------------------------------------------
def test_quantized_bytes_checks_its_sizes():
    for args, name in (
        ((-10, 1, "absmax", 8), "numel"),
        ((10, -1, "absmax", 8), "rows"),
        ((10, 1, "absmax", 0), "bits"),
        ((64, 1, "blockwise", 4, 0), "block"),
        ((10, 1, "absmax", 2.5), "bits"),
    ):
        with pytest.raises(ValueError, match=name):
            quantized_bytes(*args)


def test_error_bound_and_noise_check_their_arguments():
    r = blockwise_quantize(torch.randn(64), 4)
    with pytest.raises(ValueError, match="bits"):
        error_bound(r, -3, True)
    with pytest.raises(ValueError, match="blockwise"):
        error_bound(r, 4, "yes")
    with pytest.raises(ValueError, match="r must"):
        error_bound(torch.zeros(3), 4, True)
    with pytest.raises(ValueError, match="step"):
        product_noise_variance(torch.ones(1, 2), torch.tensor([[float("nan")], [1.0]]))


def test_absmax_refuses_an_empty_row():
    with pytest.raises(ValueError, match="x"):
        absmax_quantize(torch.zeros(3, 0))


def test_lora_forward_refuses_a_nan_scale():
    W, A, B = torch.eye(2), torch.ones(2, 1), torch.ones(1, 2)
    with pytest.raises(ValueError, match="scale"):
        lora_forward(torch.ones(1, 2), W, A, B, float("nan"))


def test_tiled_attend_refuses_zero_kv_heads_and_bad_groups():
    q = torch.zeros(1, 4, 3, 2)
    with pytest.raises(ValueError, match="head"):
        tiled_attend(q, torch.zeros(1, 0, 3, 2), torch.zeros(1, 0, 3, 2))
    with pytest.raises(ValueError, match="head"):
        tiled_attend(q, torch.zeros(1, 3, 3, 2), torch.zeros(1, 3, 3, 2))


def test_d_head_of_zero_is_refused_by_mla():
    from gptlib.mla import MultiHeadLatentAttention

    with pytest.raises(ValueError, match="d_head"):
        MultiHeadLatentAttention(16, 2, 0, 4, 2)


# --- 8. tiled attention takes attend's arguments and no others ----------------------------------
def test_tiled_attend_refuses_unknown_and_non_bool_arguments():
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(TypeError, match="casual"):
        tiled_attend(q, k, v, casual=False)
    with pytest.raises(ValueError, match="causal"):
        tiled_attend(q, k, v, causal="no")
    with pytest.raises(ValueError, match="causal"):
        tiled_attention(q, k, v, 2, 2, causal="no")


def test_attention_patterns_under_tiled_attention_is_a_clear_error():
    from gptlib.hooks import capture_patterns

    m = small_gpt()
    with use_tiled_attention(2, 2), pytest.raises(ValueError, match="tiled"):
        with capture_patterns(m):
            m(torch.tensor([[1, 2, 3]]))


def test_use_tiled_attention_covers_latent_attention_and_patches_no_module():
    from gptlib import attention, mla, modern

    torch.manual_seed(0)
    m = mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    before = attention.attend, modern.attend, mla.attend
    with torch.no_grad():
        ref = m(ids)
        with use_tiled_attention(2, 2) as tiled:
            assert (attention.attend, modern.attend, mla.attend) == before
            out = m(ids)
    assert tiled.traffic.total > 0  # the latent layers went through the tiled kernel
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# --- 9. save() checks before it replaces a good file -------------------------------------------
def test_save_keeps_a_good_file_when_the_new_weights_are_nan(tmp_path):
    m = small_gpt()
    path = m.save(tmp_path / "m.safetensors")
    good = path.read_bytes()
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in"):
        poisoned(m).save(path)
    assert path.read_bytes() == good


def test_save_refuses_models_no_loader_reads(tmp_path):
    lora = LoRA(small_gpt(), ["blocks.0.attn.W_Q"], r=2, alpha=2.0)
    with pytest.raises(ValueError, match="merged"):
        files.save_model(lora, tmp_path / "lora.safetensors")
    m = mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4)
    with pytest.raises(ValueError, match="W_DKV|latent"):
        m.save(tmp_path / "mla.safetensors")
    assert not list(tmp_path.iterdir())


def test_save_refuses_a_meta_model(tmp_path):
    with torch.device("meta"):
        m = GPT(GPTConfig.preset("tiny"))
    with pytest.raises(ValueError, match="meta"):
        m.save(tmp_path / "m.safetensors")


# --- 10. a broken chat template is a clear error ------------------------------------------------
def test_chat_frame_names_a_broken_template():
    from gptlib.export import chat_frame

    class Tok:
        chat_template = "{% for m in messages %}"
        special_tokens = None
        eos_id = None

        def apply_chat_template(self, messages):
            import jinja2

            return jinja2.Template(self.chat_template).render(messages=messages)

    with pytest.raises(ValueError, match="chat template"):
        chat_frame(Tok())


# --- minor: LoRA, MLA, meta device, quantize_model naming the weight -----------------------------
def test_lora_does_not_freeze_the_callers_model_and_merged_is_trainable():
    base = small_gpt()
    lora = LoRA(base, ["blocks.0.attn.W_Q"], r=2, alpha=2.0)
    assert all(p.requires_grad for p in base.parameters())  # the caller's model as it was
    ids = torch.tensor([[1, 2, 3]])
    lora(ids).sum().backward()
    assert all(p.grad is None for p in base.parameters())  # frozen inside the LoRA all the same
    assert all(p.grad is not None for p in lora.trained_parameters())
    assert lora.num_parameters() == (16 + 16) * 2
    merged = lora.merged()
    assert all(p.requires_grad for p in merged.parameters())
    torch.testing.assert_close(merged(ids), lora(ids))


def test_attention_mlp_targets_of_a_modern_gpt_exist():
    m = small_modern()
    names = attention_mlp_targets(m)
    params = dict(m.named_parameters())
    assert names and all(n in params and params[n].dim() == 2 for n in names)
    LoRA(m, names, r=2, alpha=2.0)  # every target accepted
    with pytest.raises(ValueError, match="model"):
        attention_mlp_targets(nn.Linear(2, 2))


def test_mla_models_generate_without_a_cache_argument():
    torch.manual_seed(0)
    m = mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4).eval()
    ids = torch.tensor([1, 2, 3])
    out = generate(m, ids, 4, temperature=0.0)
    assert torch.equal(out, generate(m, ids, 4, temperature=0.0, use_cache=False))
    spec = speculative_generate(m, m, ids, 4, 2, temperature=0.0)
    assert torch.equal(spec.ids, out)
    with pytest.raises(ValueError, match="latent"):
        step(m, torch.tensor([[1]]), *step_inputs(m))


def test_quantize_model_names_the_weight():
    m = poisoned(small_gpt())
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in"):
        quantize_model(m, "blockwise", 4, block=16)


def test_meta_models_are_refused_by_name():
    with torch.device("meta"):
        m = GPT(GPTConfig.preset("tiny"))
    with pytest.raises(ValueError, match="meta"):
        generate(m, torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="meta"):
        quantize_model(m, "absmax", 8)


def test_non_finite_rows_does_not_overflow_in_float16():
    q = torch.full((1, 2, 3, 64), 60000.0, dtype=torch.float16)
    k = torch.full((1, 2, 3, 64), 60000.0, dtype=torch.float16)
    assert torch.equal(non_finite_rows(q, k), torch.zeros(1, 3, 1, dtype=torch.float16))
    q[0, 1, 2, 5] = float("nan")
    assert non_finite_rows(q, k).isnan().flatten().tolist() == [False, False, True]


def test_playground_refuses_what_sampling_view_refuses():
    from gptlib.widgets.playground import PlaygroundView

    with pytest.raises(ValueError, match="top_k"):
        PlaygroundView(small_gpt(), TokenizerStub(), "ab", top_k=10**6)
    with pytest.raises(ValueError, match="torch.float16"):
        PlaygroundView(small_gpt().half(), TokenizerStub(), "ab")
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in"):
        PlaygroundView(poisoned(small_gpt()), TokenizerStub(), "ab")


# --- found by the adversarial pass over these modules -------------------------------------------
def test_tiled_and_standard_attention_refuse_mixed_dtypes_zero_width_and_a_bad_counter():
    from gptlib.inference.flash import Traffic, online_softmax_update, standard_attention

    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="dtype"):
        tiled_attention(q.double(), q, q, 2, 2)
    with pytest.raises(ValueError, match="dtype"):
        tiled_attention(q.long(), q.long(), q.long(), 2, 2)
    with pytest.raises(ValueError, match="d >= 1"):
        standard_attention(q[..., :0], q[..., :0], q)
    with pytest.raises(ValueError, match="traffic"):
        tiled_attention(q, q, q, 2, 2, traffic=3)
    with pytest.raises(ValueError, match="T_b"):
        online_softmax_update(None, torch.zeros(2, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="tensors"):
        Traffic().read([1, 2])


def test_speculative_primitives_take_half_precision_and_no_drafts():
    from gptlib.inference.speculative import chi_square_power

    p, q = torch.tensor([0.3, 0.7]).half(), torch.tensor([0.5, 0.5]).half()
    assert residual_distribution(p, q).tolist() == [0.0, 1.0]
    kept, tokens = accept_or_resample(q.float(), q.float(), torch.zeros(0, dtype=torch.long))
    assert kept.shape == tokens.shape == (0,)
    assert chi_square_power(1e300, 3)[1] == 1.0  # no overflow: the power of a huge effect is 1


def test_minor_checks_of_the_export_and_runtime():
    from gptlib.export import pieces, weights_sha256
    from gptlib.mla import absorbed_weights
    from gptlib.runtime import check_ids, seed_everything

    with pytest.raises(ValueError, match="data must be bytes"):
        pieces("abc")
    with torch.device("meta"):
        m = GPT(GPTConfig.preset("tiny"))
    with pytest.raises(ValueError, match="meta"):
        weights_sha256(m)
    with pytest.raises(ValueError, match="attn must be"):
        absorbed_weights(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="sequence of ints"):
        check_ids({0: 1}, 3)
    assert isinstance(seed_everything(np.int64(3)), torch.Generator)


# --- minor: a meta model called on real ids; NumPy integers as sizes ----------------------------
@pytest.mark.parametrize(
    "build",
    [
        lambda: GPT(GPTConfig.preset("tiny")),
        lambda: ModernGPT(ModernConfig.preset("tiny")),
        lambda: mla_model(ModernConfig.preset("tiny"), d_c=8, d_R=4),
    ],
    ids=["gpt", "modern", "mla"],
)
def test_a_meta_model_refuses_real_ids_and_propagates_meta_ids(build):
    with torch.device("meta"):
        m = build()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="weights are on the meta device"):
        m(ids)
    assert m(ids.to("meta")).shape == (1, 3, m.config.d_vocab)  # shapes without values
    if isinstance(m, GPT):
        with pytest.raises(ValueError, match="weights are on the meta device"):
            m.hidden_states(ids)


def test_numpy_integers_are_sizes_and_configs_store_python_ints(tmp_path):
    from gptlib.runtime import check_ids, check_positive_int

    assert check_positive_int("d_model", 8) == 8
    out = check_positive_int("d_model", np.int64(8))
    assert out == 8 and type(out) is int
    for bad in (np.bool_(True), True, 2.0, np.float64(2.0), np.int64(0)):
        with pytest.raises(ValueError, match="d_model"):
            check_positive_int("d_model", bad)
    c = GPTConfig(
        d_vocab=np.int64(64), n_ctx=np.int32(16), d_model=np.int64(16), n_heads=np.int64(2),
        n_layers=np.int64(1), d_mlp=np.int64(32),
    )  # fmt: skip
    fields = ("d_vocab", "n_ctx", "d_model", "n_heads", "n_layers", "d_mlp", "d_head")
    assert all(type(getattr(c, f)) is int for f in fields)
    assert c == GPTConfig(d_vocab=64, n_ctx=16, d_model=16, n_heads=2, n_layers=1, d_mlp=32)
    m = GPT(c)
    assert torch.equal(GPT.load(m.save(tmp_path / "np.safetensors")).embed.W_E, m.embed.W_E)
    mc = ModernConfig.preset("tiny", d_model=np.int64(32), n_kv_heads=np.int64(2))
    assert type(mc.d_model) is int and type(mc.n_kv_heads) is int and type(mc.d_head) is int
    mm = ModernGPT(mc)
    assert torch.equal(ModernGPT.load(mm.save(tmp_path / "m.safetensors")).W_E, mm.W_E)
    with pytest.raises(ValueError, match="d_model"):
        GPTConfig(d_model=np.bool_(True))
    # check_ids as before: NumPy integer ids are accepted, NumPy bools and floats are not
    check_ids([np.int64(1), np.int32(2)], 3)
    for bad in ([np.bool_(True)], [np.float32(1.0)]):
        with pytest.raises(ValueError, match="ids"):
            check_ids(bad, 3)
