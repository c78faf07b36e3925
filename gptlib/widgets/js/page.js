// The live model in the page itself (the HTML book, no kernel): onnxruntime-web (WebAssembly, one
// thread) runs the step graph gptlib.export writes in a Web Worker (page_worker.js), which keeps
// the keys and values of the text so far between calls, and @huggingface/tokenizers the tokenizer
// there too; both libraries are files the book serves itself (vendored from npm), and the model's
// files are fetched only when the reader starts it (a second time, from the browser's cache).
// One worker and one session per model per page (sharedPageBackend): every view of that model
// uses it, and it is released when the reader leaves the page.
import {
  deviceRefusal,
  dropArray,
  fromBase64,
  LiveError,
  lensTops,
  megabytes,
  staticBase,
  tabMemory,
} from "./backend.js";
import { headOutputs, pageInputs } from "./head.js";
import { entropyOf, firstKept, rowsWanted, rowWindow, windowPositions } from "./rows.js";

const VERSION = 5;
// Downloads above this many bytes wait for the reader to agree.
export const CONFIRM_ABOVE = 20e6;
// The worker's code: scripts/build_widgets.py bundles page_worker.js and defines this as its text.
const WORKER_SOURCE =
  typeof globalThis.__GPTLIB_PAGE_WORKER__ === "string" ? globalThis.__GPTLIB_PAGE_WORKER__ : null;

const FILE_PAGE =
  "The live model cannot start here: this page was opened from a file (file://), and browsers do " +
  "not let such pages load WebAssembly. Serve the book over http (for instance `python -m http.server` in " +
  "the built book's folder) or run the notebook in Jupyter or Colab. What is shown is the stored analysis.";
const NO_HOST =
  "The live model needs a running kernel (Jupyter, Colab) or the HTML book served over http, " +
  "and neither is here. What is shown is the stored analysis.";
const NO_WASM =
  "The live model cannot start here: this browser has no WebAssembly (or Web Workers), or it is " +
  "switched off. What is shown is the stored analysis.";

async function fetchOk(url, what) {
  let r;
  try {
    r = await fetch(url);
  } catch (e) {
    throw new LiveError(`could not fetch ${what} (${url}): ${e.message}`);
  }
  if (!r.ok) throw new LiveError(`could not fetch ${what} (${url}): HTTP ${r.status}`);
  return r;
}

const addsUp = (listed) =>
  Array.isArray(listed?.pieces) &&
  listed.pieces.length > 0 &&
  listed.pieces.reduce((s, p) => s + p.bytes, 0) === listed.bytes;

// The manifest at `url`, checked: version 5 (the step graph's inputs and outputs of gptlib.step), pieces that add up (the graph's, and the blocks'
// of external weights).
export function checkManifest(m, url) {
  if (m?.format !== "gptlib-live" || m.version !== VERSION) {
    throw new LiveError(`${url} is not a gptlib live-model manifest (version ${VERSION})`);
  }
  if (!addsUp(m.onnx)) {
    throw new LiveError(`${url}: the model's pieces do not add up to its ${m.onnx?.bytes} bytes`);
  }
  if (m.weights && !addsUp(m.weights.blocks)) {
    throw new LiveError(`${url}: the weights' pieces do not add up to their bytes`);
  }
  return m;
}

// The worker, and call(type, payload) -> a promise of its answer; progress(text, fraction) gets
// its progress; a worker that dies fails every pending call.
export function workerClient(worker, progress = () => {}) {
  let next = 0;
  const pending = new Map();
  const failAll = (e) => {
    for (const p of pending.values()) p.reject(e);
    pending.clear();
  };
  worker.onmessage = (e) => {
    const m = e.data;
    if (m.type === "progress") return progress(m.text, m.fraction);
    const p = pending.get(m.id);
    if (!p) return;
    pending.delete(m.id);
    if (m.error !== undefined) p.reject(m.live ? new LiveError(m.error) : new Error(m.error));
    else p.resolve(m.result);
  };
  worker.onerror = (e) => {
    e.preventDefault?.();
    failAll(new LiveError(`the live model's worker stopped: ${e.message || "an error"}`));
  };
  return {
    call(type, payload = {}) {
      return new Promise((resolve, reject) => {
        const id = next++;
        pending.set(id, { resolve, reject });
        worker.postMessage({ type, id, ...payload });
      });
    },
    setProgress(f) {
      progress = f;
    },
    terminate() {
      worker.terminate();
      failAll(new LiveError("the live model was released"));
    },
  };
}

