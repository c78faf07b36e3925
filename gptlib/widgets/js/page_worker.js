// The live model's Web Worker (page.js starts it; scripts/build_widgets.py bundles this module
// and puts its text into the views' bundles): the model's files are downloaded here (or read
// from the browser's Cache API, where an earlier visit left them under their SHA-256), SmolLM2's
// 4-bit blocks unpacked into float32 (q4.js) and handed to onnxruntime-web as the graph's
// external data, and every step run here, so that the page's main thread never waits on the
// model. Messages, each with an id the answer repeats:
//   {type: "start", id, base, manifestUrl, manifest} -> {id, result: true} once the session is
//     made; {type: "progress", text, fraction} on the way;
//   {type: "run", id, ids, options} -> {id, result: cacheStepper's result} (options.head: one
//     head at one query, whose result.head head.js's pageInputs reads);
//   {type: "encode", id, text} -> {id, result: the ids} (@huggingface/tokenizers, here too);
//   {type: "release", id} -> {id, result: true}: the session released.
// A failure answers {id, error, live}: live when the message is written for the reader.
import { dropArray as drop, LiveError, megabytes } from "./backend.js";
import { cacheStepper } from "./page.js";
import { lazyWeights } from "./q4.js";

const VENDOR = {
  ort: "vendor/onnxruntime-web/ort.wasm.min.mjs",
  ortDir: "vendor/onnxruntime-web/",
  tokenizers: "vendor/tokenizers/tokenizers.min.mjs",
};
const CACHE = "gptlib-live-models";

// Milliseconds spent on each part of the start (the worker's answer to "start"), for the bench.
let phases = {};
const since = (key, t0) => {
  phases[key] = (phases[key] || 0) + performance.now() - t0;
};

async function sha256Hex(bytes) {
  const t0 = performance.now();
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  since("sha256", t0);
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The browser's cache of model files, or null where there is none (an insecure context).
async function openCache() {
  try {
    return globalThis.caches ? await caches.open(CACHE) : null;
  } catch {
    return null;
  }
}

// The key of a file's bytes in the cache: its URL and its SHA-256.
const cacheKey = (url, sha) => `${url}?sha256=${sha}`;

// The body of a response (a stream) into dest, which it must fill exactly; onBytes(k) as the
// bytes come. Returns null, or what is wrong (its bytes are not the manifest's count).
async function streamInto(body, p, dest, onBytes) {
  let got = 0;
  const reader = body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (got + value.length > p.bytes) {
      await reader.cancel();
      return `${p.file} has more bytes than the manifest's ${p.bytes}`;
    }
    dest.set(value, got);
    got += value.length;
    onBytes(value.length);
  }
  return got === p.bytes ? null : `${p.file} has ${got} bytes, the manifest says ${p.bytes}`;
}

// The bytes of the file `p` ({file, bytes, sha256}) at `url` into out[at .. at + p.bytes),
// from the cache when they are there with their SHA-256, else downloaded, checked and put in
// the cache (dropping that file's earlier versions); onBytes(k) as they come. Both are streamed
// into `out`: a cached file read whole (arrayBuffer) was a second copy of the 96 MB of blocks,
// held until the garbage collector's next full pass.
async function fileInto(cache, url, p, out, at, onBytes) {
  const key = cacheKey(url, p.sha256),
    dest = out.subarray(at, at + p.bytes);
  const hit = cache && (await cache.match(key).catch(() => null));
  if (hit?.body) {
    let n = 0;
    const wrong = await streamInto(hit.body, p, dest, (k) => {
      n += k;
      onBytes(k);
    }).catch((e) => e.message);
    if (!wrong && (await sha256Hex(dest)) === p.sha256) return;
    onBytes(-n); // read again below
    await cache.delete(key);
  }
  let r;
  try {
    r = await fetch(url);
  } catch (e) {
    throw new LiveError(`could not fetch ${p.file} (${url}): ${e.message}`);
  }
  if (!r.ok) throw new LiveError(`could not fetch ${p.file} (${url}): HTTP ${r.status}`);
  const wrong = await streamInto(r.body, p, dest, onBytes);
  if (wrong) throw new LiveError(wrong);
  if (globalThis.crypto?.subtle && (await sha256Hex(dest)) !== p.sha256) {
    throw new LiveError(`${p.file} does not match its SHA-256 in the manifest`);
  }
  if (cache) {
    try {
      for (const old of await cache.keys()) {
        if (old.url.startsWith(`${url}?sha256=`)) await cache.delete(old);
      }
      await cache.put(key, new Response(dest)); // the Response copies the bytes
    } catch {
      // a full or refused cache: the next visit downloads again
    }
  }
}

// The concatenated files `pieces` (their total `bytes`) relative to `manifestUrl`.
async function download(cache, manifestUrl, listed, onBytes) {
  let out;
  try {
    out = new Uint8Array(listed.bytes);
  } catch (e) {
    throw new LiveError(`This tab cannot hold ${megabytes(listed.bytes)}: ${e.message}.`);
  }
  let at = 0;
  const jobs = [];
  for (const p of listed.pieces) {
    jobs.push(fileInto(cache, new URL(p.file, manifestUrl).href, p, out, at, onBytes));
    at += p.bytes;
  }
  await Promise.all(jobs);
  return out;
}

