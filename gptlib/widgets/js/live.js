// The playground's live model: two backends with one API (LIVE_CONTRACT.md, section 3),
//   {kind, describe, config, tokens, bytes, special, chat, encode(text) -> ids,
//    run(ids, {mask, lens, targets}) -> {logits, patterns, lens, direct, ms}, memory()}
// - the kernel (Jupyter, Colab): PyTorch (gptlib.export.step on the whole context), reached by
//   the widget's custom messages;
// - the page itself (the HTML book, no kernel): onnxruntime-web (WebAssembly, one thread) runs the
//   step graph gptlib.export writes, with the keys and values of the text so far kept between
//   calls, and @huggingface/tokenizers the tokenizer; both libraries are files the book serves
//   itself (vendored from npm), and the model's files are fetched only when the reader starts it.
// `mask` is (n_layers * n_heads) numbers, 1 keeps a head and 0 ablates it; `lens` the residual
// streams (0 .. n_layers) to read through the logit lens at the last position, or null; `targets`
// token ids whose logit each head adds to directly, or null.

const VENDOR = {
  ort: "vendor/onnxruntime-web/ort.wasm.min.mjs",
  ortDir: "vendor/onnxruntime-web/",
  tokenizers: "vendor/tokenizers/tokenizers.min.mjs",
};
const VERSION = 2;
// Downloads above this many bytes wait for the reader to agree.
export const CONFIRM_ABOVE = 20e6;

export class LiveError extends Error {}

// The folder the book serves its static files from (".../_static/"), found from its scripts.
export function staticBase(doc = document) {
  for (const s of doc.querySelectorAll("script[src]")) {
    const i = s.src.lastIndexOf("/_static/");
    if (i >= 0) return s.src.slice(0, i + "/_static/".length);
  }
  return null;
}

export function fromBase64(s) {
  const b = atob(s),
    u = new Uint8Array(b.length);
  for (let i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
  return u;
}

// A byte count for people: "4.2 MB".
export const megabytes = (n) => `${(n / 1e6).toFixed(1)} MB`;

// The top n of a row of logits (ties: the lower id first), with their probabilities at
// temperature 1: one pass, no sort of the whole vocabulary.
export function topTokens(logits, n) {
  let m = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > m) m = logits[i];
  let z = 0;
  const top = []; // [logit, id], best first
  for (let i = 0; i < logits.length; i++) {
    const y = logits[i];
    z += Math.exp(y - m);
    if (top.length < n || y > top[top.length - 1][0]) {
      let k = top.length;
      while (k > 0 && top[k - 1][0] < y) k--;
      top.splice(k, 0, [y, i]);
      if (top.length > n) top.pop();
    }
  }
  return { ids: top.map(([, i]) => i), probs: top.map(([y]) => Math.exp(y - m) / z) };
}

