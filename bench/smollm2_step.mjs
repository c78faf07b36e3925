// One cached SmolLM2 step under node, as the page runs it: onnxruntime-web (WebAssembly, one
// thread), the graph loaded with its optimizations off, the weights unpacked from the 4-bit
// blocks by q4.js's lazyWeights. Prefills P0 tokens, then STEPS steps of one token, each run
// bare (no read-out asked) and with every read-out (all L + 1 lens streams, two targets, one
// attention row, one head); prints the wall and CPU times of each as one JSON line, and writes
// the last step's outputs to OUTJSON (to compare two exports bit for bit).
// usage: node bench/smollm2_step.mjs LIVE_DIR LABEL [P0=200] [STEPS=12] [OUTJSON]
// (LIVE_DIR: a folder that `python -m gptlib.export --smollm2` wrote, e.g. book_static/live)
import { readFileSync, writeFileSync } from "node:fs";
import * as ort from "../node_modules/onnxruntime-web/dist/ort.node.min.mjs";
import { lazyWeights } from "../gptlib/widgets/js/q4.js";

const [dir, label, p0s = "200", stepsS = "12", outJson = ""] = process.argv.slice(2);
const P0 = Number(p0s), STEPS = Number(stepsS);
const manifest = JSON.parse(readFileSync(`${dir}/smollm2.json`));
const cat = (pieces) => {
  const parts = pieces.map((p) => readFileSync(`${dir}/${p.file}`));
  const out = new Uint8Array(parts.reduce((a, b) => a + b.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};
const graph = cat(manifest.onnx.pieces);
const blocks = cat(manifest.weights.blocks.pieces);
const weights = lazyWeights(blocks, manifest.weights);
ort.env.wasm.numThreads = 1;
ort.env.wasm.proxy = false;
let t0 = performance.now();
const c0 = process.cpuUsage();
const session = await ort.InferenceSession.create(graph, {
  executionProviders: ["wasm"],
  graphOptimizationLevel: manifest.onnx.optimized ? "disabled" : "all",
  extra: { session: { disable_prepacking: "1" } },
  externalData: [{ path: manifest.weights.file, data: weights.data }],
});
weights.release?.();
const sessionMs = performance.now() - t0;
const sc = process.cpuUsage(c0);
const sessionCpu = Math.round((sc.user + sc.system) / 1000);
const c = manifest.config, L = c.n_layers, H = c.n_heads, G = c.n_kv_heads, D = c.d_head;
const per = L * 2 * G * D;
let past = new Float32Array(0), P = 0;
const i64 = (a) => BigInt64Array.from(a, (i) => BigInt(i));
const t1 = (a) => new ort.Tensor("int64", i64(a), [a.length]);
const ones = new Float32Array(L * H).fill(1);
const run = async (ids, full) => {
  const head = full ? [3, 2, ids.length - 1, 42] : [];
  const out = await session.run({
    ids: new ort.Tensor("int64", i64(ids), [1, ids.length]),
    past: new ort.Tensor("float32", past, [P, L, 2, G, D]),
    head_mask: new ort.Tensor("float32", ones, [L, H]),
    lens: t1(full ? Array.from({ length: L + 1 }, (_, k) => k) : []),
    targets: t1(full ? [-1, 100] : []),
    queries: t1(full ? [ids.length - 1] : []),
    head: new ort.Tensor("int64", i64(head), [head.length / 4, 4]),
  });
  return out;
};
const append = (kv, T) => {
  const next = new Float32Array((P + T) * per);
  next.set(past);
  next.set(kv.data, P * per);
  past = next;
  P += T;
};
const tok = (k) => (k * 7919 + 13) % c.d_vocab;
let out = await run(Array.from({ length: P0 }, (_, k) => tok(k)), false);
append(out.kv, P0);
const res = { label, sessionMs: Math.round(sessionMs), sessionCpu, P0, bare: [], full: [], bareCpu: [], fullCpu: [] };
const save = {};
for (let s = 0; s < STEPS; s++) {
  for (const full of [false, true]) {
    const ids = [tok(P0 + s)];
    const cpu0 = process.cpuUsage(), w0 = performance.now();
    out = await run(ids, full);
    const w = performance.now() - w0, cpu = process.cpuUsage(cpu0);
    (full ? res.full : res.bare).push(+w.toFixed(1));
    (full ? res.fullCpu : res.bareCpu).push(+((cpu.user + cpu.system) / 1000).toFixed(1));
    if (s === STEPS - 1) {
      for (const [k, v] of Object.entries(out)) save[`${full ? "full" : "bare"}.${k}`] = Array.from(v.data, Number);
    }
  }
  append(out.kv, 1);
}
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
res.median = { bare: med(res.bare), full: med(res.full), bareCpu: med(res.bareCpu), fullCpu: med(res.fullCpu) };
console.log(JSON.stringify(res));
if (outJson) writeFileSync(outJson, JSON.stringify(save));
await session.release();
