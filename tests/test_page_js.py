"""The page's backend around its Web Worker (gptlib/widgets/js/page.js, run with node): the
cache of keys and values changes only when a step succeeds (a failed step leaves what the next
step is fed as it was), the worker's messages reach the right caller, a closed backend releases
its session and worker, and the manifest's external weights are checked. The worker's code is
inlined into the views' bundles (scripts/build_widgets.py)."""

from __future__ import annotations

import math

from node_support import JS, import_as, run_node


def _node(script: str) -> dict:
    return run_node(import_as("m", "page.js") + script)


# A session of one layer, one kv head, d_head 1: the cache holds each position's id (as key and
# value), so what a step
# is fed says which ids the page believes are cached. `fail` makes the next run throw.
FAKE = """
const manifest = { config: { n_layers: 1, n_heads: 1, n_kv_heads: 1, d_head: 1, d_vocab: 4,
                             n_ctx: 64 }, lens_top: 2 };
class Tensor { constructor(type, data, dims) {
  const n = dims.reduce((a, b) => a * b, 1);
  if (data.length !== n) throw new Error(`${data.length} values for dims ${dims}`);
  Object.assign(this, { type, data, dims }); } }
const ort = { Tensor };
const fed = [];
let fail = false;
const session = { async run(f) {
  const ids = Array.from(f.ids.data, Number), P = f.past.dims[0];
  const past = Array.from(f.past.data);  // (P, 1, 2, 1, 1): each position's key, then value
  const keys = past.filter((_, i) => i % 2 === 0), values = past.filter((_, i) => i % 2 === 1);
  if (keys.join() !== values.join()) throw new Error("keys are not values");
  fed.push({ ids, past: keys, P });
  if (fail) { fail = false; throw new Error("out of memory"); }
  const T = ids.length, r = f.queries.dims[0];
  return { logits: new Tensor("float32", new Float32Array(4), [1, 4]),
           attn: new Tensor("float32", new Float32Array(r * (P + T)).fill(1), [1, 1, r, P + T]),
           kv: new Tensor("float32", Float32Array.from(ids.flatMap((i) => [i, i])),
                          [T, 1, 2, 1, 1]),
           direct: new Tensor("float32", new Float32Array(0), [1, 1, 0]) }; } };
"""


def test_a_failed_step_leaves_the_cache_as_it_was():
    """A step that throws after the cache would have been cut (a new token in the middle) leaves
    the cache whole: the next step is fed the positions it keeps, with their own keys and
    values, and the steps after it go on from there (today's order cut the cache first, and fed
    the next step keys that were no longer there)."""
    js = _node(
        FAKE
        + """
const step = m.cacheStepper(ort, session, manifest);
const out = { errors: [] };
const r1 = await step([1, 2, 3]);
out.r1 = [r1.P, r1.T];
fail = true;
try { await step([1, 2, 9, 4]); } catch (e) { out.errors.push(e.message); }
const r3 = await step([1, 2, 3, 5]);
out.r3 = [r3.P, r3.T];
fail = true;
try { await step([7]); } catch (e) { out.errors.push(e.message); }
const r5 = await step([1, 2, 3, 5, 6], { rows: true });
out.r5 = [r5.P, r5.T, r5.cut.length];
out.fed = fed;
console.log(JSON.stringify(out));
"""
    )
    assert js["errors"] == ["out of memory", "out of memory"]
    assert js["r1"] == [0, 3] and js["r3"] == [3, 1] and js["r5"] == [4, 1, 5]
    assert js["fed"] == [
        {"ids": [1, 2, 3], "past": [], "P": 0},
        {"ids": [9, 4], "past": [1, 2], "P": 2},  # fails
        {"ids": [5], "past": [1, 2, 3], "P": 3},  # the cache of the first step, whole
        {"ids": [7], "past": [], "P": 0},  # fails
        {"ids": [6], "past": [1, 2, 3, 5], "P": 4},
    ]


