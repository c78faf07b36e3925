"""gptlib.model: config, forward, parameter count, HF parity (gptlib.hf), files (gptlib.files)."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlib.embedding import skip_init
from gptlib.files import config_from_dict, read_file, write_file
from gptlib.hf import from_hf, from_pretrained
from gptlib.hooks import capture_patterns
from gptlib.kvcache import KVCache
from gptlib.model import GPT, PRESETS, GPTConfig
from gptlib.state import load_state_checked, tied_aliases

ROOT = Path(__file__).resolve().parents[1]


def hf_model(seed=0, **kw):
    """A seeded Hugging Face GPT-2 of a few tiny layers (``kw`` go to its config), in eval mode:
    the peer. transformers is imported here, where a test uses it, so that collecting the module
    (in every pytest-xdist worker) does not import it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=200,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    cfg.update(kw)
    return GPT2LMHeadModel(GPT2Config(**cfg)).eval()


def test_config_derived_values_and_errors():
    c = GPTConfig.preset("gpt2")
    assert (c.d_head, c.d_mlp) == (64, 3072)
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="d_vocab"):
        GPTConfig(d_vocab=0)
    with pytest.raises(ValueError, match="positional"):
        GPTConfig(positional="rotary")
    with pytest.raises(ValueError, match="name"):
        GPTConfig.preset("gpt5")
    with pytest.raises(ValueError, match=r"unknown entries \['colour'\]"):
        config_from_dict(GPTConfig, {"d_vocab": 10, "colour": "red"})
    assert config_from_dict(GPTConfig, c.to_dict()) == c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 5  # frozen


def test_gpt2_parameter_count_and_presets():
    with torch.device("meta"):
        assert GPT(GPTConfig.preset("gpt2")).num_parameters() == 124_439_808
        assert (
            GPT(GPTConfig.preset("gpt2", tie_weights=False)).num_parameters()
            == 124_439_808 + 50257 * 768
        )
        assert GPT(GPTConfig.preset("gpt2-medium")).num_parameters() == 354_823_168
    assert set(PRESETS) >= {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b"}


def test_forward_shapes_and_errors():
    m = GPT(GPTConfig.preset("tiny")).eval()
    ids = torch.randint(0, 512, (3, 10))
    assert m(ids).shape == (3, 10, 512)
    pats = m.attention_patterns(ids)
    assert pats.shape == (3, 2, 4, 10, 10) and all(blk.attn.fused for blk in m.blocks)
    assert m.hidden_states(ids).shape == (3, 10, 64)
    with pytest.raises(ValueError, match="n_ctx"):
        m(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        m(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="int64"):
        m(torch.zeros(1, 5))


def test_cache_forward_equals_full_forward():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    ids = torch.randint(0, 512, (2, 20))
    with torch.no_grad():
        full = m(ids)
        cache = KVCache(2)
        parts = [m(ids[:, :7], cache=cache)] + [
            m(ids[:, t : t + 1], cache=cache) for t in range(7, 20)
        ]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cache"):
        m(ids, cache=KVCache(3))


def test_from_hf_logits_parity():
    hf = hf_model()
    ours = from_hf(hf).eval()
    ids = torch.randint(0, 200, (2, 32))
    with torch.no_grad():
        assert float((hf(ids).logits - ours(ids)).abs().max()) <= 1e-4
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_from_hf_untied_and_gelu_variants():
    hf = hf_model(seed=1, tie_word_embeddings=False, activation_function="gelu")
    with torch.no_grad():
        hf.lm_head.weight.normal_()
    ours = from_hf(hf).eval()
    assert not ours.config.tie_weights and ours.config.activation == "gelu"
    ids = torch.randint(0, 200, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="activation_function"):
        from_hf(hf_model(activation_function="silu"))


def test_from_pretrained_directory_and_errors(tmp_path):
    hf = hf_model(seed=2)
    hf.save_pretrained(tmp_path / "m")
    ours = from_pretrained(tmp_path / "m").eval()
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    # a pytorch_model.bin (loaded with weights_only=True) works too
    (tmp_path / "bin").mkdir()
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    with torch.no_grad():
        torch.testing.assert_close(
            from_pretrained(tmp_path / "bin").eval()(ids), hf(ids).logits, atol=1e-4, rtol=1e-4
        )
    # errors name what is wrong
    with pytest.raises(FileNotFoundError):
        from_pretrained(tmp_path / "missing")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="model.safetensors"):
        from_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "bin" / "config.json").read_text())
    cfg["n_embd"] = 48
    (tmp_path / "bin" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="c_attn.weight|shape|n_heads"):
        from_pretrained(tmp_path / "bin")


