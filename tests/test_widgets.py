"""The book's widgets: their state (all data synced), validation, deterministic reprs, the attention
scores, the sampling view's continuation trees, and the sampling view's JavaScript (distribution,
cumulative mass, seeded draws) against gptlib.sampling.next_token_probs (run with node)."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from browser_support import load_module
from node_support import import_as, run_node
from page_twins import xorshift32

from gptlib.circuits import (
    first_token_score,
    head_scores,
    induction_pairs,
    induction_score,
    previous_token_score,
    uniform_causal_pattern,
)
from gptlib.model import GPT, GPTConfig
from gptlib.sampling import next_token_probs
from gptlib.tokenizers import CharTokenizer
from gptlib.widgets import AttentionView, BPEMergeView, PlaygroundView, SamplingView
from gptlib.widgets.live import STEP_BUFFERS
from gptlib.widgets.sampling import (
    KEPT_WHEN_LARGER,
    MAX_FULL_VOCAB,
    continuation_tree,
    rest_log_weights,
    sparse_table,
    table_logits,
    top_logits,
)
from gptlib.widgets.stored import WIDGET_STATE, add_code, code_size, strip_code

ROOT = Path(__file__).resolve().parents[1]
WIDGETS = ROOT / "gptlib" / "widgets"

STEPS = [list("the cat"), ["th", "e", " ", "c", "a", "t"], ["the", " ", "c", "a", "t"]]
MERGES = ["'t' + 'h' -> 'th'", "'th' + 'e' -> 'the'"]


def _state(w) -> dict:
    """The synced state, as the stored notebook and the HTML book hold it (without model ids)."""
    s = w.get_state()
    s.pop("layout", None)  # a reference to the layout model, by its random id
    return s


# --- BPEMergeView -------------------------------------------------------------------------------


def test_bpe_state_holds_every_step():
    w = BPEMergeView(STEPS, MERGES, title="merges")
    s = _state(w)
    assert s["steps"] == STEPS and s["merges"] == MERGES and s["title"] == "merges"
    assert s["step"] == len(MERGES)  # opens on the fully merged split
    assert s["_esm"] == (WIDGETS / "static" / "bpe.js").read_text(encoding="utf-8")
    json.dumps(s)  # what the HTML book embeds


def test_bpe_repr_is_deterministic():
    a, b = BPEMergeView(STEPS, MERGES), BPEMergeView(STEPS, MERGES)
    assert repr(a) == repr(b) == "BPEMergeView(merges=2, pieces=[7, 5])"
    assert "0x" not in repr(a) and a.model_id not in repr(a)
    assert _state(a) == _state(b)


@pytest.mark.parametrize(
    "steps, merges",
    [
        (STEPS, MERGES[:1]),
        (STEPS[:1], MERGES),
        ([], []),
        ([list("ab"), ["ab"], ["ba"]], ["x", "y"]),
    ],
)
def test_bpe_rejects_inconsistent_steps(steps, merges):
    with pytest.raises(ValueError, match="steps"):
        BPEMergeView(steps, merges)


def test_bpe_without_merges_is_allowed():
    w = BPEMergeView([list("ab")], [])
    assert w.step == 0 and repr(w) == "BPEMergeView(merges=0, pieces=[2, 2])"


# --- AttentionView ------------------------------------------------------------------------------


def _patterns(n_layers=2, n_heads=3, T=4, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_layers, n_heads, T, T, generator=g)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return torch.softmax(scores.masked_fill(mask, -math.inf), dim=-1)  # (n_layers, n_heads, T, T)


@pytest.mark.parametrize("kind", ["torch", "numpy", "list"])
def test_attention_accepts_tensor_array_and_lists(kind):
    A = _patterns()
    data = {"torch": A, "numpy": A.numpy(), "list": A.tolist()}[kind]
    w = AttentionView(list("abcd"), data, title="t")
    s = _state(w)
    assert s["tokens"] == list("abcd")
    assert np.allclose(np.array(s["patterns"]), A.numpy(), atol=5e-7)
    assert s["layer_labels"] == ["layer 0", "layer 1"]
    assert s["head_labels"] == ["head 0", "head 1", "head 2"]
    assert (s["layer"], s["head"]) == (0, 0)
    assert repr(w) == "AttentionView(layers=2, heads=3, tokens=4)"


def test_attention_state_is_rounded_to_six_decimals():
    w = AttentionView(list("abcd"), _patterns(1, 1))
    flat = [x for row in w.patterns[0][0] for x in row]
    assert all(round(x, 6) == x for x in flat)
    assert _state(w) == _state(AttentionView(list("abcd"), _patterns(1, 1)))


def test_attention_labels():
    w = AttentionView(
        list("abcd"), _patterns(1, 2), layer_labels=["L5"], head_labels=["prev", "self"]
    )
    assert w.layer_labels == ["L5"] and w.head_labels == ["prev", "self"]
    with pytest.raises(ValueError, match="head_labels"):
        AttentionView(list("abcd"), _patterns(1, 2), head_labels=["one"])
    with pytest.raises(ValueError, match="layer_labels"):
        AttentionView(list("abcd"), _patterns(1, 2), layer_labels=["a", "b"])


@pytest.mark.parametrize(
    "tokens, patterns",
    [
        (list("abc"), _patterns()),  # T = 4 but 3 tokens
        (list("abcd"), _patterns()[0]),  # 3-D: no layer axis
        (list("abcd"), _patterns()[..., :3]),  # not square
        (list("abcd"), [[1.0]]),
    ],
)
def test_attention_rejects_bad_shapes(tokens, patterns):
    with pytest.raises(ValueError, match="patterns"):
        AttentionView(tokens, patterns)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1.5, -0.25])
def test_attention_refuses_patterns_that_are_not_weights(bad):
    """NaN or an infinity would make a widget state that is not JSON; a weight outside [0, 1] is
    no attention pattern. Each is refused, naming the patterns."""
    A = _patterns(1, 2, 3)
    A[0, 1, 2, 1] = bad
    with pytest.raises(ValueError, match="patterns"):
        AttentionView(list("abc"), A)


def test_attention_state_holds_scores_of_the_stored_patterns():
    A = _patterns(2, 3, 6)
    w = AttentionView(list("abcdef"), A)
    stored = torch.tensor(w.patterns, dtype=torch.float64)
    assert [s["name"] for s in w.scores] == ["previous token", "first token"]  # no token repeats
    for s, f in zip(w.scores, (previous_token_score, first_token_score)):
        assert s["values"] == [[round(v, 3) for v in row] for row in f(stored).tolist()]
        assert s["uniform"] == round(float(f(uniform_causal_pattern(6))), 3)
    w2 = AttentionView(list("abcabc"), A)
    assert [s["name"] for s in w2.scores] == ["previous token", "first token", "induction"]
    assert w2.scores[2]["values"] == [
        [round(v, 3) for v in row] for row in induction_score(stored, list("abcabc")).tolist()
    ]
    assert AttentionView(["a"], [[[[1.0]]]]).scores == []  # one position: nothing to score
    json.dumps(_state(w2), allow_nan=False)


def test_scores_of_ideal_heads():
    T = 8
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1  # every query looks at the token before it
    first = torch.zeros(T, T)
    first[:, 0] = 1
    assert previous_token_score(prev) == 1 and first_token_score(prev) == pytest.approx(1 / (T - 1))
    assert first_token_score(first) == 1 and previous_token_score(first) == pytest.approx(
        1 / (T - 1)
    )
    # a uniform causal head: A[i, i-1] = 1/(i+1), averaged over i = 1..T-1
    U = uniform_causal_pattern(T)
    assert float(previous_token_score(U)) == pytest.approx(
        sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    )
    torch.testing.assert_close(U.sum(-1), torch.ones(T, dtype=torch.float64))
    # batched: any leading dimensions
    both = torch.stack([prev, first])[None]  # (1, 2, T, T)
    torch.testing.assert_close(previous_token_score(both), torch.tensor([[1.0, 1 / (T - 1)]]))


def test_induction_pairs_on_a_repeated_sequence_are_the_offset_diagonal():
    """On a random sequence repeated once, with no repeat inside a half, the pairs are the
    diagonal at offset -(L - 1) over the second half: TransformerLens's induction score."""
    g = torch.Generator().manual_seed(0)
    L = 10
    half = torch.randperm(50, generator=g)[:L].tolist()
    tokens = half + half
    assert induction_pairs(tokens) == [(i, i - L + 1) for i in range(L, 2 * L)]
    A = _patterns(2, 3, 2 * L)
    want = A.diagonal(offset=-(L - 1), dim1=-2, dim2=-1)[..., 1:].mean(-1)  # rows L..2L-1
    torch.testing.assert_close(induction_score(A, tokens), want)
    ideal = torch.zeros(2 * L, 2 * L)
    ideal[torch.arange(2 * L), torch.arange(2 * L)] = 1
    for i, j in induction_pairs(tokens):
        ideal[i] = 0
        ideal[i, j] = 1
    assert induction_score(ideal, tokens) == 1


def test_induction_pairs_use_the_last_occurrence():
    assert induction_pairs(list("abxab")) == [(3, 1), (4, 2)]
    assert induction_pairs(list("ababab")) == [
        (2, 1),
        (3, 2),
        (4, 3),
        (5, 4),
    ]  # 2 -> after 0; 4 -> after 2
    assert (
        induction_pairs(list("aaa")) == []
    )  # the last a before each a is just before it: the query itself
    assert induction_pairs(list("aba")) == [(2, 1)]
    assert induction_pairs([]) == [] and induction_pairs([7, 8, 9]) == []


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: previous_token_score(torch.ones(1, 1)), "T >= 2"),
        (lambda: first_token_score(torch.ones(2, 3)), "pattern"),
        (lambda: previous_token_score([[1.0]]), "pattern"),
        (lambda: induction_score(torch.ones(3, 3), "ab"), "tokens"),
        (lambda: uniform_causal_pattern(0), "T must"),
    ],
)
def test_scores_reject_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_head_scores_names_and_uniform_levels():
    A = _patterns(1, 2, 5)
    assert [s["name"] for s in head_scores(A, list("abcde"))] == ["previous token", "first token"]
    scores = head_scores(A, list("abcab"))
    assert [s["name"] for s in scores] == ["previous token", "first token", "induction"]
    assert scores[2]["uniform"] == pytest.approx((1 / 4 + 1 / 5) / 2)  # pairs (3, 1) and (4, 2)
    assert head_scores(A[..., :1, :1], ["a"]) == []


# --- SamplingView -------------------------------------------------------------------------------


def _root(w, prompt=0) -> dict:
    return w.prompts[prompt]["root"]


def test_sampling_state_and_repr():
    logits = torch.tensor([10.0, 6.0, 4.0])
    w = SamplingView(
        logits, ["a", "b", "c"], temperature=0.5, top_k=2, top_p=0.9, n_show=5, title="x"
    )
    s = _state(w)
    assert s["prompts"] == [
        {
            "text": "",
            "root": {
                "ids": [0, 1, 2],
                "logits": [10.0, 6.0, 4.0],
                "mass": 1.0,
                "rest": None,
                "next": {},
            },
        }
    ]
    assert s["tokens"] == {"0": "a", "1": "b", "2": "c"} and s["vocab_size"] == 3
    assert s["temperatures"] == [
        round(0.05 * k, 2) for k in range(1, 61)
    ]  # the slider's, 0.5 among them
    assert (s["temperature"], s["top_k"], s["top_p"], s["n_show"], s["prompt"], s["seed"]) == (
        0.5,
        2,
        0.9,
        3,
        0,
        0,
    )
    assert repr(w) == "SamplingView(vocab=3, temperature=0.5, top_k=2, top_p=0.9)"
    d = SamplingView([1.0, 2.0], ["a", "b"])
    assert (d.top_k, d.top_p) == (0, 1.0)  # off
    assert repr(d) == "SamplingView(vocab=2, temperature=1.0, top_k=None, top_p=1.0)"
    assert SamplingView([1.0, 2.0], ["a", "b"], seed=7).seed == 7