def test_the_worker_client_and_the_backend_around_it():
    """Answers reach their callers by id, progress goes to the hook, a reader's error stays a
    LiveError, a worker that dies fails what waits; the backend keeps the attention rows of the
    steps that succeeded and asked for them, runs again the positions whose rows it lacks when
    they are wanted, and close() releases the session, then ends the worker, once."""
    js = _node(
        """
import { LiveError } from "./backend.js";
const posted = [], progress = [];
const worker = { postMessage(m) { posted.push(m); }, terminated: 0,
                 terminate() { this.terminated++; } };
const c = m.workerClient(worker, (t, f) => progress.push([t, f]));
const a = c.call("run", { ids: [1] }), b = c.call("run", { ids: [2] });
worker.onmessage({ data: { type: "progress", text: "x", fraction: 0.5 } });
worker.onmessage({ data: { id: 1, error: "too big", live: true } });
worker.onmessage({ data: { id: 0, result: 42 } });
const out = { a: await a, progress };
try { await b; } catch (e) { out.b = [e.message, e instanceof LiveError]; }
const d = c.call("start");
worker.onerror({ message: "wasm trap" });
try { await d; } catch (e) { out.d = e.message; }
// the backend: rows from each successful step, none from a failed one
const calls = [], fed = [];
const client = { async call(type, p) { calls.push(type);
    if (type === "release") return true;
    if (p.ids.length === 9) throw new Error("boom");
    const P = Math.min(p.ids.length - 1, p.options.most ?? 1e9), T = p.ids.length - P;
    fed.push([P, T, p.options.rows]);
    return { logits: new Float32Array(4), P, T, R: p.options.rows ? T : 0, lens: null,
             direct: null,
             cut: p.options.rows ? new Float32Array(T * (P + T)).fill(0.5) : null,
             entropy: p.options.rows ? Float64Array.of(0.7) : null }; },
  terminated: 0, terminate() { this.terminated++; } };
const manifest = { name: "t", config: { n_layers: 1, n_heads: 1, n_ctx: 64 }, tokens: [],
                   token_bytes: [] };
const be = m.pageBackend(client, manifest, null);
await be.run([1], { rows: true });
out.bare = (await be.run([1, 2])).patterns;  // no rows asked: none kept for position 1
try { await be.run([1, 2, 3, 4, 5, 6, 7, 8, 9], { rows: true }); }
catch (e) { out.failed = e.message; }
const r = await be.run([1, 2, 3], { rows: true });  // position 1 runs again for its rows
out.rows = r.patterns[0][0].map((x) => x.length);
out.fed = fed;
await be.close(); await be.close();
out.calls = calls; out.terminated = client.terminated;
console.log(JSON.stringify(out));
""".replace("./backend.js", (JS / "backend.js").as_uri())
    )
    assert js["a"] == 42 and js["progress"] == [["x", 0.5]]
    assert js["b"] == ["too big", True]
    assert "worker stopped: wasm trap" in js["d"]
    assert js["failed"] == "boom" and js["rows"] == [1, 2, 3] and js["bare"] is None
    assert js["fed"] == [[0, 1, True], [1, 1, False], [1, 2, True]]
    assert js["calls"] == ["run", "run", "run", "run", "release"] and js["terminated"] == 1


def test_a_runs_steps_keep_their_rows_without_building_the_patterns():
    """A step with rows and ``patterns: false`` (a token of "generate N" while the heads' panel is
    open) keeps its new rows and returns no patterns; the step after the run then feeds only its
    own position and gets the whole window's patterns (before, the run's end fed every token of
    the run again for its rows)."""
    js = _node(
        """
const fed = [];
const client = { async call(type, p) {
    if (type === "release") return true;
    const P = Math.min(p.ids.length - 1, p.options.most ?? 1e9), T = p.ids.length - P;
    fed.push([P, T]);
    return { logits: new Float32Array(4), P, T, R: p.options.rows ? T : 0, lens: null,
             direct: null,
             cut: p.options.rows ? new Float32Array(T * (P + T)).fill(0.5) : null,
             entropy: p.options.rows ? Float64Array.of(0.7) : null }; },
  terminate() {} };
const manifest = { name: "t", config: { n_layers: 1, n_heads: 1, n_ctx: 64 }, tokens: [],
                   token_bytes: [] };
const be = m.pageBackend(client, manifest, null);
const quiet = [];
for (const ids of [[1], [1, 2], [1, 2, 3]]) {
  quiet.push((await be.run(ids, { rows: true, patterns: false })).patterns);
}
const r = await be.run([1, 2, 3, 4], { rows: true });
console.log(JSON.stringify({ quiet, fed, rows: r.patterns[0][0].map((x) => x.length) }));
"""
    )
    assert js["quiet"] == [None, None, None]
    assert js["fed"] == [[0, 1], [1, 1], [2, 1], [3, 1]]
    assert js["rows"] == [1, 2, 3, 4]