def test_save_load_round_trip_and_mismatch(tmp_path):
    m = GPT(GPTConfig.preset("tiny"))
    path = m.save(tmp_path / "a")
    assert path == tmp_path / "a" / "model.safetensors" and os.listdir(tmp_path / "a") == [
        "model.safetensors"
    ]
    m2 = GPT.load(tmp_path / "a")
    assert m2.config == m.config
    for (k, v), (k2, v2) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    # a .safetensors path is the file itself; identical bytes when saved twice
    assert m.save(tmp_path / "b.safetensors").read_bytes() == path.read_bytes()
    assert torch.equal(GPT.load(tmp_path / "b.safetensors").W_E, m.W_E)
    with pytest.raises(ValueError, match="path must be a .safetensors file or a directory"):
        m.save(tmp_path / "model.pt")
    # a file whose config does not fit its tensors names the tensor
    tensors, fields = read_file(path)
    write_file(
        tmp_path / "c.safetensors",
        tensors,
        {**fields, "config": {**fields["config"], "d_model": 32, "d_head": 8}},
    )
    with pytest.raises(ValueError, match="c.safetensors: tensor '[^']+' has shape"):
        GPT.load(tmp_path / "c.safetensors")
    write_file(
        tmp_path / "d.safetensors",
        tensors,
        {**fields, "config": {**fields["config"], "colour": "red"}},
    )
    with pytest.raises(
        ValueError, match="d.safetensors: field 'config' has unknown entries \\['colour'\\]"
    ):
        GPT.load(tmp_path / "d.safetensors")
    write_file(tmp_path / "e.safetensors", tensors, {**fields, "model": "ModernGPT"})
    with pytest.raises(ValueError, match="e.safetensors: field 'model' is 'ModernGPT', not 'GPT'"):
        GPT.load(tmp_path / "e.safetensors")
    with pytest.raises(FileNotFoundError, match="missing"):
        GPT.load(tmp_path / "missing")


def test_a_crash_during_save_leaves_the_old_model_or_the_new_one_whole(tmp_path, monkeypatch):
    """Issue 24.1: no crash during a save can pair new weights with an old config (here the
    models differ in activation only, so the shapes cannot tell)."""
    torch.manual_seed(0)
    old, new = GPT(GPTConfig.preset("tiny")), GPT(GPTConfig.preset("tiny", activation="relu"))
    ids = torch.randint(0, 512, (1, 12))
    real_replace = os.replace

    class Crash(BaseException):
        pass

    for renames_before_crash in range(3):
        directory = tmp_path / f"m{renames_before_crash}"
        old.save(directory)
        done = []

        def crashing_replace(src, dst):
            if len(done) == renames_before_crash:
                raise Crash
            done.append(dst)
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", crashing_replace)
        try:
            new.save(directory)
        except Crash:
            pass
        monkeypatch.setattr(os, "replace", real_replace)
        loaded = GPT.load(directory).eval()
        whole = old if loaded.config == old.config else new
        assert loaded.config == whole.config
        with torch.no_grad():
            assert torch.equal(loaded(ids), whole.eval()(ids)), (
                f"crash after {renames_before_crash} renames"
            )


