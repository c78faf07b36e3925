"""The book's widgets: their state (all data synced), validation, deterministic reprs, and the
sampling view's JavaScript distribution against gptlib.sampling.next_token_probs (run with node)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from gptlib.sampling import next_token_probs
from gptlib.widgets import AttentionView, BPEMergeView, SamplingView
from gptlib.widgets.sampling import KEPT_WHEN_LARGER, MAX_FULL_VOCAB

WIDGETS = Path(__file__).resolve().parents[1] / "gptlib" / "widgets"

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
    assert s["_esm"] == (WIDGETS / "bpe.js").read_text(encoding="utf-8")
    json.dumps(s)  # what the HTML book embeds


def test_bpe_repr_is_deterministic():
    a, b = BPEMergeView(STEPS, MERGES), BPEMergeView(STEPS, MERGES)
    assert repr(a) == repr(b) == "BPEMergeView(merges=2, pieces=[7, 5])"
    assert "0x" not in repr(a) and a.model_id not in repr(a)
    assert _state(a) == _state(b)


@pytest.mark.parametrize(
    "steps, merges",
    [(STEPS, MERGES[:1]), (STEPS[:1], MERGES), ([], []), ([list("ab"), ["ab"], ["ba"]], ["x", "y"])],
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
    w = AttentionView(list("abcd"), _patterns(1, 2), layer_labels=["L5"], head_labels=["prev", "self"])
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


# --- SamplingView -------------------------------------------------------------------------------


def test_sampling_state_and_repr():
    logits = torch.tensor([10.0, 6.0, 4.0])
    w = SamplingView(logits, ["a", "b", "c"], temperature=0.5, top_k=2, top_p=0.9, n_show=5, title="x")
    s = _state(w)
    assert s["logits"] == [10.0, 6.0, 4.0] and s["tokens"] == ["a", "b", "c"] and s["ids"] == [0, 1, 2]
    assert (s["temperature"], s["top_k"], s["top_p"], s["n_show"]) == (0.5, 2, 0.9, 3)
    assert repr(w) == "SamplingView(vocab=3, temperature=0.5, top_k=2, top_p=0.9)"
    d = SamplingView([1.0, 2.0], ["a", "b"])
    assert (d.top_k, d.top_p) == (0, 1.0)  # off
    assert repr(d) == "SamplingView(vocab=2, temperature=1.0, top_k=None, top_p=1.0)"


def test_sampling_logits_rounded_and_deterministic():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(100, generator=g)
    a, b = SamplingView(logits, [str(i) for i in range(100)]), SamplingView(logits, [str(i) for i in range(100)])
    assert _state(a) == _state(b)
    assert all(round(x, 6) == x for x in a.logits)
    assert max(abs(x - y) for x, y in zip(a.logits, logits.tolist())) <= 5e-7


def test_sampling_keeps_full_vocab_up_to_8192_then_top_4096():
    g = torch.Generator().manual_seed(1)
    small = torch.randn(MAX_FULL_VOCAB, generator=g)
    assert len(SamplingView(small, [str(i) for i in range(MAX_FULL_VOCAB)]).logits) == MAX_FULL_VOCAB
    big = torch.randn(MAX_FULL_VOCAB + 1, generator=g)
    w = SamplingView(big, [f"t{i}" for i in range(len(big))])
    top = torch.topk(big, KEPT_WHEN_LARGER).indices.sort().values.tolist()
    assert w.ids == top and w.tokens == [f"t{i}" for i in top]
    assert len(w.logits) == KEPT_WHEN_LARGER


def test_sampling_minus_inf_logits_become_zero_probability():
    w = SamplingView([0.0, -math.inf, 1.0], ["a", "b", "c"])
    json.dumps(_state(w), allow_nan=False)  # valid JSON for the browser
    p = next_token_probs(torch.tensor(w.logits, dtype=torch.float64))
    assert p[1] == 0


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
    ],
)
def test_sampling_rejects_bad_input(kwargs, name):
    args = dict(logits=[1.0, 2.0], tokens=["a", "b"]) | kwargs
    with pytest.raises(ValueError, match=name):
        SamplingView(**args)


# --- the sampling view's JavaScript against Python ---------------------------------------------

SETTINGS = [
    (1.0, None, None), (0.7, None, None), (2.5, None, None), (0.0, None, None), (0.0, 3, 0.5),
    (1.0, 1, None), (1.0, 5, None), (1.0, 64, None), (1.0, 1000, None), (1.0, None, 0.05),
    (1.0, None, 0.5), (1.0, None, 0.9), (1.0, None, 1.0), (0.6, 10, 0.8), (1.8, 20, 0.95),
]


def test_sampling_js_equals_next_token_probs(tmp_path):
    """nextTokenProbs in sampling.js (what the book's readers see) equals gptlib's, to 1e-9."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the browser test still compares the two")
    g = torch.Generator().manual_seed(7)
    cases = [(torch.randn(64, generator=g) * 3).double() for _ in range(3)]
    cases.append(torch.tensor([2.0, 2.0, 1.0, 2.0, 0.0, -1e30], dtype=torch.float64))  # ties, masked
    module = tmp_path / "sampling.mjs"
    shutil.copy(WIDGETS / "sampling.js", module)
    calls = [(c.tolist(), t, k or 0, p if p is not None else 1.0) for c in cases for (t, k, p) in SETTINGS]
    script = (
        f"import {{ nextTokenProbs }} from {json.dumps(module.as_uri())};\n"
        f"const calls = {json.dumps(calls)};\n"
        "console.log(JSON.stringify(calls.map(([l, t, k, p]) => nextTokenProbs(l, t, k, p))));\n"
    )
    out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    for (logits, t, k, p), probs in zip(calls, js):
        want = next_token_probs(torch.tensor(logits, dtype=torch.float64), temperature=t,
                                top_k=k or None, top_p=p if p < 1 else None)
        torch.testing.assert_close(torch.tensor(probs, dtype=torch.float64), want, atol=1e-9, rtol=0,
                                   msg=lambda m: f"T={t} top_k={k} top_p={p}: {m}")


# --- the chapters' stored widget state is the current widget code -------------------------------


def test_chapters_store_the_current_widget_code():
    """The HTML book runs the JS/CSS stored in each notebook's widget state, which nbval does not
    compare: after editing a widget's .js or .css, re-execute the chapters that show it."""
    import importlib

    stale = []
    for path in sorted((WIDGETS.parents[1] / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        for model in state.get("state", {}).values():
            wid = model.get("state", {}).get("_anywidget_id", "")
            if not wid.startswith("gptlib.widgets."):
                continue
            module, name = wid.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            for trait in ("_esm", "_css"):
                if model["state"].get(trait) != getattr(cls, trait):
                    stale.append(f"{path.name}: {name}.{trait}")
    assert not stale, ("stored widget code is out of date; run scripts/execute.py on these chapters: "
                       + ", ".join(stale))
