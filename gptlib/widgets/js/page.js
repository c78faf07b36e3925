// The live model in the page itself (the HTML book, no kernel): onnxruntime-web (WebAssembly, one
// thread) runs the step graph gptlib.export writes, keeping the keys and values of the text so far
// between calls, and @huggingface/tokenizers the tokenizer; both libraries are files the book
// serves itself (vendored from npm), and the model's files are fetched only when the reader starts
// it. One session per model per page (sharedPageBackend): every view of that model uses it.
import { fromBase64, LiveError, lensTops, megabytes, staticBase, tabMemory } from "./backend.js";

const VENDOR = {
  ort: "vendor/onnxruntime-web/ort.wasm.min.mjs",
  ortDir: "vendor/onnxruntime-web/",
  tokenizers: "vendor/tokenizers/tokenizers.min.mjs",
};
const VERSION = 2;
// Downloads above this many bytes wait for the reader to agree.
export const CONFIRM_ABOVE = 20e6;

const FILE_PAGE =
  "The live model cannot start here: this page was opened from a file (file://), and browsers do " +
  "not let such pages load WebAssembly. Serve the book over http (for instance `python -m http.server` in " +
  "the built book's folder) or run the notebook in Jupyter or Colab. What is shown is the stored analysis.";
const NO_HOST =
  "The live model needs a running kernel (Jupyter, Colab) or the HTML book served over http, " +
  "and neither is here. What is shown is the stored analysis.";
const NO_WASM =
  "The live model cannot start here: this browser has no WebAssembly (or it is switched off). " +
  "What is shown is the stored analysis.";

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

async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The bytes of `url` into out[at .. at + n), n as the manifest says; onBytes(k) after each chunk.
async function fetchInto(url, what, out, at, n, onBytes) {
  const r = await fetchOk(url, what);
  let got = 0;
  if (r.body?.getReader) {
    const reader = r.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (got + value.length > n)
        throw new LiveError(`${what} has more bytes than the manifest's ${n}`);
      out.set(value, at + got);
      got += value.length;
      onBytes(value.length);
    }
  } else {
    const b = new Uint8Array(await r.arrayBuffer());
    if (b.length > n) throw new LiveError(`${what} has more bytes than the manifest's ${n}`);
    out.set(b, at);
    got = b.length;
    onBytes(got);
  }
  if (got !== n) throw new LiveError(`${what} has ${got} bytes, the manifest says ${n}`);
}

// The manifest at `url`, checked: version 2, pieces that add up.
export function checkManifest(m, url) {
  if (m?.format !== "gptlib-live" || m.version !== VERSION) {
    throw new LiveError(`${url} is not a gptlib live-model manifest (version ${VERSION})`);
  }
  const pieces = m.onnx?.pieces;
  if (
    !Array.isArray(pieces) ||
    !pieces.length ||
    pieces.reduce((s, p) => s + p.bytes, 0) !== m.onnx.bytes
  ) {
    throw new LiveError(`${url}: the model's pieces do not add up to its ${m.onnx?.bytes} bytes`);
  }
  return m;
}