def test_sampling_logits_rounded_and_deterministic():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(100, generator=g)
    a, b = (
        SamplingView(logits, [str(i) for i in range(100)]),
        SamplingView(logits, [str(i) for i in range(100)]),
    )
    assert _state(a) == _state(b)
    stored = _root(a)["logits"]
    assert all(round(x, 6) == x for x in stored)
    assert max(abs(x - y) for x, y in zip(stored, logits.tolist())) <= 5e-7


def test_sampling_keeps_full_vocab_up_to_8192_then_top_4096():
    g = torch.Generator().manual_seed(1)
    small = torch.randn(MAX_FULL_VOCAB, generator=g)
    root = _root(SamplingView(small, [str(i) for i in range(MAX_FULL_VOCAB)]))
    assert len(root["logits"]) == MAX_FULL_VOCAB and root["mass"] == 1.0
    big = torch.randn(MAX_FULL_VOCAB + 1, generator=g)
    w = SamplingView(big, [f"t{i}" for i in range(len(big))])
    top = torch.topk(big, KEPT_WHEN_LARGER).indices.sort().values.tolist()
    assert _root(w)["ids"] == top and w.tokens == {str(i): f"t{i}" for i in top}
    assert len(_root(w)["logits"]) == KEPT_WHEN_LARGER
    # the kept tokens' share of the full distribution is stored, to 4 decimals
    assert _root(w)["mass"] == round(float(torch.softmax(big.double(), -1)[top].sum()), 4) < 1
    # and the others' weight at each temperature: with it, a stored token's probability is the
    # model's
    rest, m = _root(w)["rest"], max(_root(w)["logits"])
    assert (
        len(rest) == len(w.temperatures)
        and _root(SamplingView(small, [""] * len(small)))["rest"] is None
    )
    for t, r in zip(w.temperatures, rest):
        stored = torch.tensor(_root(w)["logits"], dtype=torch.float64)
        p = torch.exp((stored - m) / t) / (torch.exp((stored - m) / t).sum() + math.exp(r))
        torch.testing.assert_close(
            p, next_token_probs(big.double(), temperature=t)[top], atol=1e-5, rtol=1e-4
        )


def test_rest_log_weights():
    y = torch.tensor([3.0, 1.0, -1.0, 0.5, -math.inf], dtype=torch.float64)
    rest = rest_log_weights(y, [0, 3], [0.5, 1.0, 2.0])
    for t, r in zip([0.5, 1.0, 2.0], rest):
        assert r == pytest.approx(math.log(math.exp(-2 / t) + math.exp(-4 / t)), abs=5e-5)
    assert rest_log_weights(y, [0, 1, 2, 3], [1.0]) == [None]  # only a -inf token left: no weight
    assert rest_log_weights(y, range(5)) is None
    assert rest_log_weights(y, [0], [1.0], reference=2.5)[0] == pytest.approx(
        math.log(math.exp(-1.5) + math.exp(-3.5) + math.exp(-2.0)), abs=5e-5
    )


def test_sampling_minus_inf_logits_become_zero_probability():
    w = SamplingView([0.0, -math.inf, 1.0], ["a", "b", "c"])
    json.dumps(_state(w), allow_nan=False)  # valid JSON for the browser
    p = next_token_probs(torch.tensor(_root(w)["logits"], dtype=torch.float64))
    assert p[1] == 0


# --- the sampling view on a model: top logits and continuation trees ---------------------------


def test_top_logits_order_ties_and_mass():
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 1.0])
    ids, values, mass = top_logits(logits, 3)
    assert ids == [1, 3, 4] and values == [
        2.0,
        2.0,
        1.0,
    ]  # ties: the lower id first, as torch.sort(stable)
    assert mass == pytest.approx(
        float(torch.softmax(logits.double(), -1)[[1, 3, 4]].sum()), abs=1e-12
    )
    assert top_logits(logits, 99)[2] == pytest.approx(1.0)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="n must"):
            top_logits(logits, bad)
    with pytest.raises(ValueError, match="logits"):
        top_logits(logits[None], 2)


def _bigram(table: torch.Tensor):
    calls = []

    def next_logits(contexts):
        assert (
            len({len(c) for c in contexts}) == 1
        )  # one batch per level: all contexts of one length
        calls.append(len(contexts))
        return table[[c[-1] for c in contexts]]

    return next_logits, calls


def _walk(node, path=()):
    yield path, node
    for t, child in node["next"].items():
        yield from _walk(child, path + (int(t),))


def test_continuation_tree_has_the_distribution_after_each_stored_path():
    g = torch.Generator().manual_seed(3)
    table = (
        torch.randn(20, 20, generator=g) * 2
    )  # a bigram "model": the next logits depend on the last id
    next_logits, calls = _bigram(table)
    tree = continuation_tree(next_logits, [5, 7], depth=3, branch=3, n_logits=10, n_logits_deep=6)
    assert calls == [1, 3, 9, 27]  # the model runs once per level
    nodes = list(_walk(tree))
    assert len(nodes) == 1 + 3 + 9 + 27
    for path, node in nodes:
        row = table[([7] + list(path))[-1]].double()
        want_ids, want_values, want_mass = top_logits(row, 10 if not path else 6)
        assert node["ids"] == want_ids
        assert node["logits"] == [round(v, 4) for v in want_values]
        assert node["mass"] == round(want_mass, 4)
        assert list(node["next"]) == ([str(t) for t in want_ids[:3]] if len(path) < 3 else [])
    json.dumps(tree, allow_nan=False)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(depth=-1), "depth"),
        (dict(branch=0), "branch"),
        (dict(n_logits=0), "n_logits"),
        (dict(n_logits_deep=0), "n_logits_deep"),
        (dict(branch=5, n_logits=4), "branch"),
        (dict(branch=5, n_logits_deep=4), "branch"),
        (dict(depth=1.5), "depth"),
        (dict(context=[]), "context"),
    ],
)
def test_continuation_tree_rejects_bad_arguments(kwargs, name):
    next_logits, _ = _bigram(torch.zeros(8, 8))
    args = dict(context=[1], depth=2, branch=2, n_logits=8, n_logits_deep=8) | kwargs
    with pytest.raises(ValueError, match=name):
        continuation_tree(next_logits, **args)


TEXT = "the cat sat on the mat. the dog sat on the log."


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tok = CharTokenizer.train(TEXT)
    model = GPT(GPTConfig.preset("tiny", d_vocab=tok.vocab_size, n_ctx=16)).train()
    return model, tok


def test_from_model_stores_the_models_distributions(tiny):
    model, tok = tiny
    prompts = ["the cat", "on the long mat and the log"]  # the second is longer than n_ctx = 16
    w = SamplingView.from_model(
        model,
        tok,
        prompts,
        depth=2,
        branch=2,
        n_logits=12,
        n_logits_deep=5,
        temperature=0.8,
        top_k=4,
        top_p=0.9,
        title="tiny",
        seed=3,
    )
    assert model.training  # its mode is restored
    assert [p["text"] for p in w.prompts] == prompts
    model.eval()
    for p in w.prompts:
        for path, node in _walk(p["root"]):
            ids = (tok.encode(p["text"]) + list(path))[-16:]
            with torch.no_grad():
                want = model(torch.tensor([ids]))[0, -1].double()
            want_ids, want_values, _ = top_logits(want, 5 if path else 12)
            assert node["ids"] == want_ids
            torch.testing.assert_close(
                torch.tensor(node["logits"], dtype=torch.float64),
                torch.tensor(want_values, dtype=torch.float64),
                atol=5e-5,
                rtol=0,
            )
            assert node["rest"] == pytest.approx(
                rest_log_weights(want, want_ids, w.temperatures, reference=node["logits"][0]),
                abs=1e-4,
            )
        assert len(list(_walk(p["root"]))) == 1 + 2 + 4
    model.train()
    stored = {i for p in w.prompts for _, n in _walk(p["root"]) for i in n["ids"]}
    assert w.tokens == {str(i): tok.decode([i]) for i in sorted(stored)}
    assert (w.temperature, w.top_k, w.top_p, w.seed, w.title) == (0.8, 4, 0.9, 3, "tiny")
    assert w.vocab_size == tok.vocab_size and 0.8 in w.temperatures
    assert (
        repr(w) == f"SamplingView(prompts=2, vocab={tok.vocab_size}, depth=2, "
        "temperature=0.8, top_k=4, top_p=0.9)"
    )
    # top-k beyond the tokens a node stores: the page could not tell which tokens it keeps
    with pytest.raises(ValueError, match="top_k must be <= 5"):
        SamplingView.from_model(
            model, tok, prompts, depth=1, branch=2, n_logits=12, n_logits_deep=5, top_k=6
        )


def test_from_model_takes_a_function_of_contexts():
    """A bigram table's rows as the model: every stored distribution is a row of the table."""
    g = torch.Generator().manual_seed(4)
    table = torch.randn(6, 6, generator=g, dtype=torch.float64) * 2
    tok = CharTokenizer.train("abcdef")
    w = SamplingView.from_model(
        lambda contexts: table[[c[-1] for c in contexts]], tok, ["ab"], depth=4, branch=2
    )
    assert w.vocab_size == 6 and repr(w).startswith("SamplingView(prompts=1, vocab=6, depth=4")
    for path, node in _walk(w.prompts[0]["root"]):
        last = ([tok.encode("ab")[-1]] + list(path))[-1]
        assert node["ids"] == top_logits(table[last], 6)[0] and node["rest"] is None
    with pytest.raises(ValueError, match="model"):
        SamplingView.from_model("a bigram", tok, ["ab"])


def test_from_model_names_tokens_with_token_str():
    """A byte-level BPE tokenizer names each stored id by token_str (a byte that is not valid
    UTF-8 on its own is shown, not dropped)."""
    from gptlib.tokenizers import BPETokenizer

    tok = BPETokenizer.train(TEXT * 4, 274)  # all the merges the text allows
    torch.manual_seed(1)
    model = GPT(GPTConfig.preset("tiny", d_vocab=tok.vocab_size, n_ctx=16))
    V = tok.vocab_size
    w = SamplingView.from_model(model, tok, ["the cat"], depth=1, branch=2, n_logits=V)
    assert (
        sorted(w.prompts[0]["root"]["ids"]) == list(range(V))
        and w.prompts[0]["root"]["mass"] == 1.0
    )
    assert w.tokens == {str(i): tok.token_str(i) for i in range(V)}
    assert (
        0xE9 < V and w.tokens[str(0xE9)] == tok.token_str(0xE9) != ""
    )  # a lone byte of a 2-byte character
    assert (
        repr(w)
        == f"SamplingView(prompts=1, vocab={V}, depth=1, temperature=1.0, top_k=None, top_p=1.0)"
    )


