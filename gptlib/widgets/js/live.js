// The playground's live model: the two backends that compute on the reader's text, each
// {kind, describe, config, tokens, bytes, encode(text), forward(ids)}:
//   - the kernel (Jupyter, Colab): PyTorch, reached by the widget's custom messages;
//   - the page itself (the HTML book, no kernel): onnxruntime-web (WebAssembly, one thread) runs
//     the graph gptlib.export writes, and @huggingface/tokenizers the BPE; both are files the
//     book serves itself (vendored from npm), loaded only when the reader starts the live model.

const VENDOR = {
  ort: "vendor/onnxruntime-web/ort.wasm.min.mjs",
  ortDir: "vendor/onnxruntime-web/",
  tokenizers: "vendor/tokenizers/tokenizers.min.mjs",
};

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
  const b = atob(s), u = new Uint8Array(b.length);
  for (let i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
  return u;
}

// The top n of a row of logits (ties: the lower id first), with their probabilities at
// temperature 1: one pass, no sort of the whole vocabulary.
export function topTokens(logits, n) {
  let m = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > m) m = logits[i];
  let z = 0;
  const top = [];  // [logit, id], best first
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

// Custom messages to the kernel, each answered by one message with the same `req`:
// ask(content, timeoutMs) is a promise of {msg, buffers}. ask.close() stops listening, clears the
// timers and rejects what is still waiting (the view is closed).
export function kernelLink(model) {
  let req = 0;
  const waiting = new Map(), timers = new Set();
  const listener = (msg, buffers) => {
    const w = msg && waiting.get(msg.req);
    if (!w) return;
    waiting.delete(msg.req);
    if (msg.kind === "error") w.reject(new LiveError(msg.message));
    else w.resolve({ msg, buffers: buffers || [] });
  };
  model.on("msg:custom", listener);
  const ask = (content, timeoutMs) => new Promise((resolve, reject) => {
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
    waiting.forEach((w) => w.reject(new LiveError("the view was closed")));
    waiting.clear();
  };
  return ask;
}

const f32 = (b) => new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

export async function kernelBackend(ask) {
  const { msg } = await ask({ kind: "start" });
  return {
    kind: "kernel",
    describe: "PyTorch in the kernel",
    config: msg.config,
    tokens: msg.tokens,
    bytes: msg.token_bytes.map(fromBase64),
    encode: async (text) => (await ask({ kind: "encode", text })).msg.ids,
    forward: async (ids) => {
      const { buffers } = await ask({ kind: "forward", ids });
      return { logits: f32(buffers[0]), patterns: f32(buffers[1]), lens: f32(buffers[2]) };
    },
  };
}

const FILE_PAGE = "The live model cannot start here: this page was opened from a file (file://), and browsers do " +
  "not let such pages load WebAssembly. Serve the book over http (for instance `python -m http.server` in " +
  "the built book's folder) or run the notebook in Jupyter or Colab. What is shown is the stored analysis.";
const NO_HOST = "The live model needs a running kernel (Jupyter, Colab) or the HTML book served over http, " +
  "and neither is here. What is shown is the stored analysis.";

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

export async function browserBackend(source, weightsSha, progress) {
  if (location.protocol === "file:") throw new LiveError(FILE_PAGE);
  const base = staticBase();
  if (!base) throw new LiveError(NO_HOST);
  const manifestUrl = new URL(source, base).href;
  progress("reading the model's manifest");
  const manifest = await (await fetchOk(manifestUrl, "the model's manifest")).json();
  if (manifest.format !== "gptlib-live" || manifest.version !== 1) {
    throw new LiveError(`${manifestUrl} is not a gptlib live-model manifest (version 1)`);
  }
  if (weightsSha && manifest.weights_sha256 !== weightsSha) {
    throw new LiveError(`the model the book serves (${manifest.name}) is not the model this view was made from ` +
      "(their weights differ), so the page will not run it in its place.");
  }
  progress(`loading the model (${(manifest.onnx.bytes / 1e6).toFixed(1)} MB), onnxruntime-web and the tokenizer`);
  const file = (f) => new URL(f, manifestUrl).href;
  const [ort, tk, tokJson, onnxBytes] = await Promise.all([
    import(base + VENDOR.ort),
    import(base + VENDOR.tokenizers),
    fetchOk(file(manifest.tokenizer.file), "the tokenizer").then((r) => r.json()),
    fetchOk(file(manifest.onnx.file), "the model").then((r) => r.arrayBuffer()),
  ]);
  if (onnxBytes.byteLength !== manifest.onnx.bytes) {
    throw new LiveError(`${manifest.onnx.file} has ${onnxBytes.byteLength} bytes, the manifest says ${manifest.onnx.bytes}`);
  }
  if (globalThis.crypto && crypto.subtle) {  // only in secure contexts (https, localhost)
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", onnxBytes));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    if (hex !== manifest.onnx.sha256) throw new LiveError(`${manifest.onnx.file} does not match its SHA-256 in the manifest`);
  }
  ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which static hosts lack
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = base + VENDOR.ortDir;
  progress("starting onnxruntime-web");
  const session = await ort.InferenceSession.create(new Uint8Array(onnxBytes), { executionProviders: ["wasm"] });
  const tokenizer = new tk.Tokenizer(tokJson, {});
  const V = manifest.config.d_vocab;
  return {
    kind: "browser",
    describe: "the page itself (onnxruntime-web, WebAssembly, one thread)",
    config: manifest.config,
    tokens: manifest.tokens,
    bytes: manifest.token_bytes.map(fromBase64),
    encode: async (text) => tokenizer.encode(text, { add_special_tokens: false }).ids,
    forward: async (ids) => {
      const T = ids.length;
      const input = new ort.Tensor("int64", BigInt64Array.from(ids, (i) => BigInt(i)), [1, T]);
      const out = await session.run({ ids: input });
      const r = { logits: out.logits.data.slice((T - 1) * V, T * V), patterns: out.patterns.data.slice(), lens: out.lens.data.slice() };
      Object.values(out).forEach((t) => t.dispose && t.dispose());
      return r;
    },
  };
}
