// The heads panel's window of attention rows (gptlib/widgets/js/rows.js) at SmolLM2's size, 30
// layers x 9 heads, under node: a text of P0 tokens fed at once, then STEPS tokens one at a time,
// as a reader's clicks bring them. Each step times add (the step's new row of every head),
// heads() and the scores of every head (heads.js's headScores through total, on random token
// ids that repeat, so that the induction score is there too). With a second rows.js (another
// checkout's), the two run alternately on the same rows, and each time is printed for both.
// usage: node bench/bench_rows.mjs [P0=180] [STEPS=60] [OTHER_ROWS_JS]
import { headScores } from "../gptlib/widgets/js/heads.js";
import * as here from "../gptlib/widgets/js/rows.js";

const [p0s = "180", stepsS = "60", other = ""] = process.argv.slice(2);
const P0 = Number(p0s),
  STEPS = Number(stepsS);
const L = 30,
  H = 9,
  LH = L * H;
const impls = [["this", here]];
if (other) impls.push(["other", await import(new URL(other, `file://${process.cwd()}/`).href)]);

// Causal rows with a fixed seed (a linear congruential generator), each summing to 1.
let seed = 12345;
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
};
function rows(P, T) {
  const K = P + T,
    out = new Float32Array(LH * T * K);
  for (let k = 0; k < LH; k++) {
    for (let t = 0; t < T; t++) {
      const o = (k * T + t) * K,
        q = P + t;
      let s = 0;
      for (let j = 0; j <= q; j++) s += out[o + j] = rand();
      for (let j = 0; j <= q; j++) out[o + j] /= s;
    }
  }
  return out;
}
const ids = Array.from({ length: P0 + STEPS }, () => Math.floor(rand() * 40));

const windows = impls.map(([, m]) => m.rowWindow(L, H).add(rows(0, P0), 0, P0));
const times = impls.map(() => ({ add: [], heads: [], scores: [] }));
for (let S = P0 + 1; S <= P0 + STEPS; S++) {
  const step = rows(S - 1, 1);
  const order = S % 2 ? [...impls.keys()] : [...impls.keys()].reverse(); // who goes first
  for (const i of order) {
    const t0 = performance.now();
    windows[i].add(step, S - 1, 1, 1);
    const t1 = performance.now();
    const g = windows[i].heads();
    const t2 = performance.now();
    headScores(
      g.patterns,
      g.positions.map((p) => ids[p]),
      g.positions,
      g.total,
    );
    const t3 = performance.now();
    times[i].add.push(t1 - t0);
    times[i].heads.push(t2 - t1);
    times[i].scores.push(t3 - t2);
  }
}
const median = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
for (const [i, [name]] of impls.entries()) {
  const t = times[i];
  console.log(
    `${name}: median of ${STEPS} steps at ${P0 + 1} to ${P0 + STEPS} tokens: add ` +
      `${median(t.add).toFixed(2)} ms, heads() ${median(t.heads).toFixed(2)} ms, the scores ` +
      `of every head ${median(t.scores).toFixed(2)} ms`,
  );
}
