"""The book's GPT for the browser (gptlib.export): the readout equals the model, the ONNX graph
equals PyTorch under onnxruntime (the peer that the page's onnxruntime-web shares its kernels
with), its bytes are deterministic and its weights float16, and the tokenizer.json gives
BPETokenizer.encode's ids under Hugging Face's tokenizers."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gptlib.export import (
    OUTPUTS,
    export,
    main,
    manifest,
    readout,
    to_onnx,
    tokenizer_json,
    weights_sha256,
)
from gptlib.hooks import capture
from gptlib.model import GPT
from gptlib.tokenizers import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = ROOT / "models" / "english"
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

# Prompts that are not in the chapters: accents, emoji, digits, whitespace runs, a contraction.
PROMPTS = [
    "Zoë's café opened at 7:45 — 😀👍🏽 and   three   spaces\n\n\tthen a tab.",
    "x",
    "1234567890 numbers, 3.14159 and ½ of them",
    "Ünïcödé ñ 中文 العربية",
]


def _session(data: bytes):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(english, tmp_path_factory):
    """What `make book` writes for the English model: export() into a fresh folder, once."""
    return export(ENGLISH, tmp_path_factory.mktemp("live") / "live")


@pytest.fixture(scope="module")
def english_onnx(exported):
    return exported[0].read_bytes()


# --- readout ------------------------------------------------------------------------------------


def test_readout_is_the_models_forward_pass(tiny_gpt):
    model = tiny_gpt(n_ctx=16, n_layers=3)
    ids = torch.randint(0, 512, (2, 11), generator=torch.Generator().manual_seed(1))
    out = readout(model, ids)
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "logits": (2, 11, 512),
        "patterns": (2, 3, 4, 11, 11),
        "resid": (2, 4, 11, 64),
        "lens": (2, 4, 512),
    }
    torch.testing.assert_close(out["logits"], model(ids), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["patterns"], model.attention_patterns(ids), atol=1e-6, rtol=0)
    # the residual stream: X_0 = embedding + positions, then what each block returns
    seen = []
    hooks = [
        blk.register_forward_hook(lambda m, a, o: seen.append(o.detach())) for blk in model.blocks
    ]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    torch.testing.assert_close(out["resid"][:, 1:], torch.stack(seen, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(out["resid"][:, 0], model.embed(ids) + model.pos(11), atol=0, rtol=0)
    # the logit lens at the last position; its last row is the model's own next-token logits
    torch.testing.assert_close(
        out["lens"], model.unembed(model.ln_f(out["resid"][:, :, -1])), atol=0, rtol=0
    )
    torch.testing.assert_close(out["lens"][:, -1], out["logits"][:, -1], atol=1e-5, rtol=0)


def test_readout_keeps_the_mode_and_refuses_bad_ids(tiny_gpt):
    model = tiny_gpt(n_ctx=16).train()
    readout(model, torch.tensor([[1, 2]]))
    assert model.training
    for ids, match in [
        (torch.tensor([1, 2]), "shape"),
        (torch.zeros(1, 0, dtype=torch.long), "shape"),
        (torch.tensor([[1, 512]]), "ids"),
        (torch.tensor([[1.0]]), "ids"),
        (torch.zeros(1, 17, dtype=torch.long), "n_ctx"),
    ]:
        with pytest.raises(ValueError, match=match):
            readout(model, ids)
    with pytest.raises(ValueError, match="model"):
        readout(torch.nn.Linear(2, 2), torch.tensor([[1]]))


def test_readout_does_not_capture_afterwards(tiny_gpt):
    """capture_patterns restores the fused path and removes its hooks."""
    model = tiny_gpt(n_ctx=16)
    readout(model, torch.tensor([[1, 2, 3]]))
    assert all(blk.attn.fused for blk in model.blocks)
    with capture(model, "hook_pattern") as seen:
        model(torch.tensor([[1, 2, 3]]))
    assert seen == []  # the fused path hands no pattern out


# --- the ONNX graph -----------------------------------------------------------------------------


@pytest.mark.slow
def test_onnx_equals_pytorch_on_the_english_model(english, english_onnx):
    """Unicode prompts, a one-token prompt and a full n_ctx window: every output within 1e-4."""
    model, tok = english
    sess = _session(english_onnx)
    assert [i.name for i in sess.get_inputs()] == ["ids"] and [
        o.name for o in sess.get_outputs()
    ] == list(OUTPUTS)
    window = torch.randint(
        0, model.config.d_vocab, (1, model.config.n_ctx), generator=torch.Generator().manual_seed(0)
    )
    cases = [torch.tensor([tok.encode(p)]) for p in PROMPTS] + [window, window[:, :37].repeat(3, 1)]
    worst = {}
    for ids in cases:
        want = readout(model, ids)
        got = dict(zip(OUTPUTS, sess.run(None, {"ids": ids.numpy()})))
        for k in OUTPUTS:
            assert got[k].shape == tuple(want[k].shape) and got[k].dtype == np.float32
            worst[k] = max(worst.get(k, 0.0), float(np.abs(got[k] - want[k].numpy()).max()))
    assert worst["logits"] <= 1e-4 and worst["lens"] <= 1e-4, worst
    assert worst["patterns"] <= 1e-5 and worst["resid"] <= 1e-4, worst


def test_onnx_stores_the_weights_in_float16(english, english_onnx):
    from onnx import TensorProto

    model, _ = english
    proto = onnx.load_from_string(english_onnx)
    inits = {i.name: i for i in proto.graph.initializer}
    big = [i for i in inits.values() if np.prod(i.dims) >= 1024]
    assert big and all(i.data_type == TensorProto.FLOAT16 for i in big)
    # every fp16 initializer is cast back to float32 under the name the graph uses
    casts = {n.input[0]: n.output[0] for n in proto.graph.node if n.op_type == "Cast"}
    assert all(
        name in casts and casts[name] == name.removesuffix(".fp16")
        for name, i in inits.items()
        if i.data_type == TensorProto.FLOAT16
    )
    assert len(english_onnx) < 0.52 * 4 * model.num_parameters()  # about 2 bytes per parameter
    assert not any(n.metadata_props or n.doc_string for n in proto.graph.node)  # no stack traces


def test_to_onnx_refuses_what_it_cannot_export(tiny_gpt):
    with pytest.raises(ValueError, match="model"):
        to_onnx(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="n_ctx"):
        to_onnx(tiny_gpt(n_ctx=2))


# --- the tokenizer ------------------------------------------------------------------------------


def _fuzz(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = list("abcdefghijklmnopqrstuvwxyz ABCXYZ.,;:!?'\"-()") + [
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\t",
        "\r\n",
        "0",
        "1",
        "42",
        "2026",
        "3.14",
        "'s",
        "'ll",
        "'re",
        "n't",
        "é",
        "ü",
        "ñ",
        "ß",
        "Ω",
        "ж",
        "中",
        "文",
        "の",
        "한",
        "ع",
        "½",
        "١",
        "😀",
        "👍🏽",
        "🇫🇷",
        "\u00a0",
        "\u2003",
        "\u200b",
        "\x85",
        "\ufeff",
        "<|endoftext|>",
        " the",
        " of",
        "ing",
        "tion",
    ]
    return [""] + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def test_tokenizer_json_gives_bpe_ids_under_hugging_face_tokenizers(english):
    from tokenizers import Tokenizer

    _, tok = english
    hf = Tokenizer.from_str(json.dumps(tokenizer_json(tok)))
    for text in _fuzz(2000) + PROMPTS:
        assert hf.encode(text).ids == tok.encode(text), repr(text)
    # special-token text is ordinary text, as in encode()
    assert 4095 not in hf.encode("<|endoftext|>").ids and tok.special_tokens == {
        "<|endoftext|>": 4095
    }


def test_tokenizer_json_of_a_freshly_trained_bpe():
    from tokenizers import Tokenizer

    text = "the cat sat on the mat; the dog sat on the log. Ünïcödé 😀 1234 " * 20
    tok = BPETokenizer.train(text, 293)  # all the merges the text allows
    hf = Tokenizer.from_str(json.dumps(tokenizer_json(tok)))
    for t in _fuzz(300, seed=1) + [text]:
        assert hf.encode(t).ids == tok.encode(t), repr(t)


# --- the files ----------------------------------------------------------------------------------


def test_weights_sha256_names_the_weights(tiny_gpt):
    a, b = tiny_gpt(1), tiny_gpt(1)
    assert weights_sha256(a) == weights_sha256(b) != weights_sha256(tiny_gpt(2))
    with torch.no_grad():
        b.blocks[0].ln_1.b[3] += 1e-3
    assert weights_sha256(a) != weights_sha256(b)


def test_export_writes_the_three_files(english, exported, english_onnx):
    model, tok = english
    written = exported
    assert [p.name for p in written] == ["english.onnx", "english.tokenizer.json", "english.json"]
    info = json.loads(written[2].read_text(encoding="utf-8"))
    assert info["format"] == "gptlib-live" and info["version"] == 1 and info["name"] == "english"
    assert info["config"] == {
        "d_vocab": 4096,
        "n_ctx": 128,
        "d_model": 256,
        "n_heads": 4,
        "n_layers": 4,
    }
    assert info["onnx"]["bytes"] == len(english_onnx) and info["weights_sha256"] == weights_sha256(
        model
    )
    assert info["tokens"] == [tok.token_str(i) for i in range(4096)]
    assert [base64.b64decode(b) for b in info["token_bytes"]] == [
        tok.token_bytes(i) for i in range(4096)
    ]
    assert info == manifest(model, tok, "english", english_onnx, written[1].read_bytes())
    assert sorted(p.name for p in written[0].parent.iterdir()) == sorted(
        p.name for p in written
    )  # no temporary file left


def test_export_checks_its_input_before_writing(tmp_path, english):
    model, _tok = english
    src = tmp_path / "model"
    model.save(src)
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        export(src, out)
    BPETokenizer.train("the cat sat on the mat " * 10, 269).save(src / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json has"):
        export(src, out)
    with pytest.raises(ValueError, match="name"):
        export(ENGLISH, out, name="../x")
    assert not out.exists()


@pytest.mark.slow
def test_command_line_bytes_are_deterministic_and_lossless_for_float32_weights(
    tmp_path, capsys, tiny_gpt
):
    """``python -m gptlib.export`` writes the three files; a second export of the same model gives
    the same bytes; weights that float16 cannot hold exactly stay float32: nothing is lost."""
    from onnx import TensorProto

    src = tmp_path / "tiny"
    tok = BPETokenizer.train("the cat sat on the mat " * 10, 269)  # all the merges the text allows
    model = tiny_gpt(3, d_vocab=tok.vocab_size, n_ctx=8)
    model.save(src)
    tok.save(src / "tokenizer.json")
    assert main([str(src), str(tmp_path / "out"), "--name", "t"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "t.json",
        "t.onnx",
        "t.tokenizer.json",
    ]
    a = (tmp_path / "out" / "t.onnx").read_bytes()
    assert to_onnx(GPT.load(src)) == a
    proto = onnx.load_from_string(a)
    assert all(
        i.data_type == TensorProto.FLOAT for i in proto.graph.initializer if np.prod(i.dims) >= 1024
    )
    ids = torch.tensor([[5, 1, 268, 7, 7, 7]])
    got = _session(a).run(None, {"ids": ids.numpy()})
    np.testing.assert_allclose(got[0], readout(model, ids)["logits"].numpy(), atol=1e-5, rtol=0)


# --- a hostile caller ---------------------------------------------------------------------------


def test_bad_arguments_are_value_errors_naming_them(tmp_path):
    """Issue 24's audit: an empty or non-str name is refused (an empty one used to fall back to the
    directory's name silently), and what is not a BPETokenizer or a model is named, not an
    AttributeError."""
    for name in ("", 5, "a/b", ".hidden"):
        with pytest.raises(ValueError, match="name must be"):
            export(ENGLISH, tmp_path / "out", name=name)
    assert not (tmp_path / "out").exists()
    for bad in (None, "tokenizer", torch.nn.Linear(2, 2)):
        with pytest.raises(ValueError, match="tokenizer must be a BPETokenizer"):
            tokenizer_json(bad)
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        weights_sha256(None)


def test_a_model_with_non_finite_weights_is_not_exported(tiny_gpt):
    """The page would show NaN as the model's probabilities; to_onnx refuses, naming the weight."""
    model = tiny_gpt(n_ctx=16)
    with torch.no_grad():
        model.blocks[1].mlp.W_in[0, 0] = float("nan")
    with pytest.raises(ValueError, match="blocks.1.mlp.W_in holds NaN or inf"):
        to_onnx(model)


def test_manifest_needs_the_models_vocabulary(english):
    model, _tok = english
    small = BPETokenizer.train("the cat sat on the mat " * 10, 268)
    with pytest.raises(ValueError, match="tokenizer has 268 tokens, the model d_vocab=4096"):
        manifest(model, small, "english", b"", b"")