// The worker and the blob URL of its code (revoked once it has started).
function startWorker() {
  if (WORKER_SOURCE) {
    const url = URL.createObjectURL(new Blob([WORKER_SOURCE], { type: "text/javascript" }));
    return [new Worker(url, { type: "module" }), url];
  }
  return [new Worker(new URL("./page_worker.js", import.meta.url), { type: "module" }), null];
}

// The page's backend. `hooks`: progress(text, fraction or null); confirm(manifest) -> promise of
// true to go on (asked before a download above CONFIRM_ABOVE bytes; false stops with a message).
// onnxruntime-web's threads: one. Two measured slower than one on the 2-core machine the book is
// built on (bench/bench_live.py --threads 1 2); a page may ask for more by setting
// `window.__gptlibThreads` before the model starts (the bench does), which onnxruntime-web grants
// only in a cross-origin isolated page (COOP and COEP headers), one thread otherwise.
export function liveThreads() {
  const n = globalThis.__gptlibThreads;
  return Number.isInteger(n) && n >= 1 && n <= 16 ? n : 1;
}

// A device that cannot hold the model (backend.js's deviceRefusal) is told so before any download.
export async function browserBackend(source, weightsSha, hooks) {
  const progress = hooks.progress || (() => {});
  if (location.protocol === "file:") throw new LiveError(FILE_PAGE);
  if (typeof WebAssembly !== "object" || typeof Worker !== "function") throw new LiveError(NO_WASM);
  const base = staticBase();
  if (!base) throw new LiveError(NO_HOST);
  const manifestUrl = new URL(source, base).href;
  progress("reading the model's manifest", null);
  const manifest = checkManifest(
    await (await fetchOk(manifestUrl, "the model's manifest")).json(),
    manifestUrl,
  );
  if (weightsSha && manifest.weights_sha256 !== weightsSha) {
    throw new LiveError(
      `the model the book serves (${manifest.name}) is not the model this view was made from ` +
        "(their weights differ), so the page will not run it in its place.",
    );
  }
  const refused = deviceRefusal(manifest); // before anything is downloaded
  if (refused) throw new LiveError(`The live model will not start here: ${refused}`);
  const total = manifest.download_bytes;
  if (total > CONFIRM_ABOVE && hooks.confirm && !(await hooks.confirm(manifest))) {
    throw new LiveError(
      `Not started: ${manifest.name} needs ${megabytes(total)} downloaded first. What is shown is the stored analysis.`,
    );
  }
  const [worker, url] = startWorker();
  const client = workerClient(worker, progress);
  const { name, config, lens_top, onnx, weights, tokenizer } = manifest;
  let started;
  try {
    started = await client.call("start", {
      base,
      manifestUrl,
      manifest: { name, config, lens_top, onnx, weights, tokenizer },
      threads: liveThreads(),
    });
  } catch (e) {
    client.terminate();
    throw e;
  } finally {
    if (url) URL.revokeObjectURL(url);
  }
  client.setProgress(() => {});
  return pageBackend(client, manifest, started);
}