def test_one_backend_per_model_released_once():
    """releasePageBackend closes the model's one backend and forgets it: the next start makes a
    new one; a model never started has none to release."""
    js = _node(
        """
let made = 0, closed = 0;
const start = async () => { made++; return { close: async () => { closed++; } }; };
const a = await m.sharedPageBackend("live/s.json", "w", {}, start);
const b = await m.sharedPageBackend("live/s.json", "w", {}, start);
const released = await m.releasePageBackend("live/s.json", "w");
const none = await m.releasePageBackend("live/other.json", "w");
const c = await m.sharedPageBackend("live/s.json", "w", {}, start);
console.log(JSON.stringify({ same: a === b, made, closed, released, none, fresh: c !== a }));
"""
    )
    assert js == {
        "same": True, "made": 2, "closed": 1, "released": True, "none": False, "fresh": True,
    }  # fmt: skip


def test_the_manifest_external_weights_must_add_up():
    js = _node(
        """
const pieces = [{ bytes: 3 }, { bytes: 2 }];
const ok = { format: "gptlib-live", version: 5, onnx: { bytes: 5, pieces },
             weights: { blocks: { bytes: 5, pieces } } };
const errors = [
  { ...ok, version: 2 },
  { ...ok, weights: { blocks: { bytes: 6, pieces } } },
  { ...ok, weights: { blocks: { bytes: 0, pieces: [] } } },
].map((bad) => { try { m.checkManifest(bad, "x.json"); return null; }
                 catch (e) { return e.message; } });
console.log(JSON.stringify({ ok: m.checkManifest(ok, "x.json") === ok,
                             plain: !!m.checkManifest({ ...ok, weights: null }, "x.json"),
                             errors }));
"""
    )
    assert js["ok"] and js["plain"]
    assert "version 5" in js["errors"][0]
    assert all("weights' pieces do not add up" in e for e in js["errors"][1:])


def test_a_device_that_cannot_hold_the_model_is_told_before_the_download():
    """backend.js's deviceRefusal: what the browser says of the device, against the memory the
    tab needs for the manifest's weights (tabNeeds); null where the model may start."""
    js = run_node(
        import_as("b", "backend.js")
        + """
globalThis.Worker = function () {};
const smol = { name: "smollm2", weights: { bytes: 538e6 }, onnx: { bytes: 0.6e6 } };
const english = { name: "english", onnx: { bytes: 8.5e6 } };
const r = (m, nav, wasm = WebAssembly) => b.deviceRefusal(m, nav, wasm);
console.log(JSON.stringify({
  need: b.tabNeeds(smol), englishNeed: b.tabNeeds(english),
  eight: r(smol, { deviceMemory: 8 }), four: r(smol, { deviceMemory: 4 }),
  two: r(smol, { deviceMemory: 2 }), twoEnglish: r(english, { deviceMemory: 2 }),
  unsaid: r(smol, {}), iphone: r(smol, { userAgent: "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0)" }),
  noSimd: r(smol, {}, { validate: () => false }), noWasm: r(smol, {}, null),
}));
"""
    )
    assert js["need"] > 538e6 and js["englishNeed"] < js["need"] / 3
    assert js["eight"] is js["four"] is js["unsaid"] is js["twoEnglish"] is None
    assert "says it has 2 GB" in js["two"] and "stored analysis" in js["two"]
    assert js["iphone"] is None or "iPhone" in js["iphone"]  # refused only above Safari's limit
    assert "SIMD" in js["noSimd"] and "no WebAssembly" in js["noWasm"]


def test_feed_runs_stay_within_the_budget():
    """A long feed runs as several runs of the graph, each forming at most RUN_WEIGHTS attention
    weights (n_layers * n_heads * t * (a + t) for a run of t positions after a); together they
    cover the feed once, in order."""
    js = _node(
        """
const out = {};
out.budget = m.RUN_WEIGHTS;
out.smol = m.feedRuns(0, 1000, 270);
out.short = m.feedRuns(0, 172, 270);
out.step = m.feedRuns(1000, 1, 270);
out.rows = m.feedRuns(923, 127, 270);
out.tiny = m.feedRuns(5, 4, 1, 2);
console.log(JSON.stringify(out));
"""
    )
    for runs, (P, T, LH, budget) in (
        (js["smol"], (0, 1000, 270, js["budget"])),
        (js["short"], (0, 172, 270, js["budget"])),
        (js["rows"], (923, 127, 270, js["budget"])),
        (js["tiny"], (5, 4, 1, 2)),
    ):
        assert runs[0][0] == P and runs[-1][1] == P + T
        assert all(b == c for (_, b), (c, _) in zip(runs, runs[1:]))
        assert all(b > a for a, b in runs)
        # within the budget, unless a run of one position is over it already
        assert all(LH * (b - a) * b <= budget or b - a == 1 for a, b in runs), runs
    assert js["short"] == [[0, 172]]  # a text of 172 tokens: one run, as before
    assert js["step"] == [[1000, 1001]]
    assert len(js["smol"]) > 5 and len(js["rows"]) > 1
    assert js["tiny"] == [[5, 6], [6, 7], [7, 8], [8, 9]]


