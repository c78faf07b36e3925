// The playground's stored analysis: what Python computed of the view's text (the widget state's
// `stored`), as the page draws it before the live model starts; and the heads' direct
// contributions, largest first.
import { fromBase64 } from "./backend.js";
import { PANEL_WINDOW, rowWindow } from "./rows.js";

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
// vocabulary stores only its most probable logits and the others' log-weight at each
// temperature of the slider (`rest_logz` at `temperatures`), as the sampling view does.
export function fromStored(stored, { n_ctx: nCtx, d_vocab: V, n_layers: L, n_heads: H }) {
  let logits = stored.logits,
    rest = null,
    patterns = stored.patterns;
  const window = stored.ids.slice(-nCtx);
  if (stored.patterns_u8) patterns = patternsFromBytes(stored.patterns_u8, L, H, window.length);
  if (stored.top) {
    logits = new Float64Array(V).fill(-Infinity);
    stored.top.ids.forEach((id, n) => {
      logits[id] = stored.top.logits[n];
    });
    rest = { temps: stored.top.temperatures, logZ: stored.top.rest_logz };
  }
  return {
    window,
    logits,
    rest,
    ...windowed(patterns, L, H, window.length),
    lens: stored.lens,
    direct: null,
    target: null,
  };
}

// Patterns of T positions as the heads panel shows them: those of a longer text than its window
// cut to it (rows.js), with each head's last-row entropy.
export function windowed(patterns, L, H, T, W = PANEL_WINDOW) {
  if (T <= W) return { patterns, positions: null, entropy: null };
  const flat = new Float32Array(L * H * T * T);
  patterns.forEach((layer, l) => {
    layer.forEach((A, h) => {
      A.forEach((row, i) => {
        flat.set(Array.from(row).slice(0, i + 1), ((l * H + h) * T + i) * T);
      });
    });
  });
  return rowWindow(L, H, W).add(flat, 0, T).heads();
}

// The others' log-weight at temperature T (null where every logit is known, or at T = 0): the
// stored value at the nearest stored temperature, which the slider's steps always hit exactly;
// -Infinity where the others have no weight at all.
export function restLogZAt(rest, T) {
  if (!rest || T === 0) return null;
  let g = 0;
  rest.temps.forEach((t, k) => {
    if (Math.abs(t - T) < Math.abs(rest.temps[g] - T)) g = k;
  });
  return rest.logZ[g] === null ? -Infinity : rest.logZ[g];
}

// The heads (layer, head) with the largest direct contributions |d|, largest first.
export function largestDirect(direct, H, n) {
  return Array.from(direct, (d, k) => [d, Math.floor(k / H), k % H])
    .sort((a, b) => Math.abs(b[0]) - Math.abs(a[0]) || a[1] - b[1] || a[2] - b[2])
    .slice(0, n);
}