def test_from_model_is_deterministic_and_compact(tiny):
    model, tok = tiny
    a = SamplingView.from_model(model, tok, ["the cat", "the dog"])
    b = SamplingView.from_model(model, tok, ["the cat", "the dog"])
    assert _state(a) == _state(b) and repr(a) == repr(b)
    text = json.dumps(_state(a)["prompts"], allow_nan=False)
    # defaults: depth 3, branch 3 (40 nodes), at most 1024 logits at the root and 64 below
    nodes = list(_walk(a.prompts[0]["root"]))
    V = tok.vocab_size
    assert len(nodes) == 40 and all(
        len(n["ids"]) == min(V, 64 if path else 1024) for path, n in nodes
    )
    assert len(text) < 2 * 40 * (V * 16 + 8)


def test_from_model_refuses_a_model_with_nan_logits(tiny):
    """The plain constructor refuses NaN logits; so does from_model, whose logits come from a
    model."""
    model, tok = tiny
    broken = GPT(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.ln_f.w.fill_(math.nan)
    with pytest.raises(ValueError, match="NaN"):
        SamplingView.from_model(broken, tok, ["the cat"], depth=1, branch=1)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(prompts=[]), "prompts"),
        (dict(prompts="the cat"), "prompts"),
        (dict(prompts=["the", ""]), "prompts"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(n_show=0), "n_show"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**32), "seed"),
        (dict(branch=0), "branch"),
        (dict(depth=-1), "depth"),
    ],
)
def test_from_model_rejects_bad_input(tiny, kwargs, name):
    model, tok = tiny
    args = dict(prompts=["the cat"]) | kwargs
    with pytest.raises(ValueError, match=name):
        SamplingView.from_model(model, tok, **args)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(logits=[1.0, float("nan")]), "logits"),
        (dict(logits=[1.0, math.inf]), "logits"),
        (dict(logits=[-math.inf, -math.inf]), "logits"),
        (dict(logits=[]), "logits"),
        (dict(logits=[[1.0, 2.0]]), "logits"),
        (dict(tokens=["a"]), "tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(n_show=0), "n_show"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_sampling_rejects_bad_input(kwargs, name):
    args = dict(logits=[1.0, 2.0], tokens=["a", "b"]) | kwargs
    with pytest.raises(ValueError, match=name):
        SamplingView(**args)


# --- the sampling view on a whole bigram table, and its hand-over to the live model -------------


def _counts(V=7, seed=5) -> torch.Tensor:
    """A table of whole counts with empty entries and one row never seen."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (V, V), generator=g).float() * (
        torch.rand(V, V, generator=g) < 0.4
    )
    counts[3] = 0
    return counts  # (V, V)


def test_sparse_table_holds_the_nonzero_counts_by_row():
    counts = _counts()
    t = sparse_table(counts, smoothing=0.25)
    assert t["smoothing"] == 0.25 and len(t["indptr"]) == 8 and t["indptr"][0] == 0
    assert len(t["indices"]) == len(t["counts"]) == int((counts > 0).sum()) == t["indptr"][-1]
    assert all(isinstance(c, int) and c > 0 for c in t["counts"])
    rebuilt = torch.zeros_like(counts)
    for a in range(7):
        lo, hi = t["indptr"][a], t["indptr"][a + 1]
        assert t["indices"][lo:hi] == sorted(t["indices"][lo:hi])
        rebuilt[a, t["indices"][lo:hi]] = torch.tensor(t["counts"][lo:hi], dtype=torch.float32)
    assert torch.equal(rebuilt, counts) and t["indptr"][4] == t["indptr"][3]  # row 3 is empty
    assert sparse_table([[0.5, 0.0], [0.0, 2.0]])["counts"] == [0.5, 2]  # fractions kept


def test_table_logits_are_the_log_counts_plus_smoothing():
    """Chapter 7's bigram: log(counts[a] + 0.01), in float64 here and float32 there."""
    counts = _counts()
    t = sparse_table(counts)
    for a in range(7):
        y = table_logits(t, a)
        assert y.dtype == torch.float64 and y.shape == (7,)
        assert torch.equal(y, torch.log(counts[a].double() + 0.01))
        torch.testing.assert_close(y.float(), torch.log(counts[a] + 0.01))  # float32 as there
    with pytest.raises(ValueError, match="a must"):
        table_logits(t, 7)


@pytest.mark.parametrize(
    "counts, smoothing, name",
    [
        (torch.zeros(2, 3), 0.01, "counts"),
        (torch.zeros(2), 0.01, "counts"),
        (torch.tensor([[1.0, -1.0], [0.0, 0.0]]), 0.01, "counts"),
        (torch.tensor([[1.0, math.nan], [0.0, 0.0]]), 0.01, "counts"),
        (torch.tensor([[1.0, math.inf], [0.0, 0.0]]), 0.01, "counts"),
        ("ab", 0.01, "counts"),
        (torch.ones(2, 2), 0.0, "smoothing"),
        (torch.ones(2, 2), math.inf, "smoothing"),
        (torch.ones(2, 2), "0.1", "smoothing"),
    ],
)
def test_sparse_table_rejects_bad_input(counts, smoothing, name):
    with pytest.raises(ValueError, match=name):
        sparse_table(counts, smoothing)


def test_from_table_ships_the_whole_table():
    tok = CharTokenizer.train("abcdefg")
    counts = _counts()
    w = SamplingView.from_table(
        counts, tok, ["abc", "gd"], top_p=0.9, top_k=5, n_show=50, title="bigram", seed=4
    )
    s = _state(w)
    assert s["table"] == sparse_table(counts)
    assert s["prompts"] == [{"text": "abc", "ids": [0, 1, 2]}, {"text": "gd", "ids": [6, 3]}]
    assert s["tokens"] == {str(i): c for i, c in enumerate("abcdefg")} and s["vocab_size"] == 7
    assert (s["top_k"], s["top_p"], s["n_show"], s["seed"], s["title"]) == (5, 0.9, 7, 4, "bigram")
    assert (s["source"], s["weights_sha256"]) == ("", "")  # nothing to hand over to
    nonzero = int((counts > 0).sum())
    assert repr(w) == (
        f"SamplingView(prompts=2, vocab=7, nonzero={nonzero}, temperature=1.0, top_k=5, top_p=0.9)"
    )
    assert (
        _state(
            SamplingView.from_table(
                counts, tok, ["abc", "gd"], top_p=0.9, top_k=5, n_show=50, title="bigram", seed=4
            )
        )
        == s
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(prompts="abc"), "prompts"),
        (dict(prompts=[]), "prompts"),
        (dict(prompts=[""]), "prompts"),
        (dict(counts=torch.ones(6, 6)), "tokenizer"),
        (dict(counts=-torch.ones(7, 7)), "counts"),
        (dict(smoothing=0), "smoothing"),
        (dict(top_k=8), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(seed=-1), "seed"),
        (dict(title=3), "title"),
    ],
)
def test_from_table_rejects_bad_input(kwargs, name):
    args = (
        dict(counts=torch.ones(7, 7), tokenizer=CharTokenizer.train("abcdefg"), prompts=["ab"])
        | kwargs
    )
    with pytest.raises(ValueError, match=name):
        SamplingView.from_table(**args)


class _Sent(list):
    """What a view sends to the page: (content, buffers) per message."""


def _talk(view, content) -> tuple[dict, list]:
    sent = _Sent()
    view.send = lambda msg, buffers=None: sent.append((msg, buffers or []))
    view._answer(view, {"req": 1, **content}, [])
    assert len(sent) == 1 and sent[0][0]["req"] == 1
    return sent[0]


def test_from_model_with_a_source_hands_over_to_the_kernel(tiny):
    """Past the stored tree the page asks the kernel: its logits are the model's after the whole
    text, cropped to n_ctx as generate does."""
    from gptlib.export import weights_sha256

    model, tok = tiny
    w = SamplingView.from_model(
        model, tok, ["the cat"], depth=1, branch=1, n_logits=8, source="live/english.json"
    )
    assert model.training  # its mode is restored
    assert w.source == "live/english.json" and w.weights_sha256 == weights_sha256(model)
    assert w.prompts[0]["ids"] == tok.encode("the cat")
    assert repr(w).startswith("SamplingView(prompts=1, vocab=")
    assert "live='live/english.json'" in repr(w)
    assert _talk(w, {"kind": "ping"})[0]["kind"] == "pong"
    msg, _ = _talk(w, {"kind": "start"})  # the protocol PlaygroundView speaks (widgets/live.py)
    assert msg["config"]["n_ctx"] == 16 and msg["config"]["d_vocab"] == tok.vocab_size
    assert msg["tokens"] == [tok.decode([i]) for i in range(tok.vocab_size)]
    assert [base64.b64decode(b).decode() for b in msg["token_bytes"]] == msg["tokens"]
    ids = tok.encode("the dog sat on the log and the mat")[-16:]  # the page crops to n_ctx
    msg, buffers = _talk(w, {"kind": "step", "ids": ids})
    got = torch.tensor(np.frombuffer(buffers[0], dtype=np.float32).copy())
    model.eval()
    with torch.no_grad():
        want = model(torch.tensor([ids]))[0, -1]
    model.train()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert model.training  # the step leaves the model's mode as it was
    for bad in (
        {"kind": "step", "ids": [tok.vocab_size]},
        {"kind": "step", "ids": []},
        {"kind": "step", "ids": "ab"},
        {"kind": "step", "ids": list(range(17))},  # more than n_ctx
        {"kind": "logits", "ids": ids},  # the old request: one protocol now
    ):
        msg, _ = _talk(w, bad)
        assert msg["kind"] == "error" and msg["message"].startswith("ValueError")
    # without a source the view answers nothing and stores no live model
    plain = SamplingView.from_model(model, tok, ["the cat"], depth=1, branch=1, n_logits=8)
    assert (plain.source, plain.weights_sha256) == ("", "")


def test_from_model_source_needs_a_model_and_a_relative_manifest(tiny):
    model, tok = tiny
    for source in (
        "/live/english.json",
        "https://x/english.json",
        "../english.json",
        "live/english.onnx",
        "c:english.json",
        3,
    ):
        with pytest.raises(ValueError, match="source"):
            SamplingView.from_model(model, tok, ["the cat"], depth=1, source=source)
    table = torch.randn(tok.vocab_size, tok.vocab_size, dtype=torch.float64)
    with pytest.raises(ValueError, match="source"):
        SamplingView.from_model(
            lambda c: table[[x[-1] for x in c]],
            tok,
            ["the cat"],
            depth=1,
            source="live/english.json",
        )


# --- the sampling view's JavaScript against Python ---------------------------------------------

SETTINGS = [
    (1.0, None, None),
    (0.7, None, None),
    (2.5, None, None),
    (0.0, None, None),
    (0.0, 3, 0.5),
    (1.0, 1, None),
    (1.0, 5, None),
    (1.0, 64, None),
    (1.0, 1000, None),
    (1.0, None, 0.05),
    (1.0, None, 0.5),
    (1.0, None, 0.9),
    (1.0, None, 1.0),
    (0.6, 10, 0.8),
    (1.8, 20, 0.95),
]


def _node(tmp_path, script_body: str, module: str = "distribution.js", also: str | None = None):
    """Run an ES module snippet with node that imports the named exports of one of the widgets'
    source modules (gptlib/widgets/js/, from which their bundles are built) as ``m`` (and of a
    second one, ``also``, as ``n``)."""
    second = import_as("n", also) if also else ""
    return run_node(import_as("m", module) + second + script_body)