def test_load_refuses_a_dtype_other_than_a_float_width(tmp_path):
    """Issue 24.12: an int32 tensor is never cast silently into a float weight."""
    m = GPT(GPTConfig.preset("tiny"))
    tensors, fields = read_file(m.save(tmp_path / "m"))
    for dtype in (torch.float16, torch.bfloat16, torch.float64):  # the widths the format allows
        ok = {**tensors, "ln_f.w": tensors["ln_f.w"].to(dtype)}
        write_file(tmp_path / "ok.safetensors", ok, fields)
        assert torch.equal(
            GPT.load(tmp_path / "ok.safetensors").ln_f.w, tensors["ln_f.w"].to(dtype).float()
        )
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        bad = {**tensors, "ln_f.w": tensors["ln_f.w"].to(dtype)}
        write_file(tmp_path / "bad.safetensors", bad, fields)
        with pytest.raises(ValueError, match=f"tensor 'ln_f.w' has dtype {dtype}"):
            GPT.load(tmp_path / "bad.safetensors")


def test_a_changed_or_damaged_file_is_refused_naming_it(tmp_path):
    m = GPT(GPTConfig.preset("tiny"))
    path = m.save(tmp_path / "m")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # one bit of the last weight
    (tmp_path / "flip.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="flip.safetensors: field 'sha256' does not match"):
        GPT.load(tmp_path / "flip.safetensors")
    (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="cut.safetensors is not a valid safetensors file"):
        GPT.load(tmp_path / "cut.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="foreign.safetensors is not a gptlib file"):
        GPT.load(tmp_path / "foreign.safetensors")


def test_save_in_fp16_halves_the_file_and_loads_the_rounded_weights(tmp_path):
    from safetensors.torch import load_file

    m = GPT(GPTConfig.preset("tiny"))
    m.save(tmp_path / "f32")
    m.save(tmp_path / "f16", dtype=torch.float16)
    m.save(tmp_path / "bf16", dtype=torch.bfloat16)
    assert all(
        v.dtype == torch.bfloat16
        for v in read_file(tmp_path / "bf16" / "model.safetensors")[0].values()
    )
    stored = load_file(str(tmp_path / "f16" / "model.safetensors"))
    assert all(v.dtype == torch.float16 for v in stored.values() if v.is_floating_point())
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("f32", "f16")}
    assert size["f16"] < 0.51 * size["f32"]
    m2 = GPT.load(tmp_path / "f16")
    for (k, v), v2 in zip(m.state_dict().items(), m2.state_dict().values()):
        assert v2.dtype == v.dtype, k  # loaded back into the model's fp32
        assert torch.equal(v2, v.half().float()), k  # exactly the fp16 rounding of each weight
    with pytest.raises(ValueError, match="dtype"):
        m.save(tmp_path / "bad", dtype=torch.int8)
    with torch.no_grad():
        m.embed.W_E[0, 0] = 1e6  # beyond fp16's largest finite value, 65504
    with pytest.raises(ValueError, match="embed.W_E.*float16"):
        m.save(tmp_path / "big", dtype=torch.float16)


def test_tied_weights_are_shared_saved_once_and_restored(tmp_path):
    from safetensors.torch import load_file

    m = GPT(GPTConfig.preset("tiny"))
    assert m.unembed.W_E is m.embed.W_E and tied_aliases(m) == {"unembed.W_E": "embed.W_E"}
    m.save(tmp_path / "t")
    stored = load_file(str(tmp_path / "t" / "model.safetensors"))
    assert "embed.W_E" in stored and not any(k.startswith("unembed.") for k in stored)
    m2 = GPT.load(tmp_path / "t")
    assert m2.unembed.W_E is m2.embed.W_E and torch.equal(m2.W_U, m.W_U)
    untied = GPT(GPTConfig.preset("tiny", tie_weights=False))
    assert "unembed.W_U" in untied.state_dict() and tied_aliases(untied) == {}
    untied.save(tmp_path / "u")
    assert torch.equal(GPT.load(tmp_path / "u").W_U, untied.W_U)
    bad = dict(m.state_dict())
    bad["unembed.W_E"] = bad["embed.W_E"] + 1
    with pytest.raises(ValueError, match="ties"):
        load_state_checked(GPT(GPTConfig.preset("tiny")), bad)


@pytest.mark.parametrize("name, dtype", [("small", None), ("english", torch.float16)])
def test_shipped_models_load_bit_identically_and_save_as_shipped(name, dtype, tmp_path):
    from safetensors.torch import load_file

    shipped = ROOT / "models" / name / "model.safetensors"
    stored = load_file(str(shipped))
    m = GPT.load(shipped.parent)
    state = m.state_dict()
    assert all(torch.equal(state[k], v.float()) for k, v in stored.items())
    assert set(state) - set(stored) == {"unembed.W_E"} and m.unembed.W_E is m.embed.W_E
    assert not (shipped.parent / "config.json").exists()  # the config is inside the file
    saved = m.save(tmp_path, dtype=dtype).read_bytes()
    # its converted file is exactly what GPT.save writes (the small one's config predates
    # attn_only)
    if name == "english":
        assert saved == shipped.read_bytes()


@pytest.mark.slow
def test_preset_counts_equal_the_formula_and_hf():
    from transformers import GPT2Config, GPT2LMHeadModel

    known = {
        "gpt2": 124_439_808,
        "gpt2-medium": 354_823_168,
        "gpt2-large": 774_030_080,
        "gpt2-xl": 1_557_611_200,
    }
    for name, c in PRESETS.items():
        d, d_a, m = c.d_model, c.n_heads * c.d_head, c.d_mlp
        block = 4 * d * d_a + 3 * d_a + d + 2 * d * m + m + d + 4 * d
        with torch.device("meta"):
            n = GPT(c).num_parameters()
        assert n == c.n_layers * block + c.d_vocab * d + c.n_ctx * d + 2 * d, name
        if name in known:
            assert n == known[name], name
    with torch.device("meta"):  # shapes only: no weights are drawn
        hf = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16))
        assert hf.num_parameters() == known["gpt2-medium"]
        gpt2 = GPT(GPTConfig.preset("gpt2"))
    assert gpt2.num_parameters(exclude_positional=True) == 124_439_808 - 1024 * 768