// How many leading entries a and b share.
export function sharedPrefix(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

// What the page's backend computes for `window` (the ids the model sees) given what it holds:
// the cached ids `cached` (computed under the mask `cachedMask`, a string) and the mask `mask`.
// Returns {keep, feed}: keep the first `keep` cached positions (at most `most`: the positions
// whose attention rows the caller holds, when it wants the rows of the rest), run the step on
// window[keep:] (never empty: with nothing new the last position runs again on the cache less one).
export function plan(cached, cachedMask, window, mask, most = Number.POSITIVE_INFINITY) {
  let keep = cachedMask === mask ? sharedPrefix(cached, window) : 0;
  keep = Math.min(keep, most, window.length - 1);
  return { keep, feed: window.slice(keep) };
}

// The cache of keys and values, position first: `per` floats a position (n_layers * 2 * n_kv *
// d_head: 46 kB for SmolLM2), in one buffer that grows by half (at most a third of it unused:
// doubling left up to half of 94 MB unused after 1,000 tokens); past(P) is a view of its first P
// positions (what the step is fed, no copy), put(at, kv) writes a step's new positions from
// position `at` on.
export function kvStore(per, capacity = 64) {
  let data = new Float32Array(per * capacity);
  return {
    past: (P) => data.subarray(0, P * per),
    put(at, kv) {
      const need = at * per + kv.length;
      if (need > data.length) {
        let n = Math.max(1, data.length / per);
        while (n * per < need) n = Math.ceil(n * 1.5);
        const grown = new Float32Array(n * per);
        grown.set(data.subarray(0, at * per));
        dropArray(data); // no view of the old buffer outlives a step
        data = grown;
      }
      data.set(kv, at * per);
    },
    get capacity() {
      return data.length / per;
    },
  };
}

// The most attention weights one run of the graph may form: the step keeps every layer's
// pattern of its T new queries over its P + T keys (n_layers * n_heads * T * (P + T) floats,
// gptlib.step's hooks) until its outputs are gathered, and onnxruntime-web's WebAssembly memory
// never gives back what it once grew to: a text of 1,000 tokens fed in one run grew SmolLM2's
// tab by 1.1 GB, a run of the 127 rows the heads panel lacks after a long "generate N" by 0.2 GB.
// A longer feed runs as several runs (feedRuns), each within this (8 M floats: 32 MB; with
// 16 M, fetching those 127 rows at 1,000 tokens still grew the tab by 0.2 GB, with 8 M by 34 MB,
// in about the same time, measured in Chromium on 2026-11-28). A text of up to 172 tokens is one
// run.
export const RUN_WEIGHTS = 8e6;

// The runs of a feed of the positions P .. P + T - 1 for n_layers * n_heads = LH heads: [a, b)
// each, in order, each as long as the budget allows (at least one position).
export function feedRuns(P, T, LH, budget = RUN_WEIGHTS) {
  const runs = [],
    c = budget / LH,
    end = P + T;
  let a = P;
  while (a < end) {
    const t = Math.max(1, Math.floor((-a + Math.sqrt(a * a + 4 * c)) / 2)); // LH t (a + t) <= budget
    const b = Math.min(end, a + t);
    runs.push([a, b]);
    a = b;
  }
  return runs;
}

// One step at a time on a session of the step graph (in the worker), keeping the cache between
// steps (see plan, kvStore): step(ids, {mask, lens, targets, rows, most}) -> {logits, cut,
// entropy, P, T, R, lens, direct}: `rows` asks for the rows of the last R = rowsWanted(P, T) of
// the T new queries, those the heads panel's window keeps (rows.js), which come cut to the
// window's keys (cut: (n_layers, n_heads, R, n), n = windowPositions(P + T).length, as rows.js's
// addCut takes them), with each head's last-row entropy over all its keys (entropy: n_layers *
// n_heads); null both without `rows`. Only what is asked is computed: no lens (null or []), no targets, no rows
// make a bare step; a target -1 is the most probable token. A long feed runs as several runs
// of the graph (feedRuns), the lens, targets and head asked of the last. The cache says which
// ids it holds only once a run has succeeded: a step that fails (an exception, out of memory)
// leaves it as it was, or holding the positions of its runs that succeeded, so the next step is
// fed the keys and values of the ids it says it holds. A `head` {layer, head, position, target}
// (position in the window) asks for one head at one query (head.js): the position is one of the
// step's new ones, asked of the run that holds it (within the budget like the others, however
// far back it is), and the result's `head` holds that run's head_* outputs and the cache's keys
// and values of that head's key-value head after the step (head.js's pageInputs).
export function cacheStepper(ort, session, manifest, budget = RUN_WEIGHTS) {
  const c = manifest.config,
    L = c.n_layers,
    H = c.n_heads,
    G = c.n_kv_heads,
    D = c.d_head;
  const V = c.d_vocab,
    K = manifest.lens_top;
  const ones = new Float32Array(L * H).fill(1);
  const store = kvStore(L * 2 * G * D);
  let cached = [],
    cachedMask = "";
  const i64 = (a) => BigInt64Array.from(a, (i) => BigInt(i));
  const tensor = (a) => new ort.Tensor("int64", i64(a), [a.length]);
  return async (ids, options = {}) => {
    const { mask = null, lens = null, targets = null, rows = false, head = null } = options;
    const window = ids.slice(-c.n_ctx); // past n_ctx the window slides (all of it recomputed)
    const m = mask ? Float32Array.from(mask) : ones,
      mKey = m.join(",");
    let most = options.most ?? Number.POSITIVE_INFINITY;
    if (head) {
      if (!(head.position >= 0 && head.position < window.length))
        throw new LiveError(`the query position must be in [0, ${window.length})`);
      most = Math.min(most, head.position); // the query is one of the step's new positions
    }
    const { keep, feed } = plan(cached, cachedMask, window, mKey, most);
    const P = keep,
      T = feed.length,
      E = P + T;
    const ls = lens || [],
      tg = targets || [],
      R = rows ? rowsWanted(P, T) : 0;
    // the rows cut to the window's keys: key 0, then lo .. q (rows.js's addCut)
    const lo = Math.max(1, firstKept(E)),
      n = rows ? windowPositions(E).length : 0;
    const cut = rows ? new Float32Array(L * H * R * n) : null,
      entropy = rows ? new Float64Array(L * H) : null;
    const runs = feedRuns(P, T, L * H, budget);
    let done = P, // the positions whose keys and values the store holds for `window`
      result = null,
      asked = null; // the head's outputs, copied from the run that holds its position
    try {
      for (const [a, b] of runs) {
        const last = b === E,
          qFrom = Math.max(a, E - R); // the rows wanted among this run's queries
        const qs = Array.from({ length: Math.max(0, b - qFrom) }, (_, k) => qFrom - a + k);
        const mine = head && a <= head.position && head.position < b;
        const row = mine ? [head.layer, head.head, head.position - a, head.target] : [];
        const out = await session.run({
          ids: new ort.Tensor("int64", i64(feed.slice(a - P, b - P)), [1, b - a]),
          past: new ort.Tensor("float32", store.past(a), [a, L, 2, G, D]),
          head_mask: new ort.Tensor("float32", m, [L, H]),
          lens: tensor(last ? ls : []),
          targets: tensor(last ? tg : []),
          queries: tensor(qs),
          head: new ort.Tensor("int64", i64(row), [row.length / 4, 4]),
        });
        try {
          if (rows) {
            const got = out.attn.data; // (L, H, qs.length, b)
            for (let k = 0; k < L * H; k++) {
              for (let t = 0; t < qs.length; t++) {
                const q = qFrom + t,
                  from = (k * qs.length + t) * b,
                  to = (k * R + (q - (E - R))) * n;
                cut[to] = got[from];
                if (q > 0) cut.set(got.subarray(from + lo, from + q + 1), to + 1);
                if (q === E - 1) entropy[k] = entropyOf(got.subarray(from, from + q + 1));
              }
            }
          }
          if (last) {
            result = {
              logits: out.logits.data.slice(0, V),
              cut,
              entropy,
              P,
              T,
              R,
              lens: lens
                ? lensTops(out.lens_ids.data, out.lens_logits.data, out.lens_lse.data, ls.length, K)
                : null,
              direct: tg.length ? out.direct.data.slice() : null,
            };
          }
          if (mine) {
            // the graph's outputs for the head (gptlib.step.HEAD_OUTPUTS, all named head_*)
            const kept = Object.entries(out).filter(([k]) => k.startsWith("head_"));
            asked = Object.fromEntries(kept.map(([k, t]) => [k, { data: t.data.slice() }]));
          }
          store.put(a, out.kv.data); // the new positions after the kept ones; the rest is stale
          done = b;
          if (last && head) result.head = headOutputs(asked, store.past(E), head, c);
        } finally {
          // what was kept was copied: the outputs' memory (onnxruntime-web copies each into a
          // new array; the rows at 1,000 positions: 1 MB a step) goes now, not at the
          // collector's next pass
          for (const t of Object.values(out)) {
            const data = t.location === "cpu" ? t.data : null;
            t.dispose?.();
            dropArray(data);
          }
        }
      }
    } finally {
      if (done > P) {
        cached = window.slice(0, done);
        cachedMask = mKey;
      }
    }
    return result;
  };
}

// The page's backend around the worker's session and tokenizer (`client`, workerClient): it keeps
// the heads panel's window of the attention rows of the text so far (rows.js; of the `known`
// leading positions of the cache), and runs one step at a time (a view's step waits for another
// view's to end: they share the cache). A run with `rows` gets the window's patterns; the
// cache's positions whose rows the window needs but lacks (steps run without them) are run
// again for theirs. close() releases the session and the worker. `started`: the worker's answer
// to "start" ({phases: milliseconds of each part of the start, threads}).
export function pageBackend(client, manifest, started) {
  const info = started || {},
    c = manifest.config,
    L = c.n_layers,
    H = c.n_heads;
  const rows = rowWindow(L, H); // the heads panel's window of the rows (rows.js)
  let known = 0, // the leading positions of the cache whose rows `rows` holds
    closed = false;
  const step = async (ids, options = {}) => {
    const t0 = performance.now();
    const {
      mask = null,
      lens = null,
      targets = null,
      rows: want = false,
      patterns = true,
      head = null,
    } = options;
    // the cache may keep the positions whose rows the window holds (while a context of K can
    // use them: rows.held) and those before the first row it keeps
    const K = Math.min(ids.length, c.n_ctx);
    const r = await client.call("run", {
      ids: Array.from(ids),
      options: {
        mask: mask && Array.from(mask),
        lens,
        targets,
        rows: want,
        most: want ? Math.max(rows.held(K) ? known : 0, firstKept(K)) : undefined,
        head,
      },
    });
    known = Math.min(known, r.P);
    if (r.cut) {
      rows.addCut(r.cut, r.entropy, r.P, r.T, r.R);
      known = r.P + r.T;
    }
    const heads =
      want && patterns ? rows.heads() : { patterns: null, positions: null, entropy: null };
    return {
      logits: r.logits,
      ...heads,
      lens: r.lens,
      direct: r.direct,
      head: r.head || null,
      ms: performance.now() - t0,
      fed: r.T,
    };
  };
  let last = Promise.resolve();
  const run = (ids, options) => {
    const result = last.then(() => step(ids, options));
    last = result.catch(() => {});
    return result;
  };
  const close = async () => {
    if (closed) return;
    closed = true;
    try {
      await client.call("release");
    } finally {
      client.terminate();
    }
  };
  return {
    kind: "browser",
    describe: `the page itself (${manifest.name}: onnxruntime-web, WebAssembly, ${info.threads > 1 ? `${info.threads} threads` : "one thread"}, in a Web Worker)`,
    started: info,
    config: c,
    tokens: manifest.tokens,
    bytes: manifest.token_bytes.map(fromBase64),
    special: manifest.special || {},
    chat: manifest.chat || null,
    downloadBytes: manifest.download_bytes,
    encode: (text) => client.call("encode", { text }),
    memory: tabMemory,
    run,
    // one head at one query of the window `ids` (head.js's inputs), under the head mask `mask`
    head: async (ids, { mask = null, ...req }) =>
      pageInputs(req, (await run(ids, { mask, head: req })).head, c),
    close,
  };
}

// One page backend per model per page: every view that names the same manifest (and weights)
// shares the first one's download and session; hooks are those of the view that starts it. A
// start that fails (or that the reader declines) is forgotten, so that a later one tries again.
// The table lives on globalThis: each view's bundle has its own copy of this module. (`start`
// is browserBackend; a test gives its own.)
export function sharedPageBackend(source, weightsSha, hooks, start = browserBackend) {
  if (!globalThis.__gptlibPageBackends) globalThis.__gptlibPageBackends = new Map();
  const started = globalThis.__gptlibPageBackends,
    key = `${source} ${weightsSha || ""}`;
  if (!started.has(key)) {
    const promise = start(source, weightsSha, hooks);
    started.set(key, promise);
    promise.then(
      (backend) => {
        // the session goes when the reader leaves the page (not when it is kept for going back)
        globalThis.addEventListener?.("pagehide", (e) => {
          if (!e.persisted && started.get(key) === promise) {
            started.delete(key);
            backend.close?.();
          }
        });
      },
      () => started.delete(key),
    );
  }
  return started.get(key);
}

// Release the page backend of `source` (its session and worker), so that the next start makes
// a new one; true when there was one.
export async function releasePageBackend(source, weightsSha) {
  const started = globalThis.__gptlibPageBackends,
    key = `${source} ${weightsSha || ""}`;
  const promise = started?.get(key);
  if (!promise) return false;
  started.delete(key);
  const backend = await promise.catch(() => null);
  await backend?.close?.();
  return true;
}
