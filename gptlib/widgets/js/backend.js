// What the live model's two backends share (kernel.js: PyTorch in the kernel; page.js:
// onnxruntime-web in the page itself): the error they raise, where the book's files are, and the
// step's outputs as the views read them.

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

// Give a typed array's memory back now, not at the garbage collector's next full pass (which
// may come much later): its buffer, detached, holds nothing, nor does any other view of it.
// Where the browser cannot detach (no ArrayBuffer.prototype.transfer; a SharedArrayBuffer has
// none), the collector will.
export const dropArray = (a) => {
  if (ArrayBuffer.isView(a)) a.buffer.transfer?.(0);
};

// A byte count for people: "4.2 MB".
export const megabytes = (n) => `${(n / 1e6).toFixed(1)} MB`;

// The lens of the step's outputs: per requested stream, its top ids and their probabilities
// p = exp(logit - lse) (lse: the logsumexp of the stream's whole row).
export function lensTops(ids, logits, lse, n, K) {
  return [...Array(n).keys()].map((s) => ({
    ids: Array.from(ids.slice(s * K, (s + 1) * K), Number),
    probs: Array.from(logits.slice(s * K, (s + 1) * K), (y) => Math.exp(y - lse[s])),
  }));
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

// The memory a tab needs to run a model of the page, from its manifest, in bytes: the float32
// weights onnxruntime-web keeps (manifest.weights.bytes, or the graph's own bytes) and what the
// session and the worker hold beside them, as measured in Chromium (bench/page_memory.py,
// 2026-11-28: SmolLM2's 538 MB of float32 weights grew the renderer by 0.81-0.99 GB once loaded,
// at most 0.99 GB at the peak; 1.5 x 538 MB + 0.2 GB = 1.0 GB).
export const WORKING_BYTES = 0.2e9;
export function tabNeeds(manifest) {
  const weights = manifest.weights ? manifest.weights.bytes : manifest.onnx.bytes;
  return Math.round(1.5 * weights + WORKING_BYTES);
}

// A tiny module of one SIMD instruction (i32x4.splat): onnxruntime-web's build needs SIMD.
const SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15,
  253, 98, 11,
]);

// Why this device cannot run the model of `manifest` (a sentence for the reader), or null when it
// may: checked before anything is downloaded, from what the browser says (`nav`: navigator,
// `wasm`: WebAssembly). WebAssembly with SIMD and Web Workers are needed; a tab holds at most a
// third of the device's memory where the browser says it (navigator.deviceMemory, in GB,
// rounded down and at most 8), and about 1.4 GB on an iPhone or iPad (Safari closes the tab
// beyond; it does not say its memory); 32-bit WebAssembly stops at 4 GB.
export function deviceRefusal(manifest, nav = globalThis.navigator, wasm = globalThis.WebAssembly) {
  const need = tabNeeds(manifest);
  const stored = "What is shown is the stored analysis";
  if (!wasm || typeof wasm !== "object" || typeof globalThis.Worker !== "function") {
    return `This browser has no WebAssembly (or Web Workers), or they are switched off. ${stored}.`;
  }
  let simd = false;
  try {
    simd = wasm.validate(SIMD_PROBE);
  } catch {
    simd = false;
  }
  if (!simd) {
    return `This browser's WebAssembly lacks SIMD, which onnxruntime-web needs. ${stored}.`;
  }
  const why = (what) =>
    `${manifest.name} needs about ${(need / 1e9).toFixed(1)} GB of memory in this tab, and ${what}. ` +
    `${stored}; the book's small English model (Chapters 7 and 8) needs far less.`;
  if (need > 4e9) return why("WebAssembly holds at most 4 GB");
  const gb = Number(nav?.deviceMemory);
  if (gb > 0 && need > (gb * 1e9) / 3) {
    return why(`this device says it has ${gb} GB in all (a tab gets about a third of it)`);
  }
  const ua = String(nav?.userAgent || ""),
    ios = /iPhone|iPad|iPod/.test(ua) || (/Macintosh/.test(ua) && nav?.maxTouchPoints > 1);
  if (ios && need > 1.4e9) return why("Safari on an iPhone or iPad closes a tab beyond 1.4 GB");
  return null;
}