def test_attention_patterns_equal_block_by_block():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        pats = m.attention_patterns(ids)
        x = m.embed(ids) + m.pos(9, 0)
        for layer, blk in enumerate(m.blocks):
            with capture_patterns(blk.attn) as seen:
                blk.attn(blk.ln_1(x))
            torch.testing.assert_close(pats[:, layer], seen[0])
            x = blk(x)
        torch.testing.assert_close(m.ln_f(x) @ m.W_U, m(ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pats.sum(-1), torch.ones(2, 2, 4, 9))
    assert torch.all(pats.triu(1) == 0)


def test_from_pretrained_hub_layout_via_a_fake_hub(tmp_path, monkeypatch):
    """The Hub's gpt2 checkpoint has no "transformer." prefix, keeps attn.bias buffers, lacks
    lm_head."""
    import huggingface_hub
    from safetensors.torch import save_file

    hf = hf_model(seed=3)
    hub = tmp_path / "hub"
    hub.mkdir()
    state = {k: v.contiguous() for k, v in hf.transformer.state_dict().items()}
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32))
    save_file(state, str(hub / "model.safetensors"))
    hf.config.to_json_file(str(hub / "config.json"))
    calls = []

    def fake_download(repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(hub / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    ours = from_pretrained("someone/gpt2-like").eval()
    assert calls == [
        ("someone/gpt2-like", "config.json"),
        ("someone/gpt2-like", "model.safetensors"),
    ]
    ids = torch.randint(0, 200, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)

    def offline(repo_id, filename, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(OSError, match="Hugging Face Hub.*local directory"):
        from_pretrained("gpt2")


def test_from_hf_errors_name_the_problem(tmp_path):
    hf = hf_model(seed=4)
    hf.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    for key, value, match in [
        ("n_layer", None, "n_layer"),
        ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx"),
        ("n_layer", 3, "h.2.attn.c_attn.weight"),
    ]:
        bad = dict(cfg)
        if value is None:
            del bad[key]
        else:
            bad[key] = value
        (tmp_path / "m" / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path / "m")
    # a checkpoint with an extra tensor is refused, naming it
    sd = hf.state_dict()
    sd["transformer.h.0.extra"] = torch.zeros(3)

    class Fake:
        config = hf.config

        def state_dict(self):
            return sd

    with pytest.raises(ValueError, match="h.0.extra"):
        from_hf(Fake())


def test_model_deepcopy_is_independent():
    import copy

    m = GPT(GPTConfig.preset("tiny")).eval()
    m2 = copy.deepcopy(m)
    ids = torch.randint(0, 512, (1, 8))
    with torch.no_grad():
        assert torch.equal(m(ids), m2(ids))
        m2.W_E.add_(1.0)
        assert not torch.equal(m(ids), m2(ids))
        assert (
            m2.unembed.W_U.data_ptr() == m2.W_E.data_ptr()
        )  # the copy's W_U is tied to the copy's W_E


# --- every float of a config finite and in range --------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("ln_eps", float("nan")),
        ("ln_eps", float("inf")),
        ("ln_eps", -1e-5),
        ("dropout", float("nan")),
        ("dropout", float("-inf")),
        ("dropout", 1.0),
    ],
)
def test_config_floats_must_be_finite_and_in_range(field, value):
    with pytest.raises(ValueError, match=field):
        GPTConfig.preset("tiny", **{field: value})
    with pytest.raises(ValueError, match=field):  # as read from a config.json
        config_from_dict(GPTConfig, {**GPTConfig.preset("tiny").to_dict(), field: value})


def test_config_from_hf_refuses_a_non_finite_layer_norm_epsilon():
    with pytest.raises(ValueError, match="layer_norm_epsilon must be a finite number"):
        from_hf(hf_model(layer_norm_epsilon=float("nan")))


@pytest.mark.parametrize(
    "field, value",
    [
        ("d_model", True),
        ("d_model", 64.0),
        ("bias", 1),
        ("tie_weights", "yes"),
        ("attn_only", None),
        ("positional", ["learned"]),
        ("activation", None),
    ],
)
def test_config_refuses_values_of_the_wrong_type(field, value):
    with pytest.raises(ValueError, match=field):
        GPTConfig.preset("tiny", **{field: value})


def test_hf_parity_at_perturbed_weights_fails_on_small_slips():
    """At HF's initialisation (std 0.02, zero biases) every block is nearly the identity, so
    parity there cannot see a GELU swap or a dropped bias. At weights perturbed by 0.2 N(0, 1)
    gptlib still equals HF to 1e-4, and each slip (exact GELU, scores / sqrt(d_model), b_in
    dropped), made in every block, misses by more than ten times that."""
    import copy
    import math

    hf = hf_model(seed=3, n_layer=3, n_embd=64, n_positions=64)
    ids = torch.randint(0, 200, (2, 64), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
        ours = from_hf(hf).eval()
        y_hf = hf(ids).logits
        assert float((y_hf - ours(ids)).abs().max()) <= 1e-4
        gelu, scale, no_bias = (copy.deepcopy(ours) for _ in range(3))
        ratio = math.sqrt(ours.config.d_head / ours.config.d_model)
        for b_gelu, b_scale, b_bias in zip(gelu.blocks, scale.blocks, no_bias.blocks):
            b_gelu.mlp.activation = "gelu"
            b_scale.attn.W_Q.mul_(ratio)
            b_scale.attn.b_Q.mul_(ratio)
            b_bias.mlp.b_in.zero_()
        for slipped in (gelu, scale, no_bias):
            assert float((y_hf - slipped(ids)).abs().max()) > 1e-3


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_weights": False, "positional": "sinusoidal", "block": "post_ln"},
        {"attn_only": True, "bias": False},
    ],
)
def test_gpt_draws_its_initial_weights_in_the_documented_order(overrides):
    """Issue 41: the guarded initialisation draws what nn.init.normal_ drew, call for call: W_E,
    W_pos, then per block W_Q, W_K, W_V, W_O, W_in, W_out (an attention-only block draws its MLP
    too, then drops it), then an untied W_U, then W_O and W_out of each block again with std
    0.02 / sqrt(2 n_layers). Bit for bit, and the generator ends where it ended."""
    c = GPTConfig(d_vocab=37, n_ctx=8, d_model=16, n_heads=2, n_layers=3, **overrides)
    torch.manual_seed(5)
    model = GPT(c)
    after = torch.rand(4)
    torch.manual_seed(5)

    def draw(*shape, std=0.02):
        return torch.empty(*shape).normal_(0.0, std)

    want = {"embed.W_E": draw(c.d_vocab, c.d_model)}
    if c.positional == "learned":
        want["pos.W_pos"] = draw(c.n_ctx, c.d_model, std=0.01)
    for i in range(c.n_layers):
        for name in ("W_Q", "W_K", "W_V"):
            want[f"blocks.{i}.attn.{name}"] = draw(c.d_model, c.d_model)
        draw(c.d_model, c.d_model)  # W_O, drawn again below
        mlp = [draw(c.d_model, c.d_mlp), draw(c.d_mlp, c.d_model)]  # W_out drawn again below
        if not c.attn_only:
            want[f"blocks.{i}.mlp.W_in"] = mlp[0]
    if not c.tie_weights:
        want["unembed.W_U"] = draw(c.d_model, c.d_vocab)
    std = 0.02 / math.sqrt(2 * c.n_layers)
    for i in range(c.n_layers):
        want[f"blocks.{i}.attn.W_O"] = draw(c.d_model, c.d_model, std=std)
        if not c.attn_only:
            want[f"blocks.{i}.mlp.W_out"] = draw(c.d_mlp, c.d_model, std=std)
    assert torch.equal(torch.rand(4), after)
    state = model.state_dict()
    for k, v in want.items():
        assert torch.equal(state[k], v), k
    assert {k for k in state if ".W_" in k} - set(tied_aliases(model)) == set(want)