def _cases():
    g = torch.Generator().manual_seed(7)
    cases = [(torch.randn(64, generator=g) * 3).double() for _ in range(3)]
    cases.append(
        torch.tensor([2.0, 2.0, 1.0, 2.0, 0.0, -1e30], dtype=torch.float64)
    )  # ties, masked
    return cases


def test_sampling_js_equals_next_token_probs(tmp_path):
    """nextTokenProbs in sampling.js (what the book's readers see) equals gptlib's, to 1e-9."""
    calls = [
        (c.tolist(), t, k or 0, p if p is not None else 1.0)
        for c in _cases()
        for (t, k, p) in SETTINGS
    ]
    js = _node(
        tmp_path,
        f"const calls = {json.dumps(calls)};\n"
        "console.log(JSON.stringify(calls.map(([l, t, k, p]) => m.nextTokenProbs(l, t, k, p))));",
    )
    for (logits, t, k, p), probs in zip(calls, js):
        want = next_token_probs(
            torch.tensor(logits, dtype=torch.float64),
            temperature=t,
            top_k=k or None,
            top_p=p if p < 1 else None,
        )
        torch.testing.assert_close(
            torch.tensor(probs, dtype=torch.float64),
            want,
            atol=1e-9,
            rtol=0,
            msg=lambda m: f"T={t} top_k={k} top_p={p}: {m}",
        )


def test_sampling_js_cumulative_mass_is_what_top_p_cuts(tmp_path):
    """The line drawn for top-p: the running sum, most probable first, of the distribution after
    temperature and top-k; top-p keeps a token exactly when the mass before it is below p."""
    calls = [(c.tolist(), t, k or 0) for c in _cases() for (t, k, _) in SETTINGS]
    js = _node(
        tmp_path,
        f"const calls = {json.dumps(calls)};\n"
        "console.log(JSON.stringify(calls.map(([l, t, k]) => [m.byLogit(l), m.cumulativeMass(l, t, "
        "k)])));",
    )
    for (logits, t, k), (order, cum) in zip(calls, js):
        y = torch.tensor(logits, dtype=torch.float64)
        assert order == torch.sort(y, descending=True, stable=True).indices.tolist()
        q = next_token_probs(y, temperature=t, top_k=k or None)
        torch.testing.assert_close(
            torch.tensor(cum, dtype=torch.float64), torch.cumsum(q[order], 0), atol=1e-9, rtol=0
        )
        for p in (0.3, 0.8):
            if t == 0:
                continue
            kept = next_token_probs(y, temperature=t, top_k=k or None, top_p=p)[order] > 0
            before = torch.tensor([0.0] + cum[:-1], dtype=torch.float64)
            assert torch.equal(
                kept, (before < p - 1e-12) & (q[order] > 0) | (kept & (before - p).abs().lt(1e-12))
            )


def test_sampling_js_orders_float32_logits_as_torch_sort(tmp_path):
    """byLogit's native sort of the page's float32 logits (a vocabulary's worth, with ties, signed
    zeros, subnormals and infinities) gives torch.sort's stable order."""
    js = _node(
        tmp_path,
        "const n = 49152, y = new Float32Array(n); let s = 7;\n"
        "const r = () => (s = (s * 1103515245 + 12345) % 2147483648) / 2147483648;\n"
        "for (let i = 0; i < n; i++) y[i] = (r() - 0.5) * 40;\n"
        "for (let i = 0; i < 500; i++) y[600 + Math.floor(r() * (n - 600))] = y[i];  // ties\n"
        "y.set([-0, 0, -Infinity, Infinity, 1e-40, -1e-40]);\n"
        "console.log(JSON.stringify({ y: Array.from(y, String), order: m.byLogit(y) }));",
    )
    y = torch.tensor([float(v) for v in js["y"]], dtype=torch.float32)
    assert torch.isinf(y).sum() == 2 and (y == 0).sum() >= 2
    assert js["order"] == torch.sort(y, descending=True, stable=True).indices.tolist()


def test_sampling_js_distribution_given_its_order_is_the_same(tmp_path):
    """distribution(..., sorted) with sorted = byLogit(logits), sorted once for several settings
    (the playground's chart and a draw), gives what it gives when it sorts itself."""
    js = _node(
        tmp_path,
        "const y = Float32Array.from({ length: 300 }, (_, i) => Math.sin(i * 1.7) * 5);\n"
        "const order = m.byLogit(y), same = [];\n"
        "for (const [t, k, p] of [[1, 0, 1], [0.7, 20, 0.9], [0, 0, 1], [1.3, 0, 0.5]]) {\n"
        "  same.push(JSON.stringify(m.distribution(y, t, k, p, null, order)) ===\n"
        "    JSON.stringify(m.distribution(y, t, k, p)));\n"
        "}\n"
        "console.log(JSON.stringify({ same }));",
    )
    assert js["same"] == [True, True, True, True]


def test_sampling_js_draws_are_seeded_inverse_cdf(tmp_path):
    js = _node(
        tmp_path,
        "const r = m.xorshift32(5), r0 = m.xorshift32(0);\n"
        "const us = Array.from({length: 200}, () => r()), u0 = Array.from({length: 3}, () => "
        "r0());\n"
        "const p = [0.1, 0.0, 0.6, 0.3], order = [2, 3, 0, 1];\n"
        "console.log(JSON.stringify({us, u0, draws: [0, 0.59, 0.6, 0.89, 0.9, 0.999999, 1]"
        ".map((u) => m.drawIndex(p, order, u))}));",
    )
    py = xorshift32(5)
    assert js["us"] == [next(py) for _ in range(200)]  # bit for bit
    assert all(0 <= u < 1 for u in js["us"]) and len(set(js["us"])) == 200
    assert 0.4 < sum(js["us"]) / 200 < 0.6
    py0 = xorshift32(0)
    assert (
        js["u0"] == [next(py0) for _ in range(3)] and js["u0"][0] > 0
    )  # seed 0 is not xorshift's fixed point
    # order 2 (0.6), 3 (0.3), 0 (0.1): u < 0.6 -> 2, u < 0.9 -> 3, else 0; never the impossible 1
    assert js["draws"] == [2, 2, 3, 3, 0, 0, 0]


def test_sampling_js_with_the_others_weight_is_the_models_distribution(tmp_path):
    """A node that stores only the most probable tokens and the others' weight: the page's
    probabilities of the stored tokens are the model's (next_token_probs on all logits) whenever
    the cuts end among the stored tokens; the others' kept mass is the rest; where top-p reaches
    into the others, the page says so (approx) and keeps less than the model, by less than one of
    their probabilities."""
    g = torch.Generator().manual_seed(11)
    y = (torch.randn(200, generator=g) * 2.5).double()
    temps = [0.35, 0.7, 1.0, 2.5]
    calls = []
    for n in (200, 40, 5):
        ids, values, _ = top_logits(y, n)
        values = [round(v, 6) for v in values]
        rest = rest_log_weights(y, ids, temps, reference=values[0])
        for t, k, p in [
            (1.0, None, None),
            (0.7, None, None),
            (2.5, None, None),
            (0.35, 3, 0.5),
            (1.0, 5, None),
            (1.0, None, 0.3),
            (1.0, None, 0.9),
            (2.5, None, 0.95),
            (0.7, 4, 0.99),
            (0.0, None, 0.5),
        ]:
            r = None if rest is None or t == 0 else rest[temps.index(t)]
            calls.append((n, ids, values, r, t, k or 0, p if p is not None else 1.0))
    js = _node(
        tmp_path,
        f"const calls = {json.dumps(calls)};\n"
        "console.log(JSON.stringify(calls.map(([n, ids, l, r, t, k, p]) => "
        "{ const d = m.distribution(l, t, k, p, r);"
        " const u = d.p.reduce((s, v) => s + v, 0); return [d.p, d.rest, d.approx, "
        "m.drawIndex(d.p, d.order, 0.999999, d.rest),"
        " u]; })));",
    )
    seen_approx = seen_rest = False
    for (n, ids, _values, _r, t, k, p), (probs, rest, approx, last, total) in zip(calls, js):
        want = next_token_probs(y, temperature=t, top_k=k or None, top_p=p if p < 1 else None)
        assert total + rest == pytest.approx(1.0, abs=1e-9)
        if not approx:
            # the others' weight is stored to 4 decimals of its log: a relative 5e-5
            torch.testing.assert_close(
                torch.tensor(probs, dtype=torch.float64),
                want[ids],
                atol=2e-5,
                rtol=5e-5,
                msg=lambda msg: f"n={n} T={t} k={k} p={p}: {msg}",
            )
            assert rest == pytest.approx(1 - float(want[ids].sum()), abs=2e-5)
        else:  # the stored tokens keep the model's proportions; the others keep less than in
            # the model
            seen_approx = True
            assert n < 200 and 0 < p < 1
            got = torch.tensor(probs, dtype=torch.float64)
            torch.testing.assert_close(
                got / got.sum(), want[ids] / want[ids].sum(), atol=2e-6, rtol=1e-5
            )
            assert 0 < rest <= float(1 - want[ids].sum()) + 2e-5
        seen_rest |= rest > 0
        if rest > 0:
            assert last == -1  # a draw near 1 falls among the others, which come last
    assert seen_approx and seen_rest


def test_sampling_js_table_logits_equal_python(tmp_path):
    """The page's row of a bigram table (tableLogits in distribution.js) is table_logits, for every
    row: an empty one, whole and fractional counts, two smoothings."""
    counts = _counts(V=40, seed=9)
    counts[5, :3] = torch.tensor([0.5, 1e4, 2.25])
    for smoothing in (0.01, 1.5):
        t = sparse_table(counts, smoothing)
        js = _node(
            tmp_path,
            f"const t = {json.dumps(t)};\n"
            "console.log(JSON.stringify([...Array(40).keys()].map((a) => m.tableLogits(t, a))));",
        )
        got = torch.tensor(js, dtype=torch.float64)  # (40, 40)
        want = torch.stack([table_logits(t, a) for a in range(40)])
        torch.testing.assert_close(got, want, atol=1e-15, rtol=1e-15)
        torch.testing.assert_close(
            got, torch.log(counts.double() + smoothing), atol=1e-15, rtol=1e-15
        )


def test_head_scores_js_equals_python(tmp_path):
    """heads.js's scores, which the playground computes in the page, are
    gptlib.circuits.head_scores."""
    A = _patterns(2, 3, 7, seed=5)
    for keys in (list("abcdefg"), [1, 2, 3, 1, 2, 3, 1], list("aabaaba")):
        js = _node(
            tmp_path,
            f"console.log(JSON.stringify(m.headScores({json.dumps(A.tolist())}, "
            f"{json.dumps(keys)})));",
            "heads.js",
        )
        want = head_scores(A.double(), keys)
        assert [s["name"] for s in js] == [s["name"] for s in want]
        for got, w in zip(js, want):
            torch.testing.assert_close(
                torch.tensor(got["values"], dtype=torch.float64),
                w["values"].double(),
                atol=1e-12,
                rtol=0,
            )
            assert got["uniform"] == pytest.approx(w["uniform"], abs=1e-12)