// The page's backend. `hooks`: progress(text, fraction or null); confirm(manifest) -> promise of
// true to go on (asked before a download above CONFIRM_ABOVE bytes; false stops with a message).
export async function browserBackend(source, weightsSha, hooks) {
  const progress = hooks.progress || (() => {});
  if (location.protocol === "file:") throw new LiveError(FILE_PAGE);
  if (typeof WebAssembly !== "object") throw new LiveError(NO_WASM);
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
  const total = manifest.download_bytes;
  if (total > CONFIRM_ABOVE && hooks.confirm && !(await hooks.confirm(manifest))) {
    throw new LiveError(
      `Not started: ${manifest.name} needs ${megabytes(total)} downloaded first. What is shown is the stored analysis.`,
    );
  }
  const file = (f) => new URL(f, manifestUrl).href;
  let onnx;
  try {
    onnx = new Uint8Array(manifest.onnx.bytes);
  } catch (e) {
    throw new LiveError(
      `This tab cannot hold ${manifest.name} (${megabytes(manifest.onnx.bytes)}): ${e.message}. ` +
        "What is shown is the stored analysis.",
    );
  }
  let done = 0;
  const tick = (n) => {
    done += n;
    progress(
      `downloading ${manifest.name}: ${megabytes(done)} of ${megabytes(total)}`,
      done / total,
    );
  };
  tick(0);
  const pieces = [];
  let at = 0;
  for (const p of manifest.onnx.pieces) {
    pieces.push([p, at]);
    at += p.bytes;
  }
  const [ort, tk, tokText] = await Promise.all([
    import(base + VENDOR.ort),
    import(base + VENDOR.tokenizers),
    fetchOk(file(manifest.tokenizer.file), "the tokenizer")
      .then((r) => r.arrayBuffer())
      .then((b) => {
        tick(b.byteLength);
        return b;
      }),
    ...pieces.map(([p, o]) => fetchInto(file(p.file), p.file, onnx, o, p.bytes, tick)),
  ]);
  if (globalThis.crypto && crypto.subtle) {
    // only in secure contexts (https, localhost)
    progress("checking the SHA-256 of each file", 1);
    for (const [p, o] of pieces) {
      if ((await sha256Hex(onnx.subarray(o, o + p.bytes))) !== p.sha256) {
        throw new LiveError(`${p.file} does not match its SHA-256 in the manifest`);
      }
    }
    if ((await sha256Hex(new Uint8Array(tokText))) !== manifest.tokenizer.sha256) {
      throw new LiveError(`${manifest.tokenizer.file} does not match its SHA-256 in the manifest`);
    }
  }
  ort.env.wasm.numThreads = 1; // threads need cross-origin isolation, which static hosts lack
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = base + VENDOR.ortDir;
  progress("starting onnxruntime-web (it unpacks the weights once)", 1);
  let session;
  try {
    session = await ort.InferenceSession.create(onnx, {
      executionProviders: ["wasm"],
      graphOptimizationLevel: "all",
    });
  } catch (e) {
    throw new LiveError(
      `onnxruntime-web could not load ${manifest.name} in this tab (${e.message}); ` +
        "a phone or a small tablet may lack the memory. What is shown is the stored analysis.",
    );
  }
  onnx = null;
  const tokenizer = new tk.Tokenizer(JSON.parse(new TextDecoder().decode(tokText)), {});
  return pageBackend(ort, session, manifest, tokenizer);
}

