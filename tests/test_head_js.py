"""The head view's arithmetic in JavaScript (gptlib/widgets/js/head.js, run with node) equals
gptlib.head_trace's for the tiny GPT and ModernGPT: Python writes what a step hands the view
(gptlib.widgets.head.view_inputs: the rotated query, the keys and values as the cache holds them,
W_O^h, ln_f's frozen normaliser and gain, W_U[:, v]) and every stage it computes to a JSON file;
node runs traceHead on the inputs. The kernel's answer to a ``head`` request is those inputs.
JavaScript computes in double precision from float32 inputs: ATOL = 1e-5, RTOL = 1e-4, as in
tests/test_head_trace.py. Also: the view's equation numbers are the chapters' (counted from their
labels as book_ext/book_equations.py numbers them), its folding and number format, and the panel
it draws (on a minimal stand-in for the DOM)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from node_support import import_as, run_node

from gptlib.circuits import ablate_heads
from gptlib.head_trace import head_trace
from gptlib.modern import ModernGPT
from gptlib.step import step, step_inputs
from gptlib.widgets.head import view_inputs
from gptlib.widgets.live import LiveKernel

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
HEAD_JS = ROOT / "gptlib" / "widgets" / "js" / "head.js"
TOL = {"atol": 1e-5, "rtol": 1e-4}
IDS = [5, 17, 3, 17, 9, 5, 17, 2]

# A stand-in for the few DOM calls the panel makes (dom.js's make: createElement, className,
# textContent; append); textContent reads the element's own text and its children's.
FAKE_DOM = """
class El {
  constructor(tag) { this.tag = tag; this.children = []; this.className = ""; this.own = ""; }
  append(...c) { this.children.push(...c); }
  set textContent(t) { this.own = String(t); }
  get textContent() { return [this.own, ...this.children.map((c) => c.textContent)].join(" "); }
}
globalThis.document = { createElement: (tag) => new El(tag) };
"""


def _node(script: str, data: object, tmp_path: Path) -> object:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(data))
    head = (
        import_as("m", HEAD_JS)
        + 'import { readFileSync } from "node:fs";\n'
        + f"const data = JSON.parse(readFileSync({json.dumps(str(path))}, 'utf8'));\n"
        + "const plain = (x) => JSON.stringify(x, (k, v) => "
        + "(typeof v === 'number' && !Number.isFinite(v) ? null : v));\n"
    )
    return run_node(FAKE_DOM + head + script)


# the JavaScript stage names and the HeadTrace fields they equal
STAGES = {
    "qRaw": "q_raw",
    "kRaw": "k_raw",
    "q": "q",
    "k": "k",
    "v": "v",
    "scores": "scores",
    "scaled": "scaled",
    "pattern": "pattern",
    "z": "z",
    "out": "out",
    "lnOut": "ln_out",
}
ROPE = {"angleK": "angle_k", "angleRel": "angle_rel", "pairScores": "pair_scores"}


def _cases(tiny_gpt, tiny_modern):
    """Cases of both models, their biases and norm gains drawn away from 0 and 1."""
    gpt, modern = tiny_gpt(seed=5), tiny_modern(seed=5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*gpt.parameters(), *modern.parameters()]:
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return [
        (gpt, dict(layer=0, head=1, position=7, target=11)),
        (gpt, dict(layer=1, head=3, position=2, target=400)),
        (modern, dict(layer=0, head=0, position=7, target=11, pair=0)),
        (modern, dict(layer=1, head=3, position=4, target=200, pair=2)),
        (modern, dict(layer=1, head=1, position=0, target=7, pair=3)),
    ]


def test_js_stages_equal_head_trace(tiny_gpt, tiny_modern, tmp_path):
    cases = _cases(tiny_gpt, tiny_modern)
    traces = [(model, head_trace(model, IDS, **kw)) for model, kw in cases]
    js = _node(
        "console.log(plain(data.map((inp) => m.traceHead(inp))));",
        [view_inputs(model, tr) for model, tr in traces],
        tmp_path,
    )
    for (model, tr), got in zip(traces, js):
        where = f"{type(model).__name__} layer {tr.layer} head {tr.head} t {tr.position}"
        names = STAGES | (ROPE if tr.pair is not None else {})
        for name, field in names.items():
            want = getattr(tr, field).double()
            torch.testing.assert_close(
                torch.tensor(got[name], dtype=torch.float64),
                want,
                **TOL,
                msg=lambda m: f"{where} {name}: {m}",
            )
        assert got["mask"] == [0 if x == 0 else None for x in tr.mask.tolist()]
        assert got["sum"] == pytest.approx(1.0, abs=1e-12)
        assert got["contribution"] == pytest.approx(tr.contribution, abs=1e-5, rel=1e-4)
        if tr.pair is None:
            assert got["theta"] is None
        else:
            assert got["theta"] == pytest.approx(tr.theta, rel=1e-12)
            assert got["angleQ"] == pytest.approx(tr.angle_q, rel=1e-12)


def _chapter_numbers() -> dict[str, str]:
    """Each labelled equation's number "N.k": the k-th label of chapter N's notebook, page order."""
    numbers = {}
    for nb in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        chapter = int(nb.name[:2])
        cells = json.loads(nb.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for k, label in enumerate(re.findall(r"\$\$ *\((ch\d\d-[\w-]+)\)", text), start=1):
            numbers[label] = f"{chapter}.{k}"
    return numbers


def test_equation_numbers_are_the_chapters(tmp_path):
    js = _node("console.log(plain(m.EQUATIONS));", None, tmp_path)
    numbers = _chapter_numbers()
    assert numbers["ch04-softmax"] == "4.1"  # the counting itself, on one known label
    assert js == {label: numbers[label] for label in js}


def test_fold_and_fmt(tmp_path):
    values = [0.5, -3.0, 0.1, 0.2, 9.0, -0.01, 0.3, -7.5, 0.0, 0.4, 2.0, -0.05]
    js = _node(
        "console.log(plain({ folded: m.fold(data), short: m.fold(data.slice(0, 9)),"
        " fmt: [1234.56, 0.000123456, -2.5e-7, 123456.7, 0, -Infinity, 1 / 3].map(m.fmt) }));",
        values,
        tmp_path,
    )
    folded = js["folded"]
    assert folded["shown"] == [0, 1, 2, 3, 4, 7, 9, 10]  # first 4, the 4 largest |value| after
    assert sorted(folded["shown"] + folded["rest"]) == list(range(12))
    assert js["short"] == {"shown": list(range(9)), "rest": []}
    assert js["fmt"] == ["1235", "1.235e-4", "-2.500e-7", "1.235e+5", "0", "\u2212\u221e", "0.3333"]


def test_panel_shows_every_stage_with_its_equation(tiny_gpt, tiny_modern, tmp_path):
    cases = _cases(tiny_gpt, tiny_modern)
    traces = [(model, head_trace(model, IDS, **kw)) for model, kw in cases]
    names = [f"w{i} " for i in range(len(IDS))]
    js = _node(
        "console.log(plain(data.cases.map((inp) => {\n"
        "  const root = m.headPanel(inp, { names: data.names });\n"
        "  const list = root.children[1];\n"
        "  return { title: root.children[0].textContent,\n"
        "           stages: list.children.map((li) => [li.className, li.textContent]) };\n"
        "})));",
        {"cases": [view_inputs(model, tr) for model, tr in traces], "names": names},
        tmp_path,
    )
    for (_model, tr), panel in zip(traces, js):
        ids = [cls.split()[1].removeprefix("gptlib-head-") for cls, _ in panel["stages"]]
        rope = ["q", "pair"] if tr.pair is not None else []
        assert ids == [
            "gqa",
            "q_raw",
            *rope,
            "k",
            "keys",
            "sum",
            "v",
            "z",
            "out",
            "ln_out",
            "contribution",
        ]
        text = " ".join(t for _, t in panel["stages"])
        assert "undefined" not in text and "NaN" not in text
        assert "(4.6) (4.3) (4.2) (4.1)" in text and "(6.3)" in text
        assert ("(12.2)" in text) == (tr.pair is not None)
        assert f'query t = {tr.position} "w{tr.position}\u2423"' in panel["title"]


class _Kernel(LiveKernel):
    def __init__(self, model):
        self._model = model


def test_kernel_answers_a_head_request_with_the_views_inputs(tiny_gpt, tiny_modern):
    for model, kw in _cases(tiny_gpt, tiny_modern):
        ask = {"kind": "head", "ids": IDS, **kw}
        msg, buffers = _Kernel(model)._reply(ask)
        assert msg == {"kind": "head", "inputs": view_inputs(model, head_trace(model, IDS, **kw))}
        assert buffers == []
    # the step's head mask: its zeros remove heads (W_O^h = 0) before the trace
    model, kw = _cases(tiny_gpt, tiny_modern)[3]
    mask = [1] * (model.config.n_layers * model.config.n_heads)
    mask[kw["layer"] * model.config.n_heads + kw["head"]] = mask[0] = 0
    msg, _ = _Kernel(model)._reply({"kind": "head", "ids": IDS, **kw, "mask": mask})
    with ablate_heads(model, [(0, 0), (kw["layer"], kw["head"])]):
        assert msg["inputs"] == view_inputs(model, head_trace(model, IDS, **kw))
    assert not any(any(row) for row in msg["inputs"]["W_O"])
    kernel = _Kernel(tiny_gpt(seed=5))
    for bad, name in (
        ({"position": 8}, "position"),
        ({"ids": "abc"}, "ids"),
        ({"pair": 0}, "pair"),
        ({"mask": [1, 0]}, "mask"),
        ({"mask": [0.5] * 8}, "mask"),
    ):
        ask = {"kind": "head", "ids": IDS, "layer": 0, "head": 0, "position": 1, "target": 3}
        with pytest.raises(ValueError, match=name):
            kernel._reply(ask | bad)
    with pytest.raises(ValueError, match="target"):
        kernel._reply({"kind": "head", "ids": IDS, "layer": 0, "head": 0, "position": 1})


def _flat(t: torch.Tensor) -> list:
    return t.detach().reshape(-1).tolist()


def test_page_path_equals_head_trace(tiny_gpt, tiny_modern, tmp_path):
    """The page's path, in JavaScript: page.js's cacheStepper runs a prefix, then a step that asks
    for one head at a query after it (a stand-in session answers with step()'s outputs, which
    tests/test_export.py checks the graph's equal, and checks the graph's inputs it is fed);
    head.js's headOutputs and pageInputs make the view's inputs from the graph's head_* outputs
    and the cache, and traceHead's every stage equals head_trace's; under a head mask, the
    contribution at the last query is step's direct attribution."""
    from gptlib.step import head_input

    P = 3
    cases = []
    for model, kw in _cases(tiny_gpt, tiny_modern):
        if kw["position"] < P:
            continue
        c = model.config
        L, H = c.n_layers, c.n_heads
        attn = model.blocks[0].attn
        mask = torch.ones(L, H)
        mask[L - 1, (kw["head"] + 1) % H] = 0.0  # another head removed: X_L changes
        ids = torch.tensor([IDS])
        first = step(model, ids[:, :P], *step_inputs(model)[:1], mask, *step_inputs(model)[2:])
        asked = (kw["layer"], kw["head"], kw["position"] - P, kw["target"])
        then = step(model, ids[:, P:], first["kv"], mask, *step_inputs(model)[2:],
                    head_input(model, [asked]))  # fmt: skip
        last = step(model, ids, *step_inputs(model)[:1], mask,
                    *step_inputs(model, targets=[kw["target"]])[2:])  # fmt: skip
        removed = [(k // H, k % H) for k in range(L * H) if mask.view(-1)[k] == 0]
        with ablate_heads(model, removed):
            tr = head_trace(model, IDS, **kw)
        config = {
            "d_vocab": c.d_vocab, "n_ctx": c.n_ctx, "d_model": c.d_model, "n_layers": L,
            "n_heads": H, "n_kv_heads": getattr(attn, "n_kv_heads", H), "d_head": attn.d_head,
            "rope_base": getattr(attn, "rope_base", None),
            "ln_f_centred": not isinstance(model, ModernGPT),
            "attn_bias": getattr(attn, "b_Q", None) is not None,
        }  # fmt: skip
        outs = [{k: _flat(v) for k, v in o.items()} for o in (first, then)]
        cases.append(
            {
                "config": config,
                "mask": _flat(mask),
                "outs": outs,
                "req": {k: kw[k] for k in ("layer", "head", "position", "target")}
                | {"pair": kw.get("pair", 0)},
                "want_head": list(asked),
                "direct_last": float(last["direct"][kw["layer"], kw["head"], 0]),
                "trace": tr,
            }
        )
    script = (
        import_as("page", "page.js")
        + """
class Tensor { constructor(type, data, dims) { Object.assign(this, { type, data, dims }); } }
const ort = { Tensor };
const result = [];
for (const cs of data) {
  const fed = [];
  const outs = cs.outs.map((o) => Object.fromEntries(Object.entries(o).map(([k, v]) =>
    [k, { data: k === "lens_ids" ? BigInt64Array.from(v, BigInt) : Float32Array.from(v) }])));
  let n = 0;
  const session = { run: async (feeds) => { fed.push(feeds); return outs[n++]; } };
  const stepper = page.cacheStepper(ort, session, { config: cs.config, lens_top: 10 });
  const ids = IDS;
  await stepper(ids.slice(0, PREFIX), { mask: cs.mask });
  const r = await stepper(ids, { mask: cs.mask, head: cs.req });
  const inp = m.pageInputs(cs.req, r.head, cs.config);
  result.push({ fedHead: Array.from(fed[1].head.data, Number), fedDims: fed[1].head.dims,
                emptyDims: fed[0].head.dims, trace: m.traceHead(inp),
                panel: m.headPanel(inp).textContent });
}
console.log(plain(result));
""".replace("IDS", json.dumps(IDS)).replace("PREFIX", str(P))
    )
    data = [{k: v for k, v in cs.items() if k != "trace"} for cs in cases]
    js = _node(script, data, tmp_path)
    assert len(js) == len(cases) >= 3
    for cs, got in zip(cases, js):
        tr = cs["trace"]
        assert got["fedHead"] == cs["want_head"] and got["fedDims"] == [1, 4]
        assert got["emptyDims"] == [0, 4]  # a step that asks for no head feeds none
        where = f"{cs['config']['rope_base']} layer {tr.layer} head {tr.head} t {tr.position}"
        names = STAGES | (ROPE if tr.pair is not None else {})
        for name, field in names.items():
            torch.testing.assert_close(
                torch.tensor(got["trace"][name], dtype=torch.float64),
                getattr(tr, field).double(),
                **TOL,
                msg=lambda m: f"{where} {name}: {m}",
            )
        assert got["trace"]["contribution"] == pytest.approx(tr.contribution, abs=1e-5, rel=1e-4)
        assert "NaN" not in got["panel"] and "undefined" not in got["panel"]
        if tr.position == len(IDS) - 1:  # step's direct attribution is at the last query
            assert tr.contribution == pytest.approx(cs["direct_last"], abs=1e-5, rel=1e-4)
