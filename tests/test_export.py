"""The book's models in the browser (gptlib.export): the step (gptlib.step) equals the model (a
cached step equals the full forward pass, a masked head equals hooks that scale its output z_h, the
lens equals logit_lens, the heads' direct contributions and the other terms add up to the logit),
the ONNX graph equals the step under onnxruntime (the peer that the page's onnxruntime-web shares
its kernels with), its bytes are deterministic and its weights float16, and the tokenizer.json gives
BPETokenizer.encode's ids under Hugging Face's tokenizers. The exporter is tested on tiny models;
the live models' files that `make book` writes (book_static/live) are tested in the browser stage,
after the book is built."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from fuzz_texts import fuzzed_texts

from gptlib.circuits import ablate_heads
from gptlib.export import (
    export,
    main,
    manifest,
    pieces,
    to_onnx,
    to_onnx_gguf,
    tokenizer_json,
    weights_sha256,
)
from gptlib.export.manifest import VERSION
from gptlib.hooks import capture, capture_patterns, logit_lens
from gptlib.kvcache import KVCache
from gptlib.modern import ModernGPT
from gptlib.step import INPUTS, LENS_TOP, OUTPUTS, head_input, step, step_inputs
from gptlib.tokenizers import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = ROOT / "models" / "english"
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.usefixtures("one_thread")

# Prompts that are not in the chapters: accents, emoji, digits, whitespace runs, a contraction.
PROMPTS = [
    "Zoë's café opened at 7:45 — 😀👍🏽 and   three   spaces\n\n\tthen a tab.",
    "x",
    "1234567890 numbers, 3.14159 and ½ of them",
    "Ünïcödé ñ 中文 العربية",
]
IDS = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 3]])


def _session(data: bytes):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _run(session, args) -> dict[str, np.ndarray]:
    """The graph's outputs on step()'s arguments (without ``head``: none asked)."""
    feed = {k: t.numpy() for k, t in zip(INPUTS, args)}
    feed.setdefault("head", np.zeros((0, 4), dtype=np.int64))
    return dict(zip(OUTPUTS, session.run(list(OUTPUTS), feed)))


@pytest.fixture(scope="module", params=["gpt", "modern"])
def tiny(request, tiny_gpt, tiny_modern):
    """A tiny GPT (n_ctx 16) and a tiny ModernGPT (GQA: 4 query heads on 2 key-value heads)."""
    return tiny_gpt(n_ctx=16, n_layers=3) if request.param == "gpt" else tiny_modern(n_layers=3)


# The graphs: every export traces the whole step (a few seconds per layer, and some seconds more
# whatever the size), so the unit stage exports three tiny graphs, each once and shared by the
# tests of its class (a scope of its own under ``--dist loadscope``): a two-layer GPT's, twice (the
# command line's export of the same model is the second export its bytes are compared with), and a
# two-layer ModernGPT read from a GGUF (the path of the page's ModernGPT, SmolLM2). Two layers are
# as few as a head mask on two layers and a lens between the ends need. The English model's graph
# is the one `make book` writes; the browser stage tests that file (below) instead of exporting
# the model again. The GPT's graph has the command line's vocabulary (the BPE below).
CAT_TEXT, CAT_VOCAB = "the cat sat on the mat " * 10, 269  # all the merges the text allows


@pytest.fixture(scope="module")
def gpt_graph(tiny_gpt):
    """A two-layer GPT (n_ctx 16, the command line's vocabulary) and its graph; the first block's
    weights are rounded to float16 (which then holds them exactly, as it holds the English
    model's), the others are float32 draws that float16 cannot hold."""
    model = tiny_gpt(3, d_vocab=CAT_VOCAB, n_ctx=16, n_layers=2)
    with torch.no_grad():
        for w in model.blocks[0].parameters():
            w.copy_(w.half().float())
    return model, to_onnx(model)


def _steps(model, ids, cuts, mask=None, lens=(), targets=(), rows=True):
    """step() over ids cut at ``cuts``: the list of outputs, each step fed the keys and values
    so far (``past`` and ``kv`` concatenated, position first), each its query rows if ``rows``;
    each output also holds ``past``, the cache after it."""
    past, ones, lens_t, targets_t, _ = step_inputs(model, lens, targets)
    mask = ones if mask is None else mask
    outs, start = [], 0
    for end in list(cuts) + [ids.shape[1]]:
        q = torch.arange(end - start) if rows else torch.zeros(0, dtype=torch.int64)
        outs.append(step(model, ids[:, start:end], past, mask, lens_t, targets_t, q))
        past, start = torch.cat([past, outs[-1]["kv"]]), end
        outs[-1]["past"] = past
    return outs


# --- the step -----------------------------------------------------------------------------------


def test_cached_steps_equal_the_full_forward_pass(tiny):
    """Steps of 3, 1, 4 and 3 tokens: the logits after each are the full pass's at that position,
    the attention rows the full pattern's rows, the keys and values those of KVCache; a step that
    asks for no rows (or for some) gets those rows and the same logits and keys."""
    cuts = [3, 4, 8]
    outs = _steps(tiny, IDS, cuts)
    full_logits = tiny(IDS)[0]  # (T, V)
    with capture_patterns(tiny) as patterns:
        tiny(IDS)
    full = torch.stack([p[0] for p in patterns])  # (L, H, T, T)
    cache = KVCache(tiny.config.n_layers)
    tiny(IDS, cache)
    for out, start, end in zip(outs, [0] + cuts, cuts + [IDS.shape[1]]):
        torch.testing.assert_close(out["logits"][0], full_logits[end - 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(out["attn"], full[:, :, start:end, :end], atol=1e-6, rtol=0)
        assert out["kv"].shape[0] == end - start and out["past"].shape[0] == end
    present = torch.stack([torch.stack([k[0], v[0]]) for k, v in zip(cache.k, cache.v)])
    want = present.permute(3, 0, 1, 2, 4)  # (T, L, 2, n_kv, d_head): position first
    torch.testing.assert_close(outs[-1]["past"], want, atol=1e-6, rtol=0)
    bare = _steps(tiny, IDS, cuts, rows=False)
    for out, b in zip(outs, bare):
        assert b["attn"].shape[2] == 0
        assert torch.equal(out["logits"], b["logits"]) and torch.equal(out["kv"], b["kv"])
    some = step(tiny, IDS, *step_inputs(tiny, queries=[6, 2]))["attn"]
    torch.testing.assert_close(some, full[:, :, [6, 2]], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["gpt", "modern"])
def test_the_step_reads_w_u_rows_tied_and_untied(family, tiny_gpt, tiny_modern):
    """W_U_rows is W_E itself where W_U is tied to it, W_U^T otherwise; the step's logits and its
    direct contributions' W_U[:, t] (the head's head_W_U) are the model's, tied or not."""
    build = tiny_gpt if family == "gpt" else tiny_modern
    for tied in (True, False):
        model = build(n_layers=2, tie_weights=tied)
        rows = model.W_U_rows
        assert (rows is model.W_E) == tied and torch.equal(rows, model.W_U.T)
        ids = IDS[:, :5]
        heads = head_input(model, [(1, 0, 4, 7)])
        out = step(model, ids, *step_inputs(model, targets=[7]), head=heads)
        torch.testing.assert_close(out["logits"][0], model(ids)[0, -1], atol=1e-5, rtol=0)
        assert torch.equal(out["head_W_U"][0], model.W_U[:, 7])


@contextmanager
def _scaled_head_outputs(model, scales: dict[tuple[int, int], float]):
    """Forward hooks on hook_pattern that multiply head h's pattern A_h in layer l by
    ``scales[(l, h)]``: its output z_h = A_h V_h scales with it. A peer of the head mask that never
    touches W_O (which the step and ablate_heads both scale by rows)."""

    def hook(heads):
        def scale(module, args, pattern):  # (B, H, T, T_k)
            factor = torch.ones(pattern.shape[1], dtype=pattern.dtype)
            for h, s in heads.items():
                factor[h] = s
            return pattern * factor[:, None, None]

        return scale

    by_layer: dict[int, dict[int, float]] = {}
    for (layer, h), s in scales.items():
        by_layer.setdefault(layer, {})[h] = s
    handles = [
        model.blocks[layer].attn.hook_pattern.register_forward_hook(hook(heads))
        for layer, heads in by_layer.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def test_the_head_mask_scales_each_heads_output_z_h(tiny):
    """A zero in the mask removes head h (its z_h = 0), a half halves z_h: checked against hooks
    that scale the heads' patterns, so a wrong slice of W_O's rows (for the step's mask and
    ablate_heads alike) would show."""
    L, H = tiny.config.n_layers, tiny.config.n_heads
    mask = torch.ones(L, H)
    mask[0, 1] = mask[2, 3] = 0
    out = _steps(tiny, IDS, [5], mask=mask)[-1]
    with torch.no_grad(), _scaled_head_outputs(tiny, {(0, 1): 0.0, (2, 3): 0.0}):
        want = tiny(IDS)[:, -1]
    # float32 rounding only: the two paths sum the same products in another order
    torch.testing.assert_close(out["logits"], want, atol=1e-5, rtol=0)
    assert (out["logits"] - tiny(IDS)[:, -1]).abs().max() > 1e-3  # the heads mattered
    with torch.no_grad(), ablate_heads(tiny, [(0, 1), (2, 3)]):
        torch.testing.assert_close(tiny(IDS)[:, -1], want, atol=1e-5, rtol=0)  # the peer agrees
    half = torch.ones(L, H)
    half[0, 1] = 0.5
    with torch.no_grad(), _scaled_head_outputs(tiny, {(0, 1): 0.5}):
        want = tiny(IDS)[:, -1]
    torch.testing.assert_close(
        _steps(tiny, IDS, [], mask=half)[-1]["logits"], want, atol=1e-5, rtol=0
    )


def test_the_lens_is_logit_lens_cut_to_its_top(tiny):
    L = tiny.config.n_layers
    lens = [L, 0, 2, 2]
    out = _steps(tiny, IDS, [6], lens=lens)[-1]
    rows = logit_lens(tiny, IDS)[:, 0, -1]  # (L + 1, V)
    assert tuple(out["lens_ids"].shape) == (4, LENS_TOP) and out["lens_ids"].dtype == torch.int64
    for k, l in enumerate(lens):
        order = torch.sort(rows[l], descending=True, stable=True)  # ties: the lower id first
        assert out["lens_ids"][k].tolist() == order.indices[:LENS_TOP].tolist()
        torch.testing.assert_close(
            out["lens_logits"][k], order.values[:LENS_TOP], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(out["lens_lse"][k], rows[l].logsumexp(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["lens_logits"][0], out["logits"][0].topk(LENS_TOP).values)
    none = _steps(tiny, IDS, [6])[-1]  # no lens asked: empty outputs, the same logits
    assert [tuple(none[k].shape) for k in ("lens_ids", "lens_logits", "lens_lse")] == [
        (0, LENS_TOP),
        (0, LENS_TOP),
        (0,),
    ]
    assert torch.equal(none["logits"], out["logits"])


def test_direct_contributions_and_the_other_terms_add_up_to_the_logit(tiny):
    """In ln_f's linear part at the last position (the normaliser frozen at X_L), the logit of t is
    the sum of what every head, the embedding, every MLP and the biases write into the stream:
    the heads' terms from step(), the others read from the model's own sub-layers by hooks."""
    L, H = tiny.config.n_layers, tiny.config.n_heads
    targets = [3, 7, 200, 7]
    mask = torch.ones(L, H)
    mask[1, 2], mask[2, 0] = 0.0, 0.5
    out = _steps(tiny, IDS, [4], mask=mask, targets=targets)[-1]
    assert tuple(out["direct"].shape) == (L, H, 4)
    W_O = [blk.attn.W_O.detach().clone() for blk in tiny.blocks]
    mlp_out = []
    hooks = [
        blk.mlp.register_forward_hook(lambda m, a, o: mlp_out.append(o[0, -1]))
        for blk in tiny.blocks
    ]
    try:
        with torch.no_grad():
            for blk, w in zip(tiny.blocks, mask):  # the mask, as rows of W_O
                blk.attn.W_O.mul_(w.repeat_interleave(blk.attn.d_head)[:, None])
            with capture(tiny, "hook_resid") as streams:
                logits = tiny(IDS)[0, -1]
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for blk, w in zip(tiny.blocks, W_O):
                blk.attn.W_O.copy_(w)
    x_L, ln = streams[-1][0, -1], tiny.ln_f
    if isinstance(tiny, ModernGPT):  # RMSNorm: x w / rms(X_L)
        lin = lambda x: x * ln.w / x_L.pow(2).mean().add(ln.eps).sqrt()  # noqa: E731
        biases = torch.zeros(())
    else:  # LayerNorm: (x - mean x) w / sigma(X_L), then + b
        sigma = (x_L - x_L.mean()).pow(2).mean().add(ln.eps).sqrt()
        lin = lambda x: (x - x.mean()) * ln.w / sigma  # noqa: E731
        biases = sum(lin(blk.attn.b_O) for blk in tiny.blocks) + ln.b
    others = lin(streams[0][0, -1]) + sum(lin(m) for m in mlp_out) + biases  # (d_model,)
    with torch.no_grad():
        total = out["direct"].sum(dim=(0, 1)) + others @ tiny.W_U[:, targets]
    torch.testing.assert_close(total, logits[targets], atol=1e-5, rtol=0)
    assert (out["direct"][1, 2] == 0).all() and out["direct"].abs().max() > 1e-2
    # -1 is the most probable token (its first argmax); no targets, no contributions
    top = int(out["logits"][0].argmax())
    argmax = _steps(tiny, IDS, [4], mask=mask, targets=[-1, top])[-1]["direct"]
    assert torch.equal(argmax[..., 0], argmax[..., 1])
    assert tuple(_steps(tiny, IDS, [4], mask=mask)[-1]["direct"].shape) == (L, H, 0)


def test_bad_arguments_are_value_errors_naming_them(tiny_gpt, tiny_modern):
    model = tiny_gpt(n_ctx=16)
    past, mask, lens, targets, queries = step_inputs(model)
    ids = torch.tensor([[1, 2]])
    good = dict(ids=ids, past=past, head_mask=mask, lens=lens, targets=targets, queries=queries)
    good["head"] = head_input(model)
    bad = [
        ("ids", torch.tensor([1, 2])),
        ("ids", torch.zeros(1, 0, dtype=torch.int64)),
        ("ids", torch.tensor([[1, 512]])),
        ("ids", torch.tensor([[1.0]])),
        ("ids", torch.tensor([[1], [2]])),
        ("past", torch.zeros(0, 2, 2, 4, 15)),
        ("past", torch.zeros(2, 2, 4, 0, 16)),  # the old layout, positions third
        ("past", torch.zeros(15, 2, 2, 4, 16)),  # 15 + 2 positions > n_ctx
        ("past", torch.full((1, 2, 2, 4, 16), float("nan"))),
        ("head_mask", torch.ones(2, 3)),
        ("head_mask", torch.ones(2, 4, dtype=torch.float64)),
        ("lens", torch.tensor([3])),
        ("lens", torch.tensor([[0]])),
        ("targets", torch.tensor([512])),
        ("targets", torch.tensor([-2])),
        ("queries", torch.tensor([2])),  # T = 2 new queries: 0 and 1
        ("queries", torch.tensor([-1])),
        ("queries", torch.tensor([0.0])),
        ("head", torch.tensor([[0, 0, 2, 1]])),  # t = 2: not a new query
        ("head", torch.tensor([[2, 0, 0, 1]])),  # layer 2 of 2
        ("head", torch.tensor([[0, 0, 0, 512]])),
        ("head", torch.tensor([0, 0, 0, 1])),
        ("head", torch.tensor([[0.0, 0, 0, 1]])),
    ]
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            step(model, **{**good, name: value})
    with pytest.raises(ValueError, match="model"):
        step(torch.nn.Linear(2, 2), **good)
    with pytest.raises(ValueError, match="past"):  # GQA: n_kv = 2 key-value heads, not 4
        step(tiny_modern(), ids, torch.zeros(0, 2, 2, 4, 8), *step_inputs(tiny_modern())[1:])
    model.train()
    step(model, **good)
    assert model.training  # the mode is restored


# --- the ONNX graph -----------------------------------------------------------------------------


def _check_graph_equals_the_step(s, tiny) -> None:
    """onnxruntime's session ``s`` against step() in PyTorch, with P = 0 and P > 0, no lens,
    targets or rows and some (the argmax among the targets), a masked and a half head; every
    output within 1e-5, of step()'s shape and dtype."""
    assert [i.name for i in s.get_inputs()] == list(INPUTS)
    assert [o.name for o in s.get_outputs()] == list(OUTPUTS)
    L, H = tiny.config.n_layers, tiny.config.n_heads
    mask = torch.ones(L, H)
    mask[1, 2], mask[0, 0] = 0.0, 0.5
    for a, b, lens, targets, queries, heads in [
        # the embedding, a middle and the last stream; one head of the last layer
        (0, 3, [0, 1, L], [3, 4], [0, 1, 2], [(L - 1, 3, 1, 7)]),
        (0, 1, [], [], [], []),
        (3, 11, [2], [1, -1], [7], [(0, 0, 7, 2), (1, 2, 0, 250), (1, 1, 3, 5)]),
        (10, 11, [], [5, 6, 7], [], [(1, 2, 0, 9)]),
        (4, 8, [], [-1], [3, 0], []),
    ]:
        past = _steps(tiny, IDS[:, :a], [])[-1]["past"] if a else step_inputs(tiny)[0]
        i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        args = (IDS[:, a:b], past, mask, i64(lens), i64(targets), i64(queries))
        args += (head_input(tiny, heads),)
        want, got = step(tiny, *args), _run(s, args)
        for k in OUTPUTS:
            assert got[k].shape == tuple(want[k].shape) and got[k].dtype == want[k].numpy().dtype, k
            np.testing.assert_allclose(got[k], want[k].numpy(), atol=1e-5, rtol=0, err_msg=k)


class TestTheTinyGPTGraph:
    """The two-layer GPT's graph, exported twice (to_onnx, then the command line): a class, so that
    under ``--dist loadscope`` its exports are a scope of their own, beside the GGUF's."""

    @pytest.mark.slow
    def test_onnx_equals_the_step(self, gpt_graph):
        model, graph = gpt_graph
        _check_graph_equals_the_step(_session(graph), model)

    @pytest.mark.slow
    def test_command_line_bytes_are_deterministic_and_lossless_for_float32_weights(
        self, tmp_path, capsys, gpt_graph
    ):
        """``python -m gptlib.export`` writes the three files, the manifest last, and nothing else
        (no temporary file is left); the manifest is :func:`manifest` of what it wrote; its export
        of a model (saved and read back) gives the same bytes as a second export, :func:`to_onnx`
        of the model in memory; the weights that float16 holds exactly are stored as float16 and
        cast back to float32 under their names, the others stay float32: nothing is lost."""
        from onnx import TensorProto, numpy_helper

        model, graph = gpt_graph
        src, out = tmp_path / "tiny", tmp_path / "out"
        tok = BPETokenizer.train(CAT_TEXT, CAT_VOCAB)
        assert tok.vocab_size == model.config.d_vocab
        model.save(src)
        tok.save(src / "tokenizer.json")
        assert main([str(src), str(out), "--name", "t"]) == 0
        printed = capsys.readouterr().out.splitlines()
        names = ["t.onnx.0", "t.tokenizer.json", "t.json"]
        assert [line.split()[:2] for line in printed] == [["wrote", str(out / n)] for n in names]
        assert sorted(p.name for p in out.iterdir()) == sorted(names)
        a = (out / "t.onnx.0").read_bytes()
        assert graph == a
        info = json.loads((out / "t.json").read_text(encoding="utf-8"))
        assert info == manifest(model, tok, "t", [a], (out / "t.tokenizer.json").read_bytes())
        # a graph the page optimizes itself (only SmolLM2's is optimized ahead of time)
        assert info["onnx"]["optimized"] is None and info["onnx"]["bytes"] == len(a)
        proto = onnx.load_from_string(a)
        inits = {i.name: i for i in proto.graph.initializer}
        casts = {n.input[0]: n.output[0] for n in proto.graph.node if n.op_type == "Cast"}
        matrices = ["attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "mlp.W_in", "mlp.W_out"]
        for name in (f"model.blocks.0.{m}" for m in matrices):  # float16 holds them
            assert inits[f"{name}.fp16"].data_type == TensorProto.FLOAT16 and name not in inits
        for name in [f"model.blocks.1.{m}" for m in matrices] + ["model.unembed.W_E.T"]:
            assert inits[name].data_type == TensorProto.FLOAT, name  # float16 cannot hold them
        for name, i in inits.items():
            if i.data_type == TensorProto.FLOAT16:  # each cast back under the name the graph uses
                assert casts[name] == name.removesuffix(".fp16"), name
            elif i.data_type == TensorProto.FLOAT:  # float32 only where float16 would round
                w = numpy_helper.to_array(i)
                assert not np.array_equal(w.astype(np.float16).astype(np.float32), w), name
        assert not any(n.metadata_props or n.doc_string for n in proto.graph.node)  # no traces
        args = (torch.tensor([[5, 1, 268, 7, 7, 7]]), *step_inputs(model, [1], [7], queries=[5]))
        got = _run(_session(a), args)
        np.testing.assert_allclose(
            got["logits"], step(model, *args)["logits"].numpy(), atol=1e-5, rtol=0
        )
        with pytest.raises(SystemExit):
            main([str(src)])  # a model directory needs an output directory


def test_to_onnx_refuses_what_it_cannot_export(tiny_gpt):
    with pytest.raises(ValueError, match="model"):
        to_onnx(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="n_ctx"):
        to_onnx(tiny_gpt(n_ctx=3))


def test_the_tied_embedding_is_stored_transposed_only_for_its_own_uses():
    """_vocab_columns rewrites a gather of rows and a product W_E B; any other use of W_E (here
    W_E as a product's second operand) is refused, naming it, and the graph is left as it was."""
    from onnx import TensorProto, helper, numpy_helper

    from gptlib.export.graph import _vocab_columns

    W = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g", [x], [y], [W])
    before = graph.SerializeToString()
    with pytest.raises(ValueError, match=r"W is input 1 of a MatMul"):
        _vocab_columns(graph, "W")
    assert graph.SerializeToString() == before


def test_pieces_cut_and_join():
    data = bytes(range(256)) * 5
    assert b"".join(pieces(data, 300)) == data and [len(p) for p in pieces(data, 300)][-1] == 80
    assert pieces(b"", 3) == [b""]
    with pytest.raises(ValueError, match="size"):
        pieces(data, 0)


# --- the tokenizer ------------------------------------------------------------------------------


def test_tokenizer_json_gives_bpe_ids_under_hugging_face_tokenizers(english):
    from tokenizers import Tokenizer

    _, tok = english
    hf = Tokenizer.from_str(json.dumps(tokenizer_json(tok)))
    for text in fuzzed_texts(2000, 0, ("<|endoftext|>",), longest=40) + PROMPTS:
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
    for t in fuzzed_texts(300, 1, ("<|endoftext|>",), longest=40) + [text]:
        assert hf.encode(t).ids == tok.encode(t), repr(t)


NODE_TOKENIZERS = ROOT / "node_modules" / "@huggingface" / "tokenizers" / "package.json"
node = pytest.mark.skipif(
    not (shutil.which("node") and NODE_TOKENIZERS.is_file()),
    reason="node or node_modules/@huggingface/tokenizers is missing (make installs it)",
)


def _js_ids(tokenizer: dict, texts: list[str], tmp_path) -> list[list[int]]:
    """The ids the page's tokenizer (@huggingface/tokenizers under node) gives for ``texts``."""
    (tmp_path / "tok.json").write_text(json.dumps(tokenizer, ensure_ascii=False), "utf-8")
    (tmp_path / "texts.json").write_text(json.dumps(texts, ensure_ascii=False), "utf-8")
    done = subprocess.run(
        ["node", str(ROOT / "tests" / "tokenizer_ids.mjs"), "tok.json", "texts.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.slow
@node
def test_the_pages_tokenizer_gives_bpe_ids_for_the_english_model(english, tmp_path):
    _, tok = english
    texts = fuzzed_texts(200, 2, ("<|endoftext|>",)) + PROMPTS
    assert _js_ids(tokenizer_json(tok), texts, tmp_path) == [tok.encode(t) for t in texts]


# --- the files ----------------------------------------------------------------------------------


def test_weights_sha256_names_the_weights(tiny_gpt):
    a, b = tiny_gpt(1), tiny_gpt(1)
    assert weights_sha256(a) == weights_sha256(b) != weights_sha256(tiny_gpt(2))
    with torch.no_grad():
        b.blocks[0].ln_1.b[3] += 1e-3
    assert weights_sha256(a) != weights_sha256(b)


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


# --- a hostile caller ---------------------------------------------------------------------------


def test_bad_file_arguments_are_value_errors_naming_them(tmp_path):
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
        manifest(model, small, "english", [b""], b"")


# --- SmolLM2: the GGUF's own blocks in the graph ---------------------------------------------


def _external_session(
    graph: bytes, tensors: list[dict], blocks: bytes, folder: Path, optimize: bool = True
):
    """An onnxruntime session on ``graph`` with its external-data file made from the blocks by
    :func:`unpack_external` (what the page's q4.js makes), both written into ``folder``;
    ``optimize`` False: loaded with onnxruntime's optimizations off, as the page loads a graph
    optimized ahead of time."""
    from gptlib.export.q4 import unpack_external

    location = {e.key: e.value for i in _external(graph) for e in i.external_data}["location"]
    (folder / location).write_bytes(unpack_external(blocks, tensors))
    (folder / "graph.onnx").write_bytes(graph)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        str(folder / "graph.onnx"), opts, providers=["CPUExecutionProvider"]
    )


def _external(graph: bytes) -> list:
    from onnx import TensorProto

    proto = onnx.load_from_string(graph)
    return [i for i in proto.graph.initializer if i.data_location == TensorProto.EXTERNAL]


def _check_external(graph: bytes, tensors: list[dict], blocks: bytes, model) -> None:
    """The graph holds no unpacking: no packed (uint8, int8) initializer, no Floor or Cast of
    one; its external initializers are the table's tensors, in place, and the float32 file the
    blocks unpack to holds the model's weights bit for bit."""
    from onnx import TensorProto

    from gptlib.export.q4 import TRANSPOSED, unpack_external

    proto = onnx.load_from_string(graph)
    small = (TensorProto.UINT8, TensorProto.INT8)
    assert not any(i.data_type in small for i in proto.graph.initializer)
    assert not any(n.op_type == "Floor" for n in proto.graph.node)
    ext = {i.name: i for i in _external(graph)}
    assert sorted(ext) == sorted(t["name"] for t in tensors) and tensors
    flat = np.frombuffer(unpack_external(blocks, tensors), "<f4")
    state = model.state_dict()
    for t in tensors:
        e = {x.key: x.value for x in ext[t["name"]].external_data}
        assert (int(e["offset"]), int(e["length"])) == (t["offset"], t["bytes"])
        assert ext[t["name"]].data_type == TensorProto.FLOAT
        name = t["name"].removeprefix("model.")
        w = state[name.removesuffix(TRANSPOSED)].numpy()
        w = np.ascontiguousarray(w.T) if name.endswith(TRANSPOSED) else w  # stored as W^T
        assert list(ext[t["name"]].dims) == list(w.shape)
        mine = flat[t["offset"] // 4 : (t["offset"] + t["bytes"]) // 4].reshape(w.shape)
        assert np.array_equal(mine.view(np.uint32), w.view(np.uint32)), t["name"]


@pytest.fixture(scope="module")
def gguf_graph(tiny_modern, tmp_path_factory):
    """A two-layer ModernGPT written as a GGUF with Q4_1 matrices and a Q8_0 embedding and read
    back (the cached SmolLM2's path), and its graph: ``source`` (the float32 model the file was
    written from), ``path``, ``quantize`` (the file's types), ``model`` (read from the file),
    ``data``, ``tensors`` and ``blocks`` (what :func:`to_onnx_gguf` returns)."""
    from types import SimpleNamespace

    from test_gguf import write_gguf

    from gptlib.gguf import _gguf_names, read_gguf, state_from_gguf

    source = tiny_modern(d_mlp=64, n_layers=2)
    names = _gguf_names(source.config)
    quantize = {t: "Q4_1" for t, tr in names.values() if tr} | {"token_embd.weight": "Q8_0"}
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "t.gguf", source, quantize=quantize)
    model = ModernGPT.from_state(*state_from_gguf(read_gguf(path)), source=str(path))
    data, tensors, blocks = to_onnx_gguf(model, path, "t.weights")
    return SimpleNamespace(
        source=source, path=path, quantize=quantize, model=model, data=data, tensors=tensors,
        blocks=blocks,
    )  # fmt: skip


class TestTheTinyGGUF:
    """A tiny GGUF's export (the page's ModernGPT graph): a scope of its own, as above."""

    @pytest.mark.slow
    def test_gguf_blocks_in_the_graph_on_a_tiny_gguf(self, gguf_graph):
        """The graph's external weights, unpacked from the blocks, are the model's, bit for bit;
        the graph holds no unpacking; a model that is not what the blocks hold is refused before
        the graph changes."""
        from onnx import helper, numpy_helper

        from gptlib.export.graph import optimize_ahead
        from gptlib.export.q4 import store_gguf_blocks
        from gptlib.gguf import read_gguf

        g = gguf_graph
        contents = read_gguf(g.path)
        assert {t: contents.types[t] for t in g.quantize} == g.quantize
        # W_E stored as W_E^T, the page's transposed unpacking of the GGUF's rows
        W_E = {t["name"]: t for t in g.tensors}["model.W_E.T"]
        assert W_E["type"] == "Q8_0" and W_E["transpose"]
        # ... which the optimized graph gathers columns of, and multiplies rows by: never a
        # product W_E x^T with one column (graph.py's _vocab_columns)
        uses = [n for n in onnx.load_from_string(g.data).graph.node if "model.W_E.T" in n.input]
        assert {n.op_type for n in uses} == {"Gather", "MatMul"}, [n.op_type for n in uses]
        assert all(list(n.input).index("model.W_E.T") == (n.op_type == "MatMul") for n in uses)
        assert {t["name"]: t["type"] for t in g.tensors}["model.blocks.1.attn.W_Q"] == "Q4_1"
        assert len(g.blocks) == sum(t["blocks_bytes"] for t in g.tensors)
        _check_external(g.data, g.tensors, g.blocks, g.model)
        assert any(n.domain == "com.microsoft" for n in onnx.load_from_string(g.data).graph.node)
        # the float32 model the file was written from is not what its blocks hold
        graph = helper.make_graph([], "g", [], [], initializer=[
            numpy_helper.from_array(v.numpy(), f"model.{k}")
            for k, v in g.source.state_dict().items()
        ])  # fmt: skip
        with pytest.raises(
            ValueError, match="'token_embd.weight' unpacked does not equal the model's 'W_E'"
        ):
            store_gguf_blocks(graph, g.source, g.path, "t.weights")
        assert not _external(graph.SerializeToString())  # checked before the graph is changed
        with pytest.raises(ValueError, match="level must be 'basic' or 'extended', got 'all'"):
            optimize_ahead(graph, g.tensors, b"", "t.weights", level="all")

    @pytest.mark.slow
    def test_the_graph_has_few_nodes_a_layer(self, gguf_graph):
        """onnxruntime-web spends several microseconds on every node it runs, and SmolLM2's step
        ran about 4,100 (134 a layer), most of them small: RoPE's split, stack and dozen
        elementwise nodes for each of q and k, the shapes of views computed from a layer's
        own tensors, a select and an unsqueeze for every layer's piece of ``past``, of the mask
        and of each read-out. The two-layer graph held 396 nodes before those were cut (about
        82 a layer now, 310 in all); no shape is computed from a layer's tensors (the five Shape
        nodes read the inputs' lengths), and RoPE neither splits nor stacks."""
        from collections import Counter

        nodes = onnx.load_from_string(gguf_graph.data).graph.node
        counts = Counter(n.op_type for n in nodes)
        assert len(nodes) <= 320, counts
        assert counts["Shape"] <= 5, counts  # ids, past, lens, targets, head
        # head, past and the mask cut once, each layer's piece of past into keys and values
        assert counts["Split"] <= 3 + 2 and counts["Neg"] == 1, counts  # -sin once

    @pytest.mark.slow
    def test_onnx_equals_the_step(self, gguf_graph, tmp_path):
        """The graph, optimized ahead of time and loaded with onnxruntime's optimizations off (as
        the page loads it), its weights unpacked from the blocks, equals step() on the model read
        from the file: the sweep of the GPT's graph, and a whole window at once."""
        g = gguf_graph
        s = _external_session(g.data, g.tensors, g.blocks, tmp_path, optimize=False)
        _check_graph_equals_the_step(s, g.model)
        args = (IDS, *step_inputs(g.model, [0, 1], [5, -1], queries=[0, 9]))
        got, want = _run(s, args), step(g.model, *args)
        for k in OUTPUTS:
            np.testing.assert_allclose(got[k], want[k].numpy(), atol=1e-5, rtol=0, err_msg=k)


# --- the live models as `make book` writes them (book_static/live) --------------------------------
# The browser stage (``-m browser``, after `make book`, under GPTLIB_REQUIRE_BOOK=1, so that a
# missing file fails) tests the files the page reads; the unit stage tests the exporter itself on
# the tiny models above.
LIVE = ROOT / "book_static" / "live"


def _built(name: str):
    return pytest.mark.skipif(
        not (LIVE / f"{name}.json").is_file(),
        reason=f"no book_static/live/{name}.json: run make book",
    )


# --- the English model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def english_files():
    """The English model's manifest, its graph's bytes (its pieces joined) and its tokenizer.json's
    bytes, as make book wrote them."""
    info = json.loads((LIVE / "english.json").read_text("utf-8"))
    graph = b"".join((LIVE / p["file"]).read_bytes() for p in info["onnx"]["pieces"])
    return info, graph, (LIVE / info["tokenizer"]["file"]).read_bytes()


@pytest.mark.browser
@_built("english")
def test_the_english_graph_equals_the_step(english, english_files):
    """Unicode prompts in one step and token by token, and a full n_ctx window."""
    model, tok = english
    s = _session(english_files[1])
    window = torch.randint(
        0, model.config.d_vocab, (1, model.config.n_ctx), generator=torch.Generator().manual_seed(0)
    )
    lens, targets = list(range(model.config.n_layers + 1)), [11, 200, 4095]
    worst = {}
    for ids in [torch.tensor([tok.encode(p)]) for p in PROMPTS] + [window]:
        past, mask, lens_t, targets_t, _ = step_inputs(model, lens, targets)
        cuts = (
            [(0, ids.shape[1])]
            if ids.shape[1] > 40
            else [(0, 1)] + [(t, t + 1) for t in range(1, ids.shape[1])]
        )
        for a, b in cuts:
            args = (ids[:, a:b], past, mask, lens_t, targets_t, torch.arange(b - a))
            args += (head_input(model, [(a % 4, 2, b - a - 1, 11)]),)  # the last query
            want, got = step(model, *args), _run(s, args)
            for k in OUTPUTS:
                worst[k] = max(worst.get(k, 0.0), float(np.abs(got[k] - want[k].numpy()).max()))
            past = torch.cat([past, want["kv"]])
    print(f"English graph vs step, max |difference|: {worst}")
    assert worst["lens_ids"] == 0 and max(worst.values()) <= 1e-4, worst


@pytest.mark.browser
@_built("english")
def test_the_english_graph_stores_the_weights_in_float16(english, english_files):
    from onnx import TensorProto

    model, _ = english
    graph = english_files[1]
    proto = onnx.load_from_string(graph)
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
    assert len(graph) < 0.52 * 4 * model.num_parameters()  # about 2 bytes per parameter
    assert not any(n.metadata_props or n.doc_string for n in proto.graph.node)  # no stack traces


@pytest.mark.browser
@_built("english")
def test_the_english_manifest_is_the_models(english, english_files):
    """The manifest is :func:`manifest` of the files beside it, for the shipped model (its
    weights_sha256: not a stale export), the tokenizer.json is :func:`tokenizer_json`'s, and the
    folder holds only the files the manifests list: no temporary file, no piece of an earlier
    export."""
    model, tok = english
    info, graph, tok_bytes = english_files
    assert [p["file"] for p in info["onnx"]["pieces"]] == ["english.onnx.0"]
    assert info["tokenizer"]["file"] == "english.tokenizer.json"
    assert (
        info["format"] == "gptlib-live" and info["version"] == VERSION and info["name"] == "english"
    )
    assert info["family"] == "gpt" and info["lens_top"] == LENS_TOP
    assert info["config"] == {
        "d_vocab": 4096, "n_ctx": 128, "d_model": 256, "n_layers": 4, "n_heads": 4,
        "n_kv_heads": 4, "d_head": 64, "rope_base": None, "ln_f_centred": True,
        "attn_bias": True,
    }  # fmt: skip
    assert info["onnx"]["bytes"] == len(graph) == info["onnx"]["pieces"][0]["bytes"]
    assert info["onnx"]["optimized"] is None and info["weights"] is None
    assert info["download_bytes"] == len(graph) + len(tok_bytes)
    assert info["weights_sha256"] == weights_sha256(model)
    assert info["special"] == {} and info["chat"] is None
    assert info["tokens"] == [tok.token_str(i) for i in range(4096)]
    assert [base64.b64decode(b) for b in info["token_bytes"]] == [
        tok.token_bytes(i) for i in range(4096)
    ]
    assert info == manifest(model, tok, "english", [graph], tok_bytes)
    assert json.loads(tok_bytes) == json.loads(json.dumps(tokenizer_json(tok)))
    listed = set()
    for path in LIVE.glob("*.json"):
        if not path.name.endswith(".tokenizer.json"):  # a manifest
            m = json.loads(path.read_text("utf-8"))
            blocks = m["weights"]["blocks"]["pieces"] if m["weights"] else []
            listed |= {path.name, m["tokenizer"]["file"]}
            listed |= {p["file"] for p in m["onnx"]["pieces"] + blocks}
    assert sorted(p.name for p in LIVE.iterdir()) == sorted(listed)


# --- SmolLM2 -------------------------------------------------------------------------------------
built = _built("smollm2")


@pytest.fixture(scope="module")
def smollm2():
    from gptlib.gguf import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="module")
def smollm2_files():
    """The manifest, the graph's bytes (its pieces joined) and the blocks that make book wrote."""
    info = json.loads((LIVE / "smollm2.json").read_text("utf-8"))
    join = lambda listed: b"".join((LIVE / p["file"]).read_bytes() for p in listed)  # noqa: E731
    return info, join(info["onnx"]["pieces"]), join(info["weights"]["blocks"]["pieces"])


@pytest.fixture(scope="module")
def smollm2_session(smollm2_files, tmp_path_factory):
    """The one onnxruntime session on SmolLM2's graph, its external weights unpacked from the
    blocks as the page unpacks them, loaded as the page loads it (optimized ahead of time, so
    with onnxruntime's optimizations off), shared by the tests that run it."""
    info, graph, blocks = smollm2_files
    folder = tmp_path_factory.mktemp("smollm2")
    assert info["onnx"]["optimized"] == "extended"
    return _external_session(graph, info["weights"]["tensors"], blocks, folder, optimize=False)


@pytest.mark.browser
@built
def test_smollm2_files_are_pieces_of_the_gguf_graph(smollm2, smollm2_files):
    import hashlib

    model, tok = smollm2
    info, data, blocks = smollm2_files
    assert (
        info["version"] == VERSION and info["family"] == "modern" and info["lens_top"] == LENS_TOP
    )
    assert info["config"] == {
        "d_vocab": 49152, "n_ctx": 8192, "d_model": 576, "n_layers": 30, "n_heads": 9,
        "n_kv_heads": 3, "d_head": 64, "rope_base": model.blocks[0].attn.rope_base,
        "ln_f_centred": False, "attn_bias": False,
    }  # fmt: skip
    assert all(p["bytes"] <= 95_000_000 for p in info["onnx"]["pieces"])
    assert (
        len(data) == info["onnx"]["bytes"]
        and hashlib.sha256(data).hexdigest() == info["onnx"]["sha256"]
    )
    listed = info["weights"]["blocks"]
    assert all(p["bytes"] <= 95_000_000 for p in listed["pieces"])
    assert len(blocks) == listed["bytes"] and hashlib.sha256(blocks).hexdigest() == listed["sha256"]
    assert info["download_bytes"] == len(data) + len(blocks) + info["tokenizer"]["bytes"]
    assert info["download_bytes"] <= 120_000_000
    assert info["weights_sha256"] == weights_sha256(model)
    assert info["special"]["<|im_start|>"] == 1 and info["chat"]["stop"] == [2]
    text = info["chat"]["prefix"] + "Hi" + info["chat"]["suffix"]
    assert text == tok.apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.mark.browser
@built
def test_smollm2_blocks_unpack_to_the_cached_weights_bit_for_bit(smollm2, smollm2_files):
    info, graph, blocks = smollm2_files
    _check_external(graph, info["weights"]["tensors"], blocks, smollm2[0])
    assert info["weights"]["bytes"] == sum(t["bytes"] for t in info["weights"]["tensors"])


@pytest.mark.browser
@built
def test_smollm2_graph_equals_the_step(smollm2, smollm2_files, smollm2_session):
    """The chat frame around a question, then five greedy tokens one step at a time: onnxruntime
    against step() in PyTorch on the dequantized model, the same greedy tokens."""
    model, tok = smollm2
    info = smollm2_files[0]
    s = smollm2_session
    ids = torch.tensor(
        [
            tok.encode(
                info["chat"]["prefix"] + "What is the capital of France?" + info["chat"]["suffix"],
                allowed_special="all",
            )
        ]
    )
    past, mask, lens, targets, _ = step_inputs(model, [0, 15, 30], [5, 1000, -1])
    mask[3, 4] = 0.0
    worst = {}
    for k in range(6):
        args = (ids, past, mask, lens, targets, torch.arange(ids.shape[1]))
        # one head at the last query (the ablated one once), to the greedy token's logit
        args += (head_input(model, [(3 + k, 4 + k % 2, ids.shape[1] - 1, 1000)]),)
        want, got = step(model, *args), _run(s, args)
        for k in OUTPUTS:
            worst[k] = max(worst.get(k, 0.0), float(np.abs(got[k] - want[k].numpy()).max()))
        assert int(got["logits"].argmax()) == int(want["logits"].argmax())
        past, ids = torch.cat([past, want["kv"]]), want["logits"].argmax(-1, keepdim=True)
    print(f"SmolLM2 graph vs step, max |difference|: {worst}")
    assert worst["logits"] <= 1e-3 and worst["attn"] <= 1e-4 and worst["kv"] <= 1e-3, worst


@pytest.mark.browser
@built
@node
def test_the_pages_tokenizer_gives_gguf_ids_for_smollm2(smollm2, tmp_path):
    _, tok = smollm2
    chat = tok.apply_chat_template([{"role": "user", "content": "Écris 12345 fois « bonjour » 😀"}])
    extra = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n<|im_start|>assistant\n", "user")
    texts = fuzzed_texts(200, 3, extra) + PROMPTS
    texts += [chat, "x\x04y", "<|im_start|>user\nHi<|im_end|>"]
    tokenizer = json.loads((LIVE / "smollm2.tokenizer.json").read_text("utf-8"))
    got = _js_ids(tokenizer, texts, tmp_path)
    assert got == [tok.encode(t, allowed_special="all") for t in texts]