// How many leading entries a and b share.
export function sharedPrefix(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

// What the page's backend computes for `window` (the ids the model sees) given what it holds:
// the cached ids `cached` (computed under the mask `cachedMask`, a string) and the mask `mask`.
// Returns {keep, feed}: keep the first `keep` cached positions, run the step on window[keep:]
// (never empty: with nothing new the last position runs again on the cache less one).
export function plan(cached, cachedMask, window, mask) {
  let keep = cachedMask === mask ? sharedPrefix(cached, window) : 0;
  if (keep >= window.length) keep = window.length - 1;
  return { keep, feed: window.slice(keep) };
}

// The cache (n_layers, 2, n_kv, P, d_head) cut to its first `keep` positions.
export function cropPast(past, P, keep, { n_layers: L, n_kv_heads: G, d_head: D }) {
  if (keep === P) return past;
  const out = new Float32Array(L * 2 * G * keep * D);
  for (let r = 0; r < L * 2 * G; r++)
    out.set(past.subarray(r * P * D, r * P * D + keep * D), r * keep * D);
  return out;
}

// The attention rows kept per head: rows[l * H + h][i] holds query i's weights on keys 0..i.
// addRows appends the step's rows `attn` (n_layers, n_heads, T, P + T) for queries P .. P+T-1.
export function addRows(rows, attn, P, T, L, H) {
  const S = P + T;
  for (let lh = 0; lh < L * H; lh++) {
    if (!rows[lh]) rows[lh] = [];
    const r = rows[lh];
    r.length = P;
    for (let t = 0; t < T; t++) {
      const o = (lh * T + t) * S;
      r.push(attn.slice(o, o + P + t + 1));
    }
  }
  return rows;
}

// The patterns (n_layers, n_heads, T, T) as nested rows: patterns[l][h][i] (keys 0..i at least).
// Each head's list of rows is a copy: a later step (of this view or another) changes the cache's.
export function nestRows(rows, L, H) {
  return [...Array(L).keys()].map((l) => [...Array(H).keys()].map((h) => rows[l * H + h].slice()));
}

// The page's backend around a session of the step graph: it keeps the cache (see plan), and runs
// one step at a time (a view's step waits for another view's to end: they share the cache).
export function pageBackend(ort, session, manifest, tokenizer) {
  const c = manifest.config,
    L = c.n_layers,
    H = c.n_heads,
    G = c.n_kv_heads,
    D = c.d_head;
  const V = c.d_vocab,
    K = manifest.lens_top;
  const ones = new Float32Array(L * H).fill(1);
  let cached = [],
    cachedMask = "",
    past = new Float32Array(0),
    rows = [];
  const i64 = (a) => BigInt64Array.from(a, (i) => BigInt(i));
  const step = async (ids, { mask = null, lens = null, targets = null } = {}) => {
    const t0 = performance.now();
    const window = ids.slice(-c.n_ctx); // past n_ctx the window slides (all of it recomputed)
    const m = mask ? Float32Array.from(mask) : ones,
      mKey = m.join(",");
    const { keep, feed } = plan(cached, cachedMask, window, mKey);
    const P = keep,
      T = feed.length;
    past = cropPast(past, cached.length, P, c);
    // onnxruntime-web 1.30 (WebAssembly) fails ("divide by zero") on an empty lens request, which
    // the native build runs; so a step reads at least the last stream, and drops it unasked.
    const lensList = lens?.length ? lens : [c.n_layers],
      tg = targets || [];
    const out = await session.run({
      ids: new ort.Tensor("int64", i64(feed), [1, T]),
      past: new ort.Tensor("float32", past, [L, 2, G, P, D]),
      head_mask: new ort.Tensor("float32", m, [L, H]),
      lens: new ort.Tensor("int64", i64(lensList), [lensList.length]),
      targets: new ort.Tensor("int64", i64(tg), [tg.length]),
    });
    try {
      past = out.present.data.slice();
      cached = window.slice();
      cachedMask = mKey;
      rows = addRows(rows, out.attn.data, P, T, L, H);
      return {
        logits: out.logits.data.slice(0, V),
        patterns: nestRows(rows, L, H),
        lens: lens
          ? lensTops(out.lens_ids.data, out.lens_logits.data, out.lens_lse.data, lensList.length, K)
          : null,
        direct: tg.length ? out.direct.data.slice() : null,
        ms: performance.now() - t0,
        fed: T,
      };
    } finally {
      for (const t of Object.values(out)) t.dispose?.();
    }
  };
  let last = Promise.resolve();
  const run = (ids, options) => {
    const result = last.then(() => step(ids, options));
    last = result.catch(() => {});
    return result;
  };
  return {
    kind: "browser",
    describe: `the page itself (${manifest.name}: onnxruntime-web, WebAssembly, one thread)`,
    config: c,
    tokens: manifest.tokens,
    bytes: manifest.token_bytes.map(fromBase64),
    special: manifest.special || {},
    chat: manifest.chat || null,
    downloadBytes: manifest.download_bytes,
    encode: async (text) => tokenizer.encode(text, { add_special_tokens: false }).ids,
    memory: tabMemory,
    run,
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
    promise.catch(() => started.delete(key));
  }
  return started.get(key);
}