# FAKE's session, which also answers a head asked (layer, h, t, v) with head_q = [t] and
# head_W_O = [the run's first position]: the position the head was asked at, and in which run.
HEAD_SESSION = """
const headSession = (fed) => ({ async run(f) {
  const out = await session.run(f);
  const asked = Array.from(f.head.data, Number), s = f.head.dims[0], P = f.past.dims[0];
  fed.push([P, f.ids.dims[1], s]);
  const one = (x) => new Tensor("float32", Float32Array.from(s ? [x] : []), [s]);
  return { ...out, head_q: one(asked[2]), head_W_O: one(P), head_ln_scale: one(1),
           head_ln_w: one(1), head_W_U: one(asked[3]) }; } });
"""


def test_a_head_asked_far_back_runs_within_the_budget():
    """A head asked at a position far back in a long feed is asked of the run that holds that
    position (at its offset in the run); every run keeps to the budget (before, the head's run
    went from its position to the end in one run); the head's keys and values are the cache's
    after the whole step."""
    js = _node(
        FAKE
        + HEAD_SESSION
        + """
const runs = [], ids = Array.from({ length: 40 }, (_, i) => 1 + (i % 9));
const step = m.cacheStepper(ort, headSession(runs), manifest, 40);
const r = await step(ids, { head: { layer: 0, head: 0, position: 5, target: 3 } });
console.log(JSON.stringify({ runs, head: { q: Array.from(r.head.q), W_O: Array.from(r.head.W_O),
  unembed: Array.from(r.head.unembed), k: Array.from(r.head.k), v: Array.from(r.head.v) } }));
"""
    )
    runs, head = js["runs"], js["head"]
    assert runs[0][0] == 0 and runs[-1][0] + runs[-1][1] == 40 and len(runs) > 3
    assert all(T * (P + T) <= 40 or T == 1 for P, T, _ in runs), runs
    asked = [(P, T) for P, T, s in runs if s]
    assert len(asked) == 1 and asked[0][0] <= 5 < sum(asked[0])
    assert (
        head["W_O"] == [asked[0][0]] and head["q"] == [5 - asked[0][0]] and head["unembed"] == [3]
    )
    assert head["k"] == ids_k(40) and head["v"] == ids_k(40)


def test_the_head_outputs_are_the_graphs_outputs_named_head():
    """page.js keeps a run's head outputs as the outputs whose names start with head_: those are
    exactly gptlib.step's HEAD_OUTPUTS."""
    from gptlib.step import HEAD_OUTPUTS, OUTPUTS

    assert [k for k in OUTPUTS if k.startswith("head_")] == list(HEAD_OUTPUTS)
    assert 'k.startsWith("head_")' in (JS / "page.js").read_text(encoding="utf-8")


def ids_k(n: int) -> list[float]:
    """The cache's keys (as FAKE's session writes them: each position's id) of 1 + i % 9."""
    return [float(1 + i % 9) for i in range(n)]


# A session whose attention row of query q holds 100 (q + 1) + j at key j <= q (0 after), whose
# logits say the context's length and the sum of its ids, and whose cache holds each id.
ROWS_SESSION = """
const manifest = { config: { n_layers: 1, n_heads: 2, n_kv_heads: 1, d_head: 1, d_vocab: 4,
                             n_ctx: 256 }, lens_top: 2 };
class Tensor { constructor(type, data, dims) { Object.assign(this, { type, data, dims }); } }
const ort = { Tensor };
const session = (fed, failAt = -1) => ({ async run(f) {
  const ids = Array.from(f.ids.data, Number), P = f.past.dims[0], T = ids.length;
  const qs = Array.from(f.queries.data, Number), E = P + T;
  fed.push([P, T, f.lens.dims[0], f.targets.dims[0], qs]);
  if (fed.length === failAt) throw new Error("out of memory");
  const past = Array.from(f.past.data).filter((_, i) => i % 2 === 0);
  const all = past.concat(ids);
  const attn = new Float32Array(2 * qs.length * E);
  for (let k = 0; k < 2; k++) qs.forEach((t, r) => { const q = P + t;
    for (let j = 0; j <= q; j++) attn[(k * qs.length + r) * E + j] = 100 * (q + 1) + j + k; });
  return { logits: new Tensor("float32", Float32Array.of(E, all.reduce((a, b) => a + b, 0), 0, 0)),
           attn: new Tensor("float32", attn),
           kv: new Tensor("float32", Float32Array.from(ids.flatMap((i) => [i, i]))),
           direct: new Tensor("float32", new Float32Array(0)) }; } });
"""


