"""gptlib.head_trace: every stage of one head at one query equals what the model computes.

Peers: the keys and values the model's attention layers write to a KVCache (rotated, for a
ModernGPT), the pattern row that capture_patterns records, the attention layer's own output (the
fused kernel) as the sum of its heads' outputs at the query plus b_O, RoPE's relative form
q rho_(t-n) K[n]^T on the unrotated rows (Chapter 12), and the direct attribution of
gptlib.step.step (at the last position of the context, or of a prefix ending at the query).
Float32 throughout: every comparison is to ATOL = 1e-5, RTOL = 1e-4 (the two sides sum the same
products in other orders, over at most d_model = 64 terms).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptlib.circuits import ablate_heads
from gptlib.head_trace import HeadTrace, head_trace, ln_f_frozen
from gptlib.hooks import capture_patterns
from gptlib.kvcache import KVCache
from gptlib.modern import ModernGPT, apply_rope
from gptlib.positional import sinusoidal_frequencies
from gptlib.step import head_input, step, step_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {"atol": 1e-5, "rtol": 1e-4}
IDS = [5, 17, 3, 17, 9, 5, 17]
TARGET = 11


def close(actual, expected, msg=""):
    torch.testing.assert_close(
        torch.as_tensor(actual), torch.as_tensor(expected), **TOL, msg=lambda m: f"{msg}: {m}"
    )


@pytest.fixture(params=["gpt", "gpt-post-ln", "gpt-parallel-no-bias", "modern"])
def model(request, tiny_gpt, tiny_modern):
    """The tiny models, with GPT's other block forms (the head reads X, not LN_1(X), in a post-LN
    block) and without biases; their biases and norm gains drawn away from 0 and 1, so that
    every bias and gain enters the comparisons."""
    build = {
        "gpt": lambda: tiny_gpt(seed=3),
        "gpt-post-ln": lambda: tiny_gpt(seed=3, block="post_ln"),
        "gpt-parallel-no-bias": lambda: tiny_gpt(seed=3, block="parallel", bias=False),
        "modern": lambda: tiny_modern(seed=3),
    }[request.param]
    return _perturbed(build())


def _perturbed(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # biases b_*, gains w, LayerNorm's b
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _attn_io(model, ids, layer):
    """The attention layer's input rows and output rows (T, d_model), from the model's own pass."""
    seen = {}
    attn = model.blocks[layer].attn
    h = attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0][0], y=out[0]))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        h.remove()
    return seen["x"], seen["y"]


def test_keys_and_values_are_the_cache_and_the_pattern_is_the_captured_row(model):
    cache = KVCache(model.config.n_layers)
    with torch.no_grad(), capture_patterns(model) as patterns:
        model(torch.tensor([IDS]), cache)
    T = len(IDS)
    for layer in range(model.config.n_layers):
        for head in range(model.config.n_heads):
            for t in (0, 3, T - 1):
                tr = head_trace(model, IDS, layer, head, t, TARGET)
                where = f"layer {layer} head {head} t {t}"
                close(tr.k, cache.k[layer][0, tr.kv_head], where + " keys")
                close(tr.v, cache.v[layer][0, tr.kv_head], where + " values")
                close(tr.pattern, patterns[layer][0, head, t], where + " pattern")
                assert float(tr.pattern.sum()) == pytest.approx(1.0, abs=1e-6)
                assert tr.pattern[t + 1 :].eq(0).all() and tr.mask[t + 1 :].eq(-math.inf).all()
                assert tr.mask[: t + 1].eq(0).all()


def test_heads_sum_to_the_layers_output(model):
    """The attention layer (its fused kernel) at the query is the sum of its heads' outputs z W_O^h
    (plus b_O in a GPT): the queries, keys, values, GQA's sharing and W_O's slices all enter."""
    for layer in range(model.config.n_layers):
        _, y = _attn_io(model, IDS, layer)
        for t in (0, 4, len(IDS) - 1):
            outs = [
                head_trace(model, IDS, layer, h, t, TARGET) for h in range(model.config.n_heads)
            ]
            total = torch.stack([tr.out for tr in outs]).sum(0)
            b_O = getattr(model.blocks[layer].attn, "b_O", None)
            close(total + (0 if b_O is None else b_O.detach()), y[t], f"layer {layer} t {t}")
            for tr in outs:
                close(tr.z, tr.pattern @ tr.v, "z")
                close(tr.out, tr.z @ tr.W_O, "out")
                close(tr.scaled, tr.scores / math.sqrt(tr.q.shape[0]), "scaled")
                close(tr.scores, tr.k @ tr.q, "scores")


def test_gqa_heads_share_their_key_value_head(tiny_modern):
    model = tiny_modern(seed=1)  # 4 query heads, 2 key-value heads: G = 2
    trs = [head_trace(model, IDS, 0, h, 5, TARGET) for h in range(4)]
    assert [tr.kv_head for tr in trs] == [0, 0, 1, 1] and {tr.group for tr in trs} == {2}
    assert torch.equal(trs[0].k, trs[1].k) and torch.equal(trs[2].v, trs[3].v)
    assert not torch.equal(trs[0].q, trs[1].q) and not torch.equal(trs[1].k, trs[2].k)


def test_rope_scores_depend_on_the_offset(tiny_modern):
    """Each score equals rope(q_raw, t - n) . K_raw[n] (eq. ch12-rope-relative), and the chosen
    pair's part of it is that pair of the rotated rows, its angles t theta_i, n theta_i."""
    model = tiny_modern(seed=2)
    d_head = model.config.d_head
    t = len(IDS) - 1
    for pair in (0, 1, d_head // 2 - 1):
        tr = head_trace(model, IDS, 1, 2, t, TARGET, pair=pair)
        theta = model.config.rope_base ** (-2 * pair / d_head)
        assert tr.theta == pytest.approx(theta, rel=1e-12)
        assert tr.angle_q == pytest.approx(t * theta, rel=1e-12)
        n = torch.arange(len(IDS), dtype=torch.float64)
        close(tr.angle_k, n * theta, "angle_k")
        close(tr.angle_rel, (t - n) * theta, "angle_rel")
        for j in range(len(IDS)):
            rel = (t - j) * sinusoidal_frequencies(d_head, model.config.rope_base)  # (d_head/2,)
            q_rel = apply_rope(tr.q_raw[None], rel[None])[0]  # q rho_(t-n)
            close(tr.scores[j], q_rel @ tr.k_raw[j], f"pair {pair} key {j}")
            i = slice(2 * pair, 2 * pair + 2)
            close(tr.pair_scores[j], q_rel[i] @ tr.k_raw[j, i], f"pair {pair} key {j} part")


def test_gpt_has_no_rope(tiny_gpt):
    tr = head_trace(tiny_gpt(seed=0), IDS, 1, 0, 2, TARGET)
    assert tr.pair is None and tr.theta is None and tr.pair_scores is None and tr.group == 1
    assert torch.equal(tr.q, tr.q_raw) and torch.equal(tr.k, tr.k_raw)


def test_contribution_is_steps_direct_attribution(model):
    """At the last position the contribution is step's ``direct`` for that head and target; at an
    earlier query it is step's on the prefix that ends there (causality: the same head)."""
    L, H = model.config.n_layers, model.config.n_heads
    for t in (len(IDS) - 1, 2):
        prefix = torch.tensor([IDS[: t + 1]])
        direct = step(model, prefix, *step_inputs(model, targets=[TARGET, 4]))["direct"]
        for layer in range(L):
            for head in range(H):
                for col, v in enumerate((TARGET, 4)):
                    tr = head_trace(model, IDS, layer, head, t, v)
                    close(tr.contribution, direct[layer, head, col], f"{layer}.{head} t={t}")
                    close(tr.contribution, tr.ln_out @ tr.W_U_v, "ln_out . W_U[:, v]")


def test_steps_head_outputs_are_head_traces_inputs(model):
    """What the step graph hands the head view for (layer, h, t, v) equals head_trace's stages:
    the query (after RoPE), W_O^h, ln_f's normaliser and gain at X_L[t], W_U[:, v]; asked at a
    new query after a cached prefix, and none asked gives empty outputs. A head the mask removes
    hands over W_O^h = 0, as its direct attribution is 0."""
    L, H = model.config.n_layers, model.config.n_heads
    P = 3
    past = step(model, torch.tensor([IDS[:P]]), *step_inputs(model))["kv"]
    asked = [(layer, h, t, v) for layer in range(L) for h in range(H) for t, v in ((0, 4), (3, 9))]
    _, mask, lens, targets, queries = step_inputs(model)
    mask[L - 1, 1] = 0.0
    out = step(model, torch.tensor([IDS[P:]]), past, mask, lens, targets, queries,
               head_input(model, asked))  # fmt: skip
    for k, (layer, h, t, v) in enumerate(asked):
        with ablate_heads(model, [(L - 1, 1)]):  # W_O^h = 0, as the mask 0 scales it
            tr = head_trace(model, IDS, layer, h, P + t, v)
            W_O = tr.W_O.clone()  # a view of the weights, which the block restores
        where = f"{layer}.{h} t={P + t}"
        close(out["head_q"][k], tr.q, f"{where} q")
        close(out["head_W_O"][k], W_O, f"{where} W_O^h")
        assert bool(W_O.any()) != ((layer, h) == (L - 1, 1))
        close(out["head_ln_scale"][k], tr.ln_scale, f"{where} ln_f's normaliser")
        close(out["head_ln_w"][k], tr.ln_w, f"{where} ln_f's gain")
        close(out["head_W_U"][k], tr.W_U_v, f"{where} W_U[:, v]")
    none = step(model, torch.tensor([IDS[P:]]), past, *step_inputs(model)[1:])
    assert [tuple(none[k].shape[:1]) for k in ("head_q", "head_W_O", "head_ln_scale")] == [(0,)] * 3
    with pytest.raises(ValueError, match="head"):  # t = 4 is not one of the 4 new queries
        step(model, torch.tensor([IDS[P:]]), past, *step_inputs(model)[1:],
             head_input(model, [(0, 0, 4, 1)]))  # fmt: skip


def test_ln_f_frozen_is_ln_fs_derivative(model):
    """N(o) is the directional derivative of ln_f at X_L[t] along o, up to the terms through the
    normaliser, which vanish when o is the normaliser-free direction: checked on a finite
    difference along o in the kernel of the normaliser's derivative (o orthogonal to x and, for
    LayerNorm, centred), where ln_f is linear to first order."""
    g = torch.Generator().manual_seed(0)
    d = model.config.d_model
    x = torch.randn(d, generator=g)
    o = torch.randn(d, generator=g)
    if not isinstance(model, ModernGPT):
        x, o = x - x.mean(), o - o.mean()
    o = o - (o @ x) / (x @ x) * x  # the normaliser does not move along o to first order
    with torch.no_grad():
        got, scale = ln_f_frozen(model.ln_f, o, x)
        eps = 1e-3
        want = (model.ln_f(x + eps * o) - model.ln_f(x - eps * o)) / (2 * eps)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-2)
    assert scale > 0