def test_row_entropy_js_and_overview_cells(tmp_path):
    """heads.js's entropy score is the entropy (nats) of each head's last attention row, with
    log T (a uniform row's) as its top; the overview's cells are 14 to 28 px, the grid of a deep
    model about 420 px tall."""
    A = _patterns(2, 3, 7, seed=6)
    A[1, 2, -1] = 0.0
    A[1, 2, -1, 3] = 1.0  # a head on one key: entropy 0
    js = _node(
        tmp_path,
        f"console.log(JSON.stringify([m.rowEntropy({json.dumps(A.tolist())}, 7),"
        " m.rowEntropy([[[[1]]]], 1)]));",
        "heads.js",
    )
    got, none = js
    want = torch.special.entr(A[:, :, -1].double()).sum(-1)  # (L, H)
    torch.testing.assert_close(
        torch.tensor(got["values"], dtype=torch.float64), want, atol=1e-12, rtol=0
    )
    assert got["name"] == "entropy" and got["values"][1][2] == 0 and none is None
    assert got["top"] == pytest.approx(math.log(7), abs=1e-15) and bool((want <= math.log(7)).all())
    sizes = _node(
        tmp_path, "console.log(JSON.stringify([1, 4, 12, 30, 48].map(m.cellSize)));", "overview.js"
    )
    assert sizes == [28, 28, 28, 14, 14] and 30 * sizes[3] <= 420


def test_attention_js_colour_scale(tmp_path):
    js = _node(
        tmp_path, "console.log(JSON.stringify([0, 0.25, 0.5, 1, -1, 2].map(m.colour)));", "heads.js"
    )
    assert js[0] == [255, 255, 255] and js[3] == [8, 48, 107]  # the legend's two ends
    assert js[4] == js[0] and js[5] == js[3]  # clamped to [0, 1]
    darkness = [sum(c) for c in js[:4]]
    assert darkness == sorted(darkness, reverse=True)  # more weight, darker


def test_attention_scale_is_the_figures_scale_and_follows_the_background(tmp_path):
    """One colour scale: heads.js's stops are gptlib.figures.ATTENTION_STOPS; on a page's
    background weight 0 is that background, and on a dark one strong weights are the light end."""
    from gptlib.figures import ATTENTION_STOPS, attention_cmap

    js = _node(
        tmp_path,
        "console.log(JSON.stringify([m.STOPS, m.scaleOn([255, 255, 255]), m.scaleOn([18, 18, 18]),"
        " m.colour(1, m.scaleOn([18, 18, 18])), m.colour(0, m.scaleOn([20, 24, 30]))]));",
        "heads.js",
    )
    stops, light, dark, dark_one, dark_zero = js
    assert [tuple(c) for c in stops] == list(ATTENTION_STOPS)
    assert light == stops  # white page: the stops as they are
    assert dark[0] == [18, 18, 18] and dark[1:] == stops[::-1][1:]  # background, then lighter
    assert dark_one == [255, 255, 255] and dark_zero == [20, 24, 30]
    cmap = attention_cmap()  # the figures' colormap passes through the same stops
    for k, rgb in enumerate(ATTENTION_STOPS):
        got = [round(255 * c) for c in cmap(k / (len(ATTENTION_STOPS) - 1))[:3]]
        assert max(abs(u - v) for u, v in zip(got, rgb)) <= 1  # (matplotlib's 256-entry table)


def _label_cases():
    """Byte strings for the label rule: every single byte, every lead byte before every byte
    class, truncated and overlong sequences, surrogates, and random strings."""
    g = torch.Generator().manual_seed(3)
    cases = [bytes([b]) for b in range(256)]
    cases += [
        bytes([a, b]) for a in range(0xC0, 0x100) for b in (0x41, 0x80, 0x9F, 0xA0, 0xBF, 0xC0)
    ]
    cases += [
        b"\xe0\x80\x80",
        b"\xe0\xa0\x80",
        b"\xed\x9f\xbf",
        b"\xed\xa0\x80",
        b"\xf0\x8f\xbf\xbf",
        b"\xf0\x90\x80\x80",
        b"\xf4\x8f\xbf\xbf",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
        b"\xf0\x9f\x98",
        " café\n\tx\x00\x7f\u0085 €😀".encode(),
    ]
    for n in (3, 5, 8, 13):
        cases += [bytes(torch.randint(0, 256, (n,), generator=g).tolist()) for _ in range(40)]
    return cases


def test_token_labels_js_equal_python(tmp_path):
    """dom.js's bytesText and show are gptlib.tokenizers.base's token_text and token_label: a byte
    outside a whole UTF-8 character is <0xNN> (one per byte), control characters are visible."""
    from gptlib.tokenizers.base import token_label, token_text

    cases = _label_cases()
    js = _node(
        tmp_path,
        f"const cases = {json.dumps([list(c) for c in cases])};\n"
        "console.log(JSON.stringify(cases.map((c) => { const t = m.bytesText(new Uint8Array(c));"
        " return [t, m.show(t)]; })));",
        "dom.js",
    )
    want = [[token_text(c), token_label(token_text(c))] for c in cases]
    assert js == want
    assert token_text(b"\xe2") == "<0xE2>" and token_label("\n") == "\u21b5"
    assert len({token_text(bytes([b])) for b in range(128, 256)}) == 128  # no two alike


_FAKE_DOM = """
globalThis.document = { createElement: (tag) => ({ tag, className: "", textContent: "",
  on: {}, addEventListener(n, f) { this.on[n] = f; },
  replaceWith(...xs) { this.replaced = xs; } }) };
"""


def test_collapse_js_shows_the_ends_of_a_long_row(tmp_path):
    """dom.js's collapse: a row longer than its limit keeps its first 40 and last 20 items around a
    button "… N more" that puts the N others back; short rows and opened rows are left whole."""
    js = _node(
        tmp_path,
        _FAKE_DOM + "const items = [...Array(100).keys()]; let opened = 0;\n"
        "const cut = m.collapse(items, { onOpen: () => { opened += 1; } });\n"
        "const more = cut[40]; more.on.click();\n"
        "console.log(JSON.stringify([cut.length, cut.slice(0, 40), cut.slice(41), more.textContent,"
        " more.replaced, opened, m.collapse(items.slice(0, 80)).length,"
        " m.collapse(items, { open: true }).length,"
        " m.collapse(items, { head: 3, tail: 2 }).length]));",
        "dom.js",
    )
    n, head, tail, label, hidden, opened, short, opened_row, small = js
    assert n == 61 and head == list(range(40)) and tail == list(range(80, 100))
    assert label == "\u2026 40 more" and hidden == list(range(40, 80)) and opened == 1
    assert short == 80 and opened_row == 100 and small == 6


def test_seed_js_refuses_what_is_not_a_whole_number(tmp_path):
    js = _node(
        tmp_path,
        "console.log(JSON.stringify(['0', ' 42 ', '4294967295', '4294967296', '', 'abc', '1.5',"
        " '-1', '1e3'].map(m.parseSeed)));",
        "dom.js",
    )
    assert js == [0, 42, 4294967295, None, None, None, None, None, None]


# --- the widgets' code: bundled from its sources, stored in no notebook ---------------------------


def test_the_bundles_are_built_from_the_current_sources():
    """gptlib/widgets/static/ (committed, what a kernel sends) is what esbuild makes of js/ now."""
    build = load_module(ROOT / "scripts" / "build_widgets.py")
    why = build.missing_tools()
    if why:
        pytest.skip(
            f"cannot rebuild the widget bundles to compare ({why}); make test installs esbuild "
            "with npm ci"
        )
    assert not build.stale(), (
        "run python scripts/build_widgets.py and commit gptlib/widgets/static/"
    )
    assert sorted(p.name for p in (WIDGETS / "static").glob("*.js")) == sorted(
        f"{v}.js" for v in build.VIEWS
    )


def test_each_view_sends_its_bundle_and_the_stylesheet():
    css = (WIDGETS / "widgets.css").read_text(encoding="utf-8")
    for cls, name in (
        (BPEMergeView, "bpe"),
        (AttentionView, "attention"),
        (SamplingView, "sampling"),
        (PlaygroundView, "playground"),
    ):
        assert (
            cls._esm == (WIDGETS / "static" / f"{name}.js").read_text(encoding="utf-8")
            and cls._css == css
        )
        # one self-contained module: the view as its default export, nothing left to import
        assert re.search(r"^export \{\s+\w+ as default\s+\};$", cls._esm, re.M) and not re.search(
            r"^import ", cls._esm, re.M
        )


def test_no_chapter_stores_widget_code():
    """The notebooks keep each widget's data; the book's build adds the code
    (book_ext/widget_code.py)
    and a kernel sends it, so the JavaScript changes with no re-execution."""
    holding = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        size = code_size(json.loads(path.read_text(encoding="utf-8")))
        if size["chars"]:
            holding.append(f"{path.name} ({size['chars']:,} characters)")
    assert not holding, (
        "widget code stored in "
        + ", ".join(holding)
        + "; run scripts/execute.py --strip-only on them"
    )


def test_strip_and_add_code_round_trip():
    w = BPEMergeView(STEPS, MERGES)
    state = {k: v for k, v in _state(w).items()}
    nb = {
        "metadata": {
            "widgets": {
                WIDGET_STATE: {
                    "state": {"m": {"state": dict(state)}, "other": {"state": {"_esm": "kept"}}}
                }
            }
        }
    }
    assert strip_code(nb) == len(w._esm) + len(w._css)
    models = nb["metadata"]["widgets"][WIDGET_STATE]["state"]
    assert "_esm" not in models["m"]["state"] and models["other"]["state"] == {
        "_esm": "kept"
    }  # not a book widget
    assert (
        code_size(nb) == {"widgets": 1, "chars": 0}
        and add_code(nb) == 1
        and models["m"]["state"] == state
    )
    nb_bad = {
        "metadata": {
            "widgets": {
                WIDGET_STATE: {
                    "state": {"m": {"state": {"_anywidget_id": "gptlib.widgets.bpe.Nope"}}}
                }
            }
        }
    }
    with pytest.raises(ValueError, match="gptlib.widgets.bpe.Nope"):
        add_code(nb_bad)


# --- PlaygroundView: the stored analysis, the kernel's answers, bad input
# --------------------------


@pytest.fixture(scope="module")
def bpe_tiny():
    from gptlib.tokenizers import BPETokenizer

    tok = BPETokenizer.train(TEXT * 4, 274)  # all the merges the text allows
    torch.manual_seed(2)
    model = GPT(GPTConfig.preset("tiny", d_vocab=tok.vocab_size, n_ctx=16)).eval()
    return model, tok


def _step(model, ids, lens=(), targets=(), mask=None):
    from gptlib.step import step, step_inputs

    past, ones, lens_t, targets_t, rows = step_inputs(model, lens, targets, queries=range(len(ids)))
    mask = ones if mask is None else mask
    return step(model, torch.tensor([ids]), past, mask, lens_t, targets_t, rows)