def test_a_step_in_several_runs_equals_one_run():
    """The same steps with a budget that splits every feed into runs of a few positions give the
    logits and attention rows of one run each; only the last run asks for the targets; a step
    that fails after some of its runs leaves the cache holding the positions those computed."""
    js = _node(
        ROWS_SESSION
        + """
const out = {};
const ids = Array.from({ length: 40 }, (_, i) => (i * 7) % 11);
for (const [name, budget] of [["one", 1e9], ["many", 40]]) {
  const fed = [];
  const step = m.cacheStepper(ort, session(fed), manifest, budget);
  const r1 = await step(ids.slice(0, 30), { rows: true, targets: [-1] });
  const r2 = await step(ids.slice(0, 31), { rows: true });
  const r3 = await step(ids, {});
  out[name] = { fed, r: [r1, r2, r3].map((r) => ({ P: r.P, T: r.T, R: r.R,
    logits: Array.from(r.logits), cut: r.cut && Array.from(r.cut),
    entropy: r.entropy && Array.from(r.entropy) })) };
}
// past the panel's window (128 positions): key 0, then keys 13 .. q of each query kept
const long = Array.from({ length: 140 }, (_, i) => (i * 5) % 13);
for (const [name, budget] of [["longOne", 1e9], ["longMany", 400]]) {
  const r = await m.cacheStepper(ort, session([]), manifest, budget)(long, { rows: true });
  out[name] = { R: r.R, cut: Array.from(r.cut), entropy: Array.from(r.entropy) };
}
const fed = [];
const step = m.cacheStepper(ort, session(fed, 3), manifest, 40);
try { await step(ids.slice(0, 20)); } catch (e) { out.error = e.message; }
await step(ids.slice(0, 21));
out.failed = fed;
console.log(JSON.stringify(out));
"""
    )
    assert js["one"]["r"] == js["many"]["r"]
    assert len(js["one"]["fed"]) == 3 and len(js["many"]["fed"]) > 6
    r1 = js["one"]["r"][0]
    assert r1["P"] == 0 and r1["T"] == 30 and r1["R"] == 30 and r1["logits"][0] == 30
    # the rows cut to the window's keys (30 positions: all of them), head k's row q holding
    # 100 (q + 1) + j + k at key j <= q; the last row's entropy over all its keys
    for k in (0, 1):
        for q in (0, 7, 29):
            row = r1["cut"][(k * 30 + q) * 30 :][: q + 1]
            assert row == [100 * (q + 1) + j + k for j in range(q + 1)], (k, q)
    last = [100 * 30 + j for j in range(30)]
    assert abs(r1["entropy"][0] - sum(-a * math.log(a) for a in last)) < 1e-6 * 3e6
    assert js["one"]["r"][2]["cut"] is None and js["one"]["r"][2]["entropy"] is None
    assert js["longOne"] == js["longMany"]
    cut, R = js["longOne"]["cut"], js["longOne"]["R"]
    assert R == 127 and len(cut) == 2 * R * 128  # queries 13 .. 139, keys 0, 13 .. 139
    for k in (0, 1):
        for q in (13, 80, 139):
            row = cut[(k * R + q - 13) * 128 :][: q - 13 + 2]
            want = [100 * (q + 1) + j + k for j in [0, *range(13, q + 1)]]
            assert row == want, (k, q)
    # the targets only in the step's last run
    first = [f for f in js["many"]["fed"] if f[0] + f[1] <= 30]
    assert [f[3] for f in first] == [0] * (len(first) - 1) + [1]
    # 20 positions in runs of (budget 40, 2 heads) 4, 3, 2, ...: the third run fails; the next
    # step keeps the two runs' positions and feeds the rest
    assert js["error"] == "out of memory"
    runs = js["failed"]
    done = runs[1][0] + runs[1][1]
    assert runs[3][0] == done and runs[3][0] + runs[3][1] <= 21