// The lens of the step's outputs: per requested stream, its top ids and their probabilities
// p = exp(logit - lse) (lse: the logsumexp of the stream's whole row).
export function lensTops(ids, logits, lse, n, K) {
  return [...Array(n).keys()].map((s) => ({
    ids: Array.from(ids.slice(s * K, (s + 1) * K), Number),
    probs: Array.from(logits.slice(s * K, (s + 1) * K), (y) => Math.exp(y - lse[s])),
  }));
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
export function nestRows(rows, L, H) {
  return [...Array(L).keys()].map((l) => [...Array(H).keys()].map((h) => rows[l * H + h]));
}

// The patterns of a flat (n_layers, n_heads, T, T) array as nested rows of T.
export function nestFlat(flat, L, H, T) {
  return [...Array(L).keys()].map((l) =>
    [...Array(H).keys()].map((h) =>
      [...Array(T).keys()].map((i) =>
        flat.subarray(((l * H + h) * T + i) * T, ((l * H + h) * T + i + 1) * T),
      ),
    ),
  );
}

// What the tab says of its memory, or null where the browser does not say
// (performance.memory: Chromium's JavaScript heap, WebAssembly's memory outside it).
export function tabMemory() {
  const m = globalThis.performance && performance.memory;
  if (!m?.usedJSHeapSize) return null;
  return {
    bytes: m.usedJSHeapSize,
    limit: m.jsHeapSizeLimit,
    what: "the JavaScript heap (performance.memory)",
  };
}

// Custom messages to the kernel, each answered by one message with the same `req`:
// ask(content, timeoutMs) is a promise of {msg, buffers}. ask.close() stops listening, clears the
// timers and rejects what is still waiting (the view is closed).
export function kernelLink(model) {
  let req = 0;
  const waiting = new Map(),
    timers = new Set();
  const listener = (msg, buffers) => {
    const w = msg && waiting.get(msg.req);
    if (!w) return;
    waiting.delete(msg.req);
    if (msg.kind === "error") w.reject(new LiveError(msg.message));
    else w.resolve({ msg, buffers: buffers || [] });
  };
  model.on("msg:custom", listener);
  const ask = (content, timeoutMs) =>
    new Promise((resolve, reject) => {
      const id = ++req;
      waiting.set(id, { resolve, reject });
      try {
        model.send({ ...content, req: id });
      } catch (e) {
        waiting.delete(id);
        reject(e);
        return;
      }
      if (timeoutMs) {
        const t = setTimeout(() => {
          timers.delete(t);
          if (waiting.delete(id)) reject(new LiveError("no answer"));
        }, timeoutMs);
        timers.add(t);
      }
    });
  ask.close = () => {
    model.off("msg:custom", listener);
    timers.forEach(clearTimeout);
    timers.clear();
    for (const w of waiting.values()) w.reject(new LiveError("the view was closed"));
    waiting.clear();
  };
  return ask;
}

const view = (b, T) => new T(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

// The kernel's backend: each run sends the whole window, and the kernel answers with step on an
// empty cache (PyTorch is fast enough there; nothing to keep in step between the two sides).
export async function kernelBackend(ask) {
  const { msg } = await ask({ kind: "start" });
  const c = msg.config,
    L = c.n_layers,
    H = c.n_heads,
    K = msg.lens_top;
  return {
    kind: "kernel",
    describe: "PyTorch in the kernel",
    config: c,
    tokens: msg.tokens,
    bytes: msg.token_bytes.map(fromBase64),
    special: msg.special || {},
    chat: msg.chat || null,
    encode: async (text) => (await ask({ kind: "encode", text })).msg.ids,
    memory: () => null,
    run: async (ids, { mask = null, lens = null, targets = null } = {}) => {
      const t0 = performance.now();
      const { buffers } = await ask({
        kind: "step",
        ids,
        mask: mask && Array.from(mask),
        lens,
        targets,
      });
      const T = ids.length;
      const [logits, attn, lensIds, lensLogits, lensLse, direct] = buffers;
      return {
        logits: view(logits, Float32Array),
        patterns: nestFlat(view(attn, Float32Array), L, H, T),
        lens: lens
          ? lensTops(
              view(lensIds, BigInt64Array),
              view(lensLogits, Float32Array),
              view(lensLse, Float32Array),
              lens.length,
              K,
            )
          : null,
        direct: targets?.length ? view(direct, Float32Array) : null,
        ms: performance.now() - t0,
      };
    },
  };
}

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

// The page's backend around a session of the step graph: it keeps the cache (see plan).
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
  const run = async (ids, { mask = null, lens = null, targets = null } = {}) => {
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

// --- the stored analysis (made by Python for the view's text) and what the page draws of it ---
// A large vocabulary's patterns come as bytes round(255 a), the lower triangles row by row.
export function patternsFromBytes(b64, L, H, T) {
  const u = fromBase64(b64),
    n = (T * (T + 1)) / 2;
  return [...Array(L).keys()].map((l) =>
    [...Array(H).keys()].map((h) => {
      let at = (l * H + h) * n;
      return [...Array(T).keys()].map((i) => {
        const row = Float32Array.from(u.subarray(at, at + i + 1), (x) => x / 255);
        at += i + 1;
        return row;
      });
    }),
  );
}

// The analysis stored in the widget state (PlaygroundView), as the page draws it. A large
// vocabulary stores only its most probable logits and the others' log-weight (`rest_logz`).
export function fromStored(stored, { n_ctx: nCtx, d_vocab: V, n_layers: L, n_heads: H }) {
  let logits = stored.logits,
    restLogZ = null,
    patterns = stored.patterns;
  const window = stored.ids.slice(-nCtx);
  if (stored.patterns_u8) patterns = patternsFromBytes(stored.patterns_u8, L, H, window.length);
  if (stored.top) {
    logits = new Float64Array(V).fill(-Infinity);
    stored.top.ids.forEach((id, n) => {
      logits[id] = stored.top.logits[n];
    });
    restLogZ = stored.top.rest_logz;
  }
  return { window, logits, restLogZ, patterns, lens: stored.lens, direct: null, target: null };
}

// The heads (layer, head) with the largest direct contributions |d|, largest first.
export function largestDirect(direct, H, n) {
  return Array.from(direct, (d, k) => [d, Math.floor(k / H), k % H])
    .sort((a, b) => Math.abs(b[0]) - Math.abs(a[0]) || a[1] - b[1] || a[2] - b[2])
    .slice(0, n);
}