def test_playground_stores_the_analysis_of_its_text(bpe_tiny):
    from gptlib.export import weights_sha256
    from gptlib.widgets.playground import _lens_tops

    model, tok = bpe_tiny
    text = "the cat sat on the mat. the dog sat on the log. " * 2  # longer than n_ctx = 16 tokens
    w = PlaygroundView(
        model,
        tok,
        text,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        n_show=8,
        lens_top=3,
        seed=9,
        title="t",
        layer=1,
        head=3,
        n_generate=12,
    )
    s = _state(w)
    ids = tok.encode(text)
    assert len(ids) > 16 and s["stored"]["ids"] == ids and s["text"] == text
    out = _step(model, ids[-16:], lens=[0, 1, 2])  # the window the model sees
    torch.testing.assert_close(
        torch.tensor(s["stored"]["logits"]),
        model(torch.tensor([ids[-16:]]))[0, -1],
        atol=5e-5,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.tensor(s["stored"]["patterns"]), out["attn"], atol=5e-5, rtol=0
    )
    lens = _lens_tops(out["lens_ids"], out["lens_logits"], out["lens_lse"], 3)
    assert s["stored"]["lens"] == lens and len(lens) == 3  # X_0, X_1, X_2
    # the lens's probabilities are the softmax of the read-out
    resid_last = torch.softmax(out["logits"][0].double(), -1)
    assert lens[-1]["probs"][0] == pytest.approx(resid_last.max().item(), abs=1e-4)
    top8 = torch.sort(out["logits"][0], descending=True, stable=True).indices[:8].tolist()
    needed = set(ids[-16:]) | set(top8) | {i for row in s["stored"]["lens"] for i in row["ids"]}
    assert s["tokens"] == {str(i): tok.token_str(i) for i in sorted(needed)}
    assert s["config"] == {
        "d_vocab": tok.vocab_size,
        "n_ctx": 16,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 4,
        "d_head": 16,
    }
    assert s["weights_sha256"] == weights_sha256(model) and s["source"] == "live/english.json"
    assert (s["temperature"], s["top_k"], s["top_p"], s["n_show"], s["lens_top"], s["seed"]) == (
        0.7,
        5,
        0.9,
        8,
        3,
        9,
    )
    assert (s["layer"], s["head"], s["n_generate"]) == (1, 3, 12)
    assert (s["chat"], s["chat_available"]) == (False, False)  # a BPETokenizer has no template
    assert (
        repr(w) == f"PlaygroundView(layers=2, heads=4, tokens={len(ids)}, "
        "temperature=0.7, top_k=5, top_p=0.9)"
    )
    json.dumps(s, allow_nan=False)
    assert _state(PlaygroundView(model, tok, text)) == _state(PlaygroundView(model, tok, text))


@pytest.fixture(scope="module")
def modern_tiny():
    """A tiny ModernGPT (GQA: 4 heads on 2 key-value heads) with a GGUFTokenizer that has a chat
    template and special tokens, and more tokens than LARGE_VOCAB (stored as the top logits)."""
    from gptlib.modern import ModernConfig, ModernGPT
    from gptlib.tokenizers.bpe import bytes_to_unicode as b2u  # GPT-2's byte alphabet
    from gptlib.tokenizers.gguf import GGUFTokenizer

    alphabet = b2u()
    tokens = [alphabet[b] for b in range(256)]
    tokens += [f"x{i}" for i in range(8200 - 256 - 2)] + ["<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = GGUFTokenizer(tokens, [], types, eos_id=len(tokens) - 1, chat_template=template)
    torch.manual_seed(3)
    cfg = ModernConfig.preset("tiny", d_vocab=len(tokens), n_ctx=64)
    return ModernGPT(cfg).eval(), tok


def test_playground_runs_a_modern_gpt_in_chat(modern_tiny):
    """SmolLM2's kind of model: the chat template around the text, special tokens as one id,
    the heads' key-value groups in the config, the top logits and the patterns as bytes."""
    from gptlib.widgets.continuations import TEMPERATURES
    from gptlib.widgets.playground import STORED_TOP

    model, tok = modern_tiny
    w = PlaygroundView(model, tok, "hi <|im_end|>", chat=True, source="live/smollm2.json")
    s = _state(w)
    wrapped = "<|im_start|>user\nhi <|im_end|><|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(wrapped, allowed_special="all")
    assert s["stored"]["ids"] == ids and ids[0] == tok.special_tokens["<|im_start|>"]
    assert s["chat"] and s["chat_available"] and s["config"]["n_kv_heads"] == 2
    out = _step(model, ids)
    logits = out["logits"][0]
    top = s["stored"]["top"]
    order = torch.sort(logits, descending=True, stable=True).indices
    assert top["ids"] == order[:STORED_TOP].tolist()
    torch.testing.assert_close(
        torch.tensor(top["logits"]), logits[order[:STORED_TOP]], atol=5e-5, rtol=0
    )
    # the others' weight at each slider temperature t: log sum exp((y - m)/t) over the tokens
    # not stored, m the largest logit as stored
    assert top["temperatures"] == list(TEMPERATURES)
    others, m = logits[order[STORED_TOP:]].double(), top["logits"][0]
    for t, r in zip(top["temperatures"], top["rest_logz"], strict=True):
        assert r == pytest.approx(torch.logsumexp((others - m) / t, 0).item(), abs=1e-6)
    u8 = np.frombuffer(base64.b64decode(s["stored"]["patterns_u8"]), dtype=np.uint8)
    T = len(ids)
    r, c = torch.tril_indices(T, T)
    want = torch.round(out["attn"][..., r, c] * 255).flatten().numpy()
    assert np.array_equal(u8, want.astype(np.uint8))
    sent = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))
    w._answer(w, {"kind": "start", "req": 1}, [])
    w._answer(w, {"kind": "encode", "req": 2, "text": "a<|im_end|>"}, [])
    assert sent[0][0]["chat"] == {
        "prefix": "<|im_start|>user\n",
        "suffix": "<|im_end|>\n<|im_start|>assistant\n",
        "stop": [tok.special_tokens["<|im_end|>"]],
    }
    assert sent[0][0]["special"] == tok.special_tokens
    assert sent[1][0]["ids"] == tok.encode("a<|im_end|>", allowed_special="all")
    with pytest.raises(ValueError, match="chat"):
        PlaygroundView(model, tok, "hi", chat=1)


def _plain_forward(model, ids, off=()):
    """The model's own forward pass on ``ids`` (the readable attention path, no step, no cache):
    the last position's logits, every head's pattern (L, H, T, T) and the residual streams
    X_0 .. X_L, the heads ``off`` (layer, head) removed by zeroing their pattern, so that their
    z_h, and with it their output, is 0 (their pattern is still recorded)."""
    from gptlib.hooks import capture

    patterns = []

    def hook(layer):
        def f(_module, _inputs, out):
            patterns.append(out[0].clone())  # (H, T, T)
            out = out.clone()
            for ell, h in off:
                if ell == layer:
                    out[:, h] = 0
            return out

        return f

    attns = [b.attn for b in model.blocks]
    fused = [a.fused for a in attns]
    handles = [a.hook_pattern.register_forward_hook(hook(ell)) for ell, a in enumerate(attns)]
    try:
        for a in attns:
            a.fused = False
        with torch.no_grad(), capture(model, "hook_resid") as streams:
            logits = model(torch.tensor([ids]))[0, -1]
    finally:
        for a, was in zip(attns, fused):
            a.fused = was
        for handle in handles:
            handle.remove()
    return logits, torch.stack(patterns), streams


def test_playground_answers_the_page_with_pytorch(bpe_tiny):
    """In Jupyter and Colab the page asks the kernel: each request gets one answer with its req;
    a step's buffers are the model's logits, patterns and logit lens on the whole context, under
    the mask (against the model's own forward pass, not gptlib.step.step)."""

    model, tok = bpe_tiny
    w = PlaygroundView(model, tok, "the cat")
    sent = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))
    w._answer(w, {"kind": "ping", "req": 1}, [])
    w._answer(w, {"kind": "start", "req": 2}, [])
    w._answer(w, {"kind": "encode", "req": 3, "text": "the dog é"}, [])
    ids = tok.encode("the log sat")
    mask = [1.0] * 8
    mask[5] = 0.0  # layer 1, head 1
    w._answer(
        w,
        {"kind": "step", "req": 4, "ids": ids, "mask": mask, "lens": [0, 2], "targets": [3, 4]},
        [],
    )
    w._answer(w, {"kind": "step", "req": 5, "ids": [0, tok.vocab_size]}, [])  # an id out of range
    w._answer(w, {"kind": "step", "req": 6, "ids": list(range(17))}, [])  # longer than n_ctx
    w._answer(w, {"kind": "step", "req": 7, "ids": ids, "mask": [1.0] * 7}, [])
    w._answer(w, {"kind": "fly", "req": 8}, [])
    w._answer(w, {"kind": "ping"}, [])  # no req: not a request of the page; ignored
    assert [c["req"] for c, _ in sent] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sent[0][0]["kind"] == "pong"
    started = sent[1][0]
    V = tok.vocab_size
    assert (
        started["tokens"] == [tok.token_str(i) for i in range(V)] and started["config"] == w.config
    )
    assert [base64.b64decode(b) for b in started["token_bytes"]] == [
        tok.token_bytes(i) for i in range(V)
    ]
    assert started["chat"] is None and started["lens_top"] == 10
    assert sent[2][0]["ids"] == tok.encode("the dog é")
    # the buffers against the model's own forward pass (no step, no cache), head (1, 1) removed
    # by zeroing its pattern (so z_h = 0), not by the mask's W_O rows
    logits, patterns, streams = _plain_forward(model, ids, off=[(1, 1)])
    got = dict(zip(STEP_BUFFERS, sent[3][1]))
    f32 = {k: torch.from_numpy(np.frombuffer(b, dtype=np.float32).copy()) for k, b in got.items()}
    torch.testing.assert_close(f32["logits"], logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(f32["attn"].view(patterns.shape), patterns, atol=1e-6, rtol=0)
    lens_ids = np.frombuffer(got["lens_ids"], dtype=np.int64).reshape(2, 10)
    for n, s in enumerate([0, 2]):  # the lens: ln_f(X_s) W_U at the last position, its top 10
        row = model.read_out(streams[s][:, -1:])[0, 0].double()  # (d_vocab,)
        want = torch.sort(row, descending=True, stable=True)
        assert lens_ids[n].tolist() == want.indices[:10].tolist()
        torch.testing.assert_close(
            f32["lens_logits"][n * 10 : n * 10 + 10].double(), want.values[:10], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            f32["lens_lse"][n].double(), torch.logsumexp(row, 0), atol=1e-5, rtol=0
        )
    direct = f32["direct"].view(
        2, 4, 2
    )  # (L, H, targets); checked against the logit in test_export
    assert (direct[1, 1] == 0).all() and direct.abs().max() > 0
    assert [sent[k][0]["kind"] for k in (4, 5, 6, 7)] == ["error"] * 4
    assert (
        "ids" in sent[4][0]["message"]
        and "n_ctx" in sent[5][0]["message"]
        and "mask" in sent[6][0]["message"]
        and "fly" in sent[7][0]["message"]
    )


def test_kernel_sends_only_the_rows_the_page_lacks(bpe_tiny):
    """With the heads panel's window, a step's attn holds only the rows of the queries from
    rows_from on that the window keeps, cut to its keys (key 0 and the last W - 1), and a seventh
    buffer each head's last-row entropy over every key; bad windows are refused, naming them."""
    model, tok = bpe_tiny
    w = PlaygroundView(model, tok, "the cat")
    sent = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))
    ids = tok.encode("the log sat on the mat")[:12]
    T, W = len(ids), 4
    assert T > W
    asks = [(0, T), (T - 1, T)]  # a new text; one more token (the rest held)
    for req, (rows_from, _) in enumerate(asks):
        w._answer(
            w, {"kind": "step", "req": req, "ids": ids, "window": W, "rows_from": rows_from}, []
        )
    w._answer(w, {"kind": "step", "req": 9, "ids": ids, "window": 0}, [])
    w._answer(w, {"kind": "step", "req": 10, "ids": ids, "window": W, "rows": False}, [])
    _, patterns, _ = _plain_forward(model, ids, off=[])  # (L, H, T, T)
    L, H = patterns.shape[:2]
    keys = [0, *range(T - W + 1, T)]
    for (content, buffers), (rows_from, _) in zip(sent, asks):
        assert content["kind"] == "step" and len(buffers) == 7
        first = max(rows_from, T - W + 1)
        cut = torch.from_numpy(np.frombuffer(buffers[1], dtype=np.float32).copy())
        want = patterns[:, :, first:][..., keys]  # (L, H, r, W)
        torch.testing.assert_close(cut.view(want.shape), want, atol=1e-6, rtol=0)
        ent = torch.from_numpy(np.frombuffer(buffers[6], dtype=np.float32).copy()).view(L, H)
        want_ent = torch.special.entr(patterns[:, :, -1].double()).sum(-1).float()
        torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
    assert sent[2][0]["kind"] == "error" and "window" in sent[2][0]["message"]
    assert sent[3][0]["kind"] == "error" and "rows must be true" in sent[3][0]["message"]