let stepper = null,
  session = null,
  tokenizer = null,
  queue = Promise.resolve();

async function start({ base, manifestUrl, manifest, threads = 1 }, progress) {
  if (session) throw new Error("this worker holds a session already");
  phases = {};
  const t0 = performance.now();
  const cache = await openCache();
  const blocks = manifest.weights?.blocks;
  const tokFile = { bytes: manifest.tokenizer.bytes, pieces: [manifest.tokenizer] };
  const total = manifest.onnx.bytes + (blocks ? blocks.bytes : 0) + tokFile.bytes;
  let done = 0;
  const tick = (n) => {
    done += n;
    progress(
      `downloading ${manifest.name}: ${megabytes(done)} of ${megabytes(total)}`,
      done / total,
    );
  };
  tick(0);
  const [ort, tk, tokText, graph, packed] = await Promise.all([
    import(base + VENDOR.ort),
    import(base + VENDOR.tokenizers),
    download(cache, manifestUrl, tokFile, tick),
    download(cache, manifestUrl, manifest.onnx, tick),
    blocks ? download(cache, manifestUrl, blocks, tick) : null,
  ]);
  since("files", t0);
  let t1 = performance.now();
  const tok = new tk.Tokenizer(JSON.parse(new TextDecoder().decode(tokText)), {});
  since("tokenizer", t1);
  // The 4-bit blocks are unpacked tensor by tensor while onnxruntime copies each into its own
  // memory (q4.js's lazyWeights): the float32 weights are never held whole in JavaScript.
  // Without prepacking, onnxruntime keeps each matrix once (packed copies beside the weights
  // grew the tab by a further ~0.2 GB), and a step measured no slower (bench/page_memory.py).
  const weights = packed ? lazyWeights(packed, manifest.weights) : null;
  // A graph optimized ahead of time (the export's optimize_ahead: SmolLM2's) is loaded as it is:
  // optimizing it here took half of the session's creation, for a step no faster (bench/README).
  const options = {
    executionProviders: ["wasm"],
    graphOptimizationLevel: manifest.onnx.optimized ? "disabled" : "all",
    extra: { session: { disable_prepacking: "1" } },
  };
  if (weights) options.externalData = [{ path: manifest.weights.file, data: weights.data }];
  // One thread unless the page asks for more (page.js's liveThreads): threads need a cross-origin
  // isolated page, and two measured slower than one on the 2-core machine the book is built on
  // (onnxruntime-web 1.30 in node, a bare SmolLM2 step at 200 tokens 821-868 ms against
  // 478-558 ms, under load).
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = base + VENDOR.ortDir;
  progress("unpacking the 4-bit weights into onnxruntime-web", 1);
  t1 = performance.now();
  try {
    session = await ort.InferenceSession.create(graph, options);
    if (weights && !weights.served()) {
      throw new Error("it did not read every weight from the external data");
    }
  } catch (e) {
    const s = session;
    session = null;
    await s?.release();
    throw new LiveError(
      `onnxruntime-web could not load ${manifest.name} in this tab (${e.message}); ` +
        "a phone or a small tablet may lack the memory. What is shown is the stored analysis.",
    );
  } finally {
    options.externalData = null; // onnxruntime holds its own copy of the weights now
    weights?.release();
    drop(packed);
    drop(graph);
  }
  since("session", t1);
  if (weights) phases.unpack = weights.ms(); // within the session's creation
  since("total", t0);
  stepper = cacheStepper(ort, session, manifest);
  tokenizer = tok;
  const ms = Object.fromEntries(Object.entries(phases).map(([k, v]) => [k, Math.round(v)]));
  // the threads onnxruntime-web runs: one where the page is not cross-origin isolated
  return { phases: ms, threads: ort.env.wasm.numThreads };
}

async function handle(msg) {
  const post = (m, transfer = []) => self.postMessage({ id: msg.id, ...m }, transfer);
  try {
    if (msg.type === "start") {
      post({
        result: await start(msg, (text, fraction) => post({ type: "progress", text, fraction })),
      });
    } else if (msg.type === "run") {
      if (!stepper) throw new LiveError("the live model is not started (or was released)");
      const r = await stepper(msg.ids, msg.options || {});
      const transfer = [r.logits.buffer];
      if (r.cut) transfer.push(r.cut.buffer, r.entropy.buffer);
      if (r.direct) transfer.push(r.direct.buffer);
      post({ result: r }, transfer);
    } else if (msg.type === "encode") {
      if (!tokenizer) throw new LiveError("the live model is not started (or was released)");
      post({ result: tokenizer.encode(msg.text, { add_special_tokens: false }).ids });
    } else if (msg.type === "release") {
      const s = session;
      session = stepper = tokenizer = null;
      if (s) await s.release();
      post({ result: true });
    } else {
      throw new Error(`unknown message ${msg.type}`);
    }
  } catch (e) {
    post({ error: e?.message || String(e), live: e instanceof LiveError });
  }
}

// One message at a time: a step waits for the one before (they share the cache).
if (typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope) {
  self.onmessage = (e) => {
    queue = queue.then(() => handle(e.data));
  };
}
