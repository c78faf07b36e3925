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