def test_playground_refuses_bad_input(bpe_tiny):
    from gptlib.tokenizers import BPETokenizer

    model, tok = bpe_tiny
    for kwargs, name in [
        (dict(text=""), "text"),
        (dict(text=3), "text"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=math.nan), "temperature"),
        (dict(seed=-1), "seed"),
        (dict(n_show=0), "n_show"),
        (dict(lens_top=0), "lens_top"),
        (dict(lens_top=11), "lens_top"),
        (dict(layer=2), "layer"),
        (dict(head=-1), "head"),
        (dict(head=1.0), "head"),
        (dict(n_generate=0), "n_generate"),
        (dict(chat=True), "chat"),  # a BPETokenizer has no chat template
        (dict(source="/abs/english.json"), "source"),
        (dict(source="english.onnx"), "source"),
    ]:
        with pytest.raises(ValueError, match=name):
            PlaygroundView(model, tok, **(dict(text="the cat") | kwargs))
    with pytest.raises(ValueError, match="model"):
        PlaygroundView(torch.nn.Linear(2, 2), tok, "the cat")
    with pytest.raises(ValueError, match="tokenizer"):
        PlaygroundView(model, CharTokenizer.train(TEXT), "the cat")
    with pytest.raises(ValueError, match="tokens"):
        PlaygroundView(
            model, BPETokenizer.train(TEXT * 4, 270), "the cat"
        )  # another vocabulary size
    broken = GPT(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.blocks[0].attn.W_Q.fill_(math.nan)
    with pytest.raises(ValueError, match="non-finite"):
        PlaygroundView(broken, tok, "the cat")


def test_live_js_cache_plan_and_rows(tmp_path):
    """The page's cache (page.js): the longest cached prefix under the same mask is kept (no more
    than the positions whose rows are held, when the rows are wanted), the last position runs
    again when nothing is new, a mask change recomputes everything; the cache, position first, is
    fed as a view of its first P positions and grows by half (the attention rows it keeps:
    tests/test_rows_js.py)."""
    js = _node(
        tmp_path,
        """
const out = {};
out.plans = [
  m.plan([1, 2, 3], "a", [1, 2, 3, 4, 5], "a"),
  m.plan([1, 2, 3], "a", [1, 2, 3], "a"),
  m.plan([1, 2, 3], "a", [1, 2], "a"),
  m.plan([1, 2, 3], "a", [1, 9, 3, 4], "a"),
  m.plan([1, 2, 3], "a", [1, 2, 3, 4], "b"),
  m.plan([], "", [7], "a"),
  m.plan([1, 2, 3], "a", [1, 2, 3, 4, 5], "a", 1),
];
const store = m.kvStore(2, 2);  // 2 floats a position, room for 2
store.put(0, Float32Array.from([1, 1, 2, 2]));
store.put(2, Float32Array.from([3, 3, 4, 4, 5, 5]));  // grows by half: 2, 3, 5 positions
const view = store.past(4);
store.put(1, Float32Array.from([9, 9]));  // a step from position 1: what came after is stale
out.store = { capacity: store.capacity, past: Array.from(store.past(3)), shared: view[2] };
out.lens = n.lensTops(BigInt64Array.from([5n, 2n, 7n, 1n]), Float32Array.from([0, -1, 2, 1]),
                      Float32Array.from([1, 3]), 2, 2);
console.log(JSON.stringify(out));
""",
        "page.js",
        "backend.js",
    )
    assert js["plans"] == [
        {"keep": 3, "feed": [4, 5]},
        {"keep": 2, "feed": [3]},
        {"keep": 1, "feed": [2]},
        {"keep": 1, "feed": [9, 3, 4]},
        {"keep": 0, "feed": [1, 2, 3, 4]},
        {"keep": 0, "feed": [7]},
        {"keep": 1, "feed": [2, 3, 4, 5]},
    ]
    assert js["store"] == {"capacity": 5, "past": [1, 1, 9, 9, 3, 3], "shared": 9}
    assert js["lens"][0]["ids"] == [5, 2] and js["lens"][1]["ids"] == [7, 1]
    assert js["lens"][0]["probs"] == pytest.approx([math.exp(-1), math.exp(-2)], rel=1e-6)
    assert js["lens"][1]["probs"] == pytest.approx([math.exp(-1), math.exp(-2)], rel=1e-6)


def test_live_js_checks_the_manifest(tmp_path):
    """A version-1 manifest, or pieces that do not add up to the model's bytes, are refused."""
    js = _node(
        tmp_path,
        """
const pieces = [{ bytes: 3 }, { bytes: 2 }];
const ok = { format: "gptlib-live", version: 5, onnx: { bytes: 5, pieces } };
const errors = [
  { ...ok, version: 1 },
  { ...ok, onnx: { bytes: 6, pieces } },
  { ...ok, onnx: { bytes: 0, pieces: [] } },
].map((bad) => {
  try { m.checkManifest(bad, "x.json"); return null; } catch (e) { return e.message; }
});
const good = m.checkManifest(ok, "x.json") === ok;
console.log(JSON.stringify({ ok: good, errors, mb: n.megabytes(123456789) }));
""",
        "page.js",
        "live.js",
    )
    assert js["ok"] and js["mb"] == "123.5 MB"
    assert "version 5" in js["errors"][0] and all("add up" in e for e in js["errors"][1:])


def test_playground_js_reads_the_stored_bytes(tmp_path, modern_tiny):
    """The page's reading of a large vocabulary's stored analysis: the patterns' bytes back to
    rows within 1/510 of the weights, the top logits with the others at -inf."""
    model, tok = modern_tiny
    w = PlaygroundView(model, tok, "hi there", chat=True)
    s = _state(w)
    js = _node(
        tmp_path,
        f"""
const s = {json.dumps(s["stored"])}, cfg = {json.dumps(s["config"])};
const a = m.fromStored(s, cfg);
const ids = s.top.ids;
console.log(JSON.stringify({{
  patterns: a.patterns.map((l) => l.map((h) => h.map((r) => Array.from(r)))),
  listed: ids.map((i) => a.logits[i]), finite: Array.from(a.logits).filter(Number.isFinite).length,
  rest: a.rest.logZ, temps: a.rest.temps }}));
""",
        "analysis.js",
    )
    out = _step(model, s["stored"]["ids"])
    A = out["attn"]
    for l, layer in enumerate(js["patterns"]):
        for h, rows in enumerate(layer):
            for i, row in enumerate(rows):
                assert len(row) == i + 1
                assert np.abs(np.array(row) - A[l, h, i, : i + 1].numpy()).max() <= 1 / 510 + 1e-6
    assert js["listed"] == pytest.approx(s["stored"]["top"]["logits"], abs=1e-6)
    assert js["finite"] == len(s["stored"]["top"]["ids"])
    assert js["rest"] == s["stored"]["top"]["rest_logz"]
    assert js["temps"] == s["stored"]["top"]["temperatures"]


def test_playground_stored_view_is_right_at_every_temperature(tmp_path, modern_tiny):
    """The stored view (no model running) of a large vocabulary: at every temperature the slider
    offers, a stored token's probability equals the full softmax(y / t), the others' weight
    included; the temperature-1 normaliser alone would be wrong as soon as t moves."""
    model, tok = modern_tiny
    w = PlaygroundView(model, tok, "hi there", chat=True)
    s = _state(w)
    temps = [0.05, 0.5, 1.0, 1.7, 3.0]
    js = _node(
        tmp_path,
        f"""
const s = {json.dumps(s["stored"])}, cfg = {json.dumps(s["config"])};
const a = m.fromStored(s, cfg);
console.log(JSON.stringify({json.dumps(temps)}.map((t) => {{
  const d = n.distribution(a.logits, t, 0, 1, m.restLogZAt(a.rest, t));
  return {{ p: s.top.ids.map((i) => d.p[i]), rest: d.rest }};
}})));
""",
        "analysis.js",
        also="distribution.js",
    )
    logits = _step(model, s["stored"]["ids"])["logits"][0].double()
    ids = s["stored"]["top"]["ids"]
    for t, got in zip(temps, js, strict=True):
        want = torch.softmax(logits / t, 0)
        # the stored logits are rounded to 4 decimals: a relative 1e-4 / t in each probability
        torch.testing.assert_close(
            torch.tensor(got["p"], dtype=torch.float64), want[ids], rtol=2e-4 / t, atol=1e-9
        )
        assert got["rest"] == pytest.approx(1 - want[ids].sum().item(), abs=2e-4 / t)


def test_live_js_one_page_backend_per_model(tmp_path):
    """page.js's sharedPageBackend: every view of one model (manifest and weights) on a page gets
    the first view's backend, started once; another model gets its own; a start that fails (the
    reader said "not now") is forgotten, so the next view starts again."""
    js = _node(
        tmp_path,
        """
const starts = [];
const start = async (source, sha, hooks) => {
  starts.push([source, sha, hooks.name]);
  if (hooks.fail) throw new Error("declined");
  return { source, sha, by: hooks.name };
};
const a = await m.sharedPageBackend("live/english.json", "s1", { name: "sampling" }, start);
const b = await m.sharedPageBackend("live/english.json", "s1", { name: "playground" }, start);
const c = await m.sharedPageBackend("live/smollm2.json", "s2", { name: "smol" }, start);
let failed = null;
try {
  await m.sharedPageBackend("live/other.json", "", { name: "x", fail: true }, start);
} catch (e) { failed = e.message; }
const again = await m.sharedPageBackend("live/other.json", "", { name: "y" }, start);
console.log(JSON.stringify({ same: a === b, by: b.by, other: c !== a, failed, again: again.by,
                             starts }));
""",
        "page.js",
    )
    assert js["same"] and js["by"] == "sampling" and js["other"]
    assert js["failed"] == "declined" and js["again"] == "y"
    assert [s[2] for s in js["starts"]] == ["sampling", "smol", "x", "y"]


def test_live_js_connect_uses_the_kernel_that_answers(tmp_path):
    """live.js's connect in Jupyter or Colab: the kernel answers its ping, and every call of
    backend() gives the one kernel backend of the view (started once: one start request)."""
    js = _node(
        tmp_path,
        """
const sent = [];
let listener = null;
const fake = {
  on: (name, f) => { listener = f; },
  off: () => {},
  get: () => "",
  send: (content) => {
    sent.push(content.kind);
    const reply = content.kind === "ping" ? { kind: "pong" }
      : { kind: "started", config: { n_layers: 1, n_heads: 1 }, lens_top: 10, tokens: ["a"],
          token_bytes: ["YQ=="] };
    setTimeout(() => listener({ ...reply, req: content.req }, []), 1);
  },
};
const link = m.connect(fake);
const kernel = await link.kernel;
const [b1, b2] = await Promise.all([link.backend(), link.backend()]);
link.close();
console.log(JSON.stringify({ kernel, kind: b1.kind, same: b1 === b2, sent,
                             bytes: Array.from(b1.bytes[0]) }));
""",
        "live.js",
    )
    assert js["kernel"] and js["kind"] == "kernel" and js["same"]
    assert js["sent"] == ["ping", "start"] and js["bytes"] == [97]


def test_playground_js_talks_to_the_kernel(tmp_path, bpe_tiny):
    """The page's side of the kernel protocol (Jupyter, Colab; kernel.js), against the Python
    side's answers (LiveKernel): a fake widget model hands each request's answer back to the page,
    buffers as DataViews, as ipywidgets does. The first ping is lost (a comm still opening): the
    page pings again rather than concluding that no kernel listens; a pong that comes after its
    wait (a kernel busy with "Run All") still counts; a step without rows gets none, and a step
    the kernel does not answer in time fails saying so."""
    model, tok = bpe_tiny
    w = PlaygroundView(model, tok, "the cat")

    def answer(content):
        sent = []
        w.send = lambda c, buffers=None: sent.append(
            (c, [base64.b64encode(b).decode() for b in buffers or []])
        )
        w._answer(w, content | {"req": 0}, [])
        return sent[0]

    ids = tok.encode("the dog sat")
    mask = [1.0, 0.0] + [1.0] * 6
    replies = [
        answer(content)
        for content in [
            {"kind": "start"},
            {"kind": "encode", "text": "the dog sat"},
            {"kind": "step", "ids": ids, "mask": mask, "lens": [0, 1, 2], "targets": [7]}
            | {"window": 128, "rows_from": 0},  # what the page asks: rows.js's window
            {"kind": "step", "ids": ids, "mask": None, "lens": [], "targets": [-1], "rows": False},
            {"kind": "step", "ids": [-1], "mask": None, "lens": None, "targets": None},
        ]
    ]
    js = _node(
        tmp_path,
        f"""
const replies = {json.dumps(replies)};
let listener = null, pings = 0, next = 0;
const windows = [];  // each step's window and rows_from: only a step with rows has them
const fake = {{
  on: (name, f) => {{ listener = f; }},
  off: () => {{}},
  send: (content) => setTimeout(() => {{
    if (content.kind === "step") windows.push([content.window ?? null, content.rows_from ?? null]);
    if (content.kind === "ping") {{
      if (pings++ > 0) listener({{ kind: "pong", req: content.req }}, []);
      return;
    }}
    const [msg, bufs] = replies[next++];
    listener({{ ...msg, req: content.req }}, bufs.map((b) => {{
      const u = Uint8Array.from(Buffer.from(b, "base64"));
      return new DataView(u.buffer);
    }}));
  }}, 1),
}};
const ask = m.kernelLink(fake);
const pinged = await m.pingKernel(ask, [100, 100]);
const k = await m.kernelBackend(ask);
const ids = await k.encode("the dog sat");
const r = await k.run(ids, {{ mask: {json.dumps(mask)}, lens: [0, 1, 2], targets: [7],
                             rows: true }});
const bare = await k.run(ids, {{ lens: [], targets: [-1] }});
let error = null;
try {{ await k.run([-1]); }} catch (e) {{ error = e.message; }}
ask.close();
const silent = m.kernelLink({{ on: () => {{}}, off: () => {{}}, send: () => {{}} }});
const alone = await m.pingKernel(silent, [20, 20]);  // a static page: nobody answers
let late = null;  // answers each message 150 ms later: after the ping's wait, before the last
const slow = m.kernelLink({{ on: (n, f) => {{ late = f; }}, off: () => {{}},
  send: (c) => {{
    if (c.kind === "ping") setTimeout(() => late({{ kind: "pong", req: c.req }}), 150); }} }});
const busy = await m.pingKernel(slow, [50, 200]);
let timeout = null;  // a kernel that starts, then never answers a step
const mute = m.kernelLink({{ on: () => {{}}, off: () => {{}}, send: () => {{}} }});
const started = {{ msg: {{ config: k.config, lens_top: 10, tokens: [], token_bytes: [] }} }};
const k4 = await m.kernelBackend(async (c, t) => (c.kind === "start" ? started : mute(c, t)), 30);
try {{ await k4.run([1]); }}
catch (e) {{ timeout = [e.message, e.timeout]; }}
mute.close(); slow.close();
console.log(JSON.stringify({{
  pinged, pings, alone, windows, kind: k.kind, config: k.config, tokens: k.tokens,
  bytes: k.bytes.map((b) => Array.from(b)), ids, logits: Array.from(r.logits),
  patterns: r.patterns.map((l) => l.map((h) => h.map((q) => Array.from(q)))),
  lens: r.lens, direct: Array.from(r.direct), chat: k.chat, error, busy, timeout,
  bare: [bare.patterns, bare.lens, Array.from(bare.direct)] }}));
""",
        "kernel.js",
    )
    assert js["pinged"] and js["pings"] == 2 and not js["alone"]
    assert js["windows"] == [[128, 0], [None, None], [None, None]]
    assert js["kind"] == "kernel" and js["config"] == w.config and js["ids"] == ids
    assert js["tokens"] == [tok.token_str(i) for i in range(tok.vocab_size)]
    assert [bytes(b) for b in js["bytes"]] == [tok.token_bytes(i) for i in range(tok.vocab_size)]
    # what the page reads is what the model computes (its own forward pass, head (0, 1) removed)
    logits, patterns, streams = _plain_forward(model, ids, off=[(0, 1)])
    assert js["logits"] == pytest.approx(logits.tolist(), abs=1e-5)
    for l, layer in enumerate(js["patterns"]):  # each row over its keys 0..i
        for h, rows in enumerate(layer):
            assert len(rows) == len(ids)
            for i, row in enumerate(rows):
                np.testing.assert_allclose(row, patterns[l, h, i, : i + 1].numpy(), atol=1e-6)
    for r, s in zip(js["lens"], streams):
        p = torch.softmax(model.read_out(s[:, -1:])[0, 0].double(), -1)
        top = torch.sort(p, descending=True, stable=True)
        assert r["ids"] == top.indices[:10].tolist()
        assert r["probs"] == pytest.approx(top.values[:10].tolist(), abs=1e-6)
    assert len(js["direct"]) == 8 and js["direct"][1] == 0 and js["chat"] is None
    assert "ids" in js["error"]
    assert js["busy"] and js["timeout"][1] and "no answer within 0.03 s" in js["timeout"][0]
    # no rows, no lens, the contributions to the most probable token (no head removed)
    top = int(np.argmax(_plain_forward(model, ids)[0]))
    want = w._step(ids, None, (), [top])["direct"].flatten().tolist()
    assert js["bare"][0] is None and js["bare"][1] == []
    assert js["bare"][2] == pytest.approx(want, abs=1e-6)


# --- a hostile caller: each bad argument is a ValueError naming it -------------------------------


def test_a_string_is_not_a_list_of_strings():
    """tokens="abc" is not three tokens, nor is a step given as one string."""
    with pytest.raises(ValueError, match="tokens must be a list of strings"):
        SamplingView([1.0, 2.0, 3.0], "abc")
    with pytest.raises(ValueError, match="tokens must be a list of strings"):
        AttentionView("ab", [[[[1.0, 0.0], [0.25, 0.75]]]])
    with pytest.raises(ValueError, match=r"steps\[0\] must be a list of strings"):
        BPEMergeView(["the"], [])
    with pytest.raises(ValueError, match="merges must be a list of strings"):
        BPEMergeView([list("ab"), ["ab"]], "a")


def test_bpe_steps_hold_pieces_of_a_text():
    """An empty piece is no token, and a view of no text shows nothing."""
    with pytest.raises(ValueError, match="empty piece"):
        BPEMergeView([["", "the"]], [])
    with pytest.raises(ValueError, match="no text"):
        BPEMergeView([[]], [])


@pytest.mark.parametrize(
    "make",
    [
        lambda title: BPEMergeView([["a"]], [], title=title),
        lambda title: AttentionView(["a"], [[[[1.0]]]], title=title),
        lambda title: SamplingView([1.0], ["a"], title=title),
    ],
)
def test_a_title_is_a_str(make):
    for bad in (None, 5, ["t"]):
        with pytest.raises(ValueError, match="title must be a str"):  # not traitlets' TraitError
            make(bad)


def test_attention_rows_are_causal_distributions():
    """Row i is the distribution of query i over the keys j <= i: the scores compare a head with a
    uniform causal one. A row that does not sum to 1, or that looks ahead, is no such pattern."""
    with pytest.raises(ValueError, match=r"row .* sums to 0.5"):
        AttentionView(["a", "b"], [[[[1.0, 0.0], [0.25, 0.25]]]])
    with pytest.raises(ValueError, match="causal"):
        AttentionView(["a", "b"], [[[[0.5, 0.5], [0.25, 0.75]]]])
    with pytest.raises(ValueError, match="patterns must hold numbers"):
        AttentionView(["a", "b"], [[[[True, False], [0.25, 0.75]]]])
    AttentionView(list("abcd"), _patterns(2, 2))  # softmax rows: sums 1 up to rounding


def test_top_logits_and_rest_log_weights_check_their_input():
    y = torch.tensor([2.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="n must"):
        top_logits(y, True)  # a bool is not a count
    with pytest.raises(ValueError, match="logits must be a tensor"):
        top_logits([2.0, 1.0], 1)
    # a negative id is not the last token; t <= 0, a NaN reference or NaN logits would store
    # NaN or a weight of the wrong sign
    for kwargs, name in (
        ({"stored": [-1]}, "stored"),
        ({"stored": [3]}, "stored"),
        ({"stored": [0.5]}, "stored"),
        ({"temperatures": [0.0]}, "temperatures"),
        ({"temperatures": [-1.0]}, "temperatures"),
        ({"temperatures": [math.nan]}, "temperatures"),
        ({"reference": math.nan}, "reference"),
        ({"logits": torch.tensor([2.0, math.nan, 0.0])}, "logits"),
    ):
        with pytest.raises(ValueError, match=name):
            rest_log_weights(**({"logits": y, "stored": [0], "temperatures": [1.0]} | kwargs))


def test_continuation_tree_context_is_token_ids():
    """[0.7] is not [0], [True] not [1], and the string "01" not the ids 0, 1."""
    next_logits, _ = _bigram(torch.zeros(3, 3))
    for bad in ([0.7], [True], "01", [-1]):
        with pytest.raises(ValueError, match="context"):
            continuation_tree(next_logits, bad, 1, 1, 2, 2)
    with pytest.raises(ValueError, match="temperatures"):
        continuation_tree(next_logits, [0], 1, 1, 2, 2, temperatures=[0.0])
    with pytest.raises(ValueError, match="ndigits"):
        continuation_tree(next_logits, [0], 1, 1, 2, 2, ndigits=1.5)


def test_from_model_needs_the_models_vocabulary(bpe_tiny):
    """PlaygroundView and from_model both refuse a tokenizer of another size, naming the sizes
    (not an id out of range in token_str)."""
    from gptlib.tokenizers import BPETokenizer

    model, _ = bpe_tiny
    other = BPETokenizer.train(TEXT * 4, 270)
    with pytest.raises(ValueError, match="tokenizer has 270 tokens, the model d_vocab=274"):
        SamplingView.from_model(model, other, ["the cat"], depth=1, n_logits=274)