def test_as_lists_is_json(model):
    tr = head_trace(model, torch.tensor([IDS]), 0, 1, 2, TARGET)
    data = json.loads(json.dumps(tr.as_lists()))
    assert data["mask"][3] is None and data["mask"][2] == 0.0
    assert len(data["k"]) == len(IDS) and len(data["out"]) == model.config.d_model
    assert isinstance(tr, HeadTrace) and data["position"] == 2


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"layer": 2}, "layer"),
        ({"layer": -1}, "layer"),
        ({"layer": True}, "layer"),
        ({"head": 4}, "head"),
        ({"head": 1.0}, "head"),
        ({"position": 7}, "position"),
        ({"position": -1}, "position"),
        ({"target": 10_000}, "target"),
        ({"target": -2}, "target"),
        ({"ids": []}, "ids"),
        ({"ids": [1, 2.5]}, "ids"),
        ({"ids": [1, 100_000]}, "ids"),
        ({"ids": torch.zeros(2, 3, dtype=torch.int64)}, "ids"),
        ({"ids": torch.zeros(3)}, "ids"),
        ({"ids": list(range(1, 300))}, "ids"),
    ],
)
def test_invalid_arguments_are_named(model, kwargs, name):
    args = {"ids": IDS, "layer": 0, "head": 0, "position": 2, "target": TARGET} | kwargs
    with pytest.raises(ValueError, match=name):
        head_trace(model, **args)


def test_pair_and_model_are_checked(tiny_gpt, tiny_modern):
    with pytest.raises(ValueError, match="pair"):
        head_trace(tiny_gpt(), IDS, 0, 0, 2, TARGET, pair=0)
    for bad in (4, -1, 1.0):
        with pytest.raises(ValueError, match="pair"):
            head_trace(tiny_modern(), IDS, 0, 0, 2, TARGET, pair=bad)
    with pytest.raises(ValueError, match="model"):
        head_trace(torch.nn.Linear(2, 2), IDS, 0, 0, 2, TARGET)


def test_a_non_finite_weight_is_named(tiny_modern):
    model = tiny_modern(seed=0)
    with torch.no_grad():
        model.blocks[0].attn.W_K[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_K"):
        head_trace(model, IDS, 1, 0, 2, TARGET)


def test_target_minus_one_is_the_most_probable_token(model):
    logits = model(torch.tensor([IDS]))[0].detach()  # (T, d_vocab)
    for t in (1, len(IDS) - 1):
        tr = head_trace(model, IDS, 1, 2, t, -1)
        assert tr.target == int(logits[t].argmax())
        assert tr.contribution == head_trace(model, IDS, 1, 2, t, tr.target).contribution