def test_a_model_built_on_the_meta_device_imports_no_dynamo():
    """Issue 41: any random or arithmetic op on a meta tensor imports torch._dynamo (about 2 s of
    CPU once per process); GPT, its layers and check_savable build on meta without one."""
    code = (
        "import sys, torch\n"
        "from gptlib.files import check_savable\n"
        "from gptlib.model import GPT, GPTConfig\n"
        "from gptlib.moe import MoE\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "check_savable(GPT(GPTConfig.preset('tiny', tie_weights=False)))\n"
        "with torch.device('meta'):\n"
        "    m = GPT(GPTConfig.preset('gpt2', tie_weights=False)); MoE(16, 32, 4)\n"
        "    s = GPT(GPTConfig.preset('tiny', positional='sinusoidal'))\n"
        "assert m.W_E.is_meta and m.blocks[0].mlp.W_out.is_meta\n"
        "assert s.pos.PE.is_meta and tuple(s.pos.PE.shape) == (s.config.n_ctx, s.config.d_model)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_load_draws_no_initial_weights_and_still_names_a_bad_file(tmp_path):
    """Issue 41: GPT.load builds its model without random initial weights (skip_init), so the
    global generator is left as it was; the loaded weights and a bad file's error are as
    before."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", tie_weights=False, positional="sinusoidal"))
    path = m.save(tmp_path / "m")
    state = torch.random.get_rng_state()
    loaded = GPT.load(path)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (k, v), (k2, v2) in zip(m.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert torch.equal(loaded.pos.PE, m.pos.PE)  # the buffer that no file holds
    tensors, fields = read_file(path)
    del tensors["blocks.1.mlp.W_out"]
    write_file(tmp_path / "short.safetensors", tensors, fields)
    with pytest.raises(ValueError, match=r"short.safetensors lacks tensor\(s\) \['blocks.1.mlp"):
        GPT.load(tmp_path / "short.safetensors")
    # skip_init ends with its block, even when the block raises
    with pytest.raises(ValueError), skip_init():
        GPT.load(tmp_path / "short.safetensors")
    torch.manual_seed(0)
    assert torch.equal(GPT(m.config).W_E, m.W_E)
