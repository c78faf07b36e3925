// The next-token distribution in the page: gptlib.sampling.next_token_probs (temperature, then
// top-k, then top-p, then renormalise), for every token of a vocabulary or for its most probable
// tokens together with the total weight of the others; seeded draws; and the chart.
import { make, show, svg } from "./dom.js";

// Token indices by decreasing logit, ties by the lower index (torch.sort(stable=True) order).
// Float32 logits (the page's model) are sorted by their bits: the float32's bits made monotone
// (negatives' bits flipped, positives' sign bit set) and flipped again for decreasing order, a
// 32-bit key a token, then a least-significant-digit radix sort on the keys' three digits of 11
// bits: each pass is stable, so tokens of equal logits stay in the order of their indices. Linear
// in the vocabulary: SmolLM2's 49,152 logits in 2.5 ms under node (a native sort of one number a
// token took 6 ms, a comparator 8x that). Other arrays (float64 numbers), and a vocabulary of
// over 2^31 tokens, sort with the comparator.
const F32 = new Float32Array(1),
  U32 = new Uint32Array(F32.buffer);
const DIGIT = 11,
  BUCKETS = 1 << DIGIT;

// The 32-bit key of a float32 logit y: larger logits, smaller keys; -0 ties with +0, as in the
// comparator.
function descendingKey(y) {
  F32[0] = y === 0 ? 0 : y;
  const u = U32[0],
    up = u & 0x80000000 ? ~u : u | 0x80000000;
  return ~up >>> 0;
}

export function byLogit(logits) {
  const n = logits.length;
  if (!(logits instanceof Float32Array) || n > 2 ** 31) {
    return [...Array(n).keys()].sort((a, b) => logits[b] - logits[a] || a - b);
  }
  const keys = new Uint32Array(n);
  for (let i = 0; i < n; i++) keys[i] = descendingKey(logits[i]);
  let from = new Int32Array(n),
    to = new Int32Array(n);
  for (let i = 0; i < n; i++) from[i] = i;
  const count = new Int32Array(BUCKETS);
  for (let shift = 0; shift < 32; shift += DIGIT) {
    count.fill(0);
    for (let i = 0; i < n; i++) count[(keys[i] >>> shift) & (BUCKETS - 1)] += 1;
    for (let b = 0, at = 0; b < BUCKETS; b++) {
      const c = count[b];
      count[b] = at; // where bucket b's first token goes
      at += c;
    }
    for (let i = 0; i < n; i++) {
      const t = from[i];
      to[count[(keys[t] >>> shift) & (BUCKETS - 1)]++] = t;
    }
    [from, to] = [to, from];
  }
  const order = new Array(n);
  for (let k = 0; k < n; k++) order[k] = from[k];
  return order;
}

// The sum of the numbers x, first to last (the order of the reductions it replaces).
function sum(x) {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i];
  return s;
}

// The distribution for `logits` at `temperature` after top-k (0 = off) and top-p (1 = off).
// `restLogZ`, when given, stands for the tokens whose logits are not listed, all less probable
// than the listed ones: log sum exp((y - m) / temperature) over them, m the largest logit.
// Returns p (per listed token), rest (the others' mass after the cuts), restAll (before them),
// cum (the cumulative mass that top-p compares with, listed tokens in byLogit order), order, and
// approx: true when a cut reaches into the unlisted tokens, whose single logits the page lacks
// (top-p then keeps topP - (mass before them) of theirs: less than the model, by less than one
// of those tokens' probability). `sorted`, when given, is byLogit(logits), computed once for
// several distributions of the same logits (a sort of SmolLM2's 49,152 takes milliseconds).
export function distribution(logits, temperature, topK, topP, restLogZ = null, sorted = null) {
  const n = logits.length,
    order = sorted || byLogit(logits);
  const p = new Array(n).fill(0);
  if (temperature === 0) {
    p[order[0]] = 1;
    return { p, rest: 0, restAll: 0, cum: order.map(() => 1), order, approx: false };
  }
  const m = logits[order[0]];
  let z = 0,
    rest = restLogZ === null || restLogZ === undefined ? 0 : Math.exp(restLogZ);
  for (let i = 0; i < n; i++) {
    p[i] = Math.exp((logits[i] - m) / temperature);
    z += p[i];
  }
  z += rest;
  for (let i = 0; i < n; i++) p[i] /= z;
  rest /= z;
  const restAll = rest;
  let approx = false;
  if (topK > 0) {
    for (let r = topK; r < n; r++) p[order[r]] = 0;
    if (topK <= n) rest = 0;
    else if (rest > 0) approx = true; // the k most probable include unlisted tokens
    const zk = sum(p) + rest;
    for (let i = 0; i < n; i++) p[i] /= zk;
    rest /= zk;
  }
  const cum = new Array(n);
  for (let r = 0, c = 0; r < n; r++) cum[r] = c += p[order[r]];
  if (topP < 1) {
    // keep tokens, most probable first, while the mass before them is below topP
    let before = 0;
    const keep = new Array(n).fill(false);
    for (const i of order) {
      if (before >= topP) break;
      keep[i] = true;
      before += p[i];
    }
    for (let i = 0; i < n; i++) if (!keep[i]) p[i] = 0;
    if (rest > 0) {
      if (before < topP) {
        if (topP - before < rest) approx = true;
        rest = Math.min(rest, topP - before);
      } else rest = 0;
    }
    const zp = sum(p) + rest;
    for (let i = 0; i < n; i++) p[i] /= zp;
    rest /= zp;
  }
  return { p, rest, restAll, cum, order, approx };
}

// gptlib.sampling.next_token_probs on a whole vocabulary.
export function nextTokenProbs(logits, temperature, topK, topP) {
  return distribution(logits, temperature, topK, topP).p;
}

// The cumulative mass top-p compares with, token by token in the order of byLogit.
export function cumulativeMass(logits, temperature, topK) {
  return distribution(logits, temperature, topK, 1).cum;
}

// The logits after token `a` of a bigram table of counts: log(n_ab + s) for every token b, from
// the row's nonzero counts (compressed rows: indptr, indices, counts) and the smoothing s.
// gptlib.widgets.sampling.table_logits computes the same numbers.
export function tableLogits(table, a) {
  const V = table.indptr.length - 1,
    s = table.smoothing;
  const y = new Array(V).fill(Math.log(s));
  for (let k = table.indptr[a]; k < table.indptr[a + 1]; k++)
    y[table.indices[k]] = Math.log(table.counts[k] + s);
  return y;
}

// A seeded generator of uniform numbers in [0, 1): Marsaglia's xorshift32 (13, 17, 5).
export function xorshift32(seed) {
  let s = ((seed >>> 0) ^ 0x9e3779b9) >>> 0 || 1;
  return () => {
    s = (s ^ (s << 13)) >>> 0;
    s = (s ^ (s >>> 17)) >>> 0;
    s = (s ^ (s << 5)) >>> 0;
    return s / 4294967296;
  };
}

// Inverse-CDF draw: the first token, in the order given, whose cumulative probability exceeds u;
// -1 when u falls in the mass `rest` of the unlisted tokens, which come after every listed one.
export function drawIndex(p, order, u, rest = 0) {
  let c = 0,
    last = -1;
  for (const i of order) {
    if (p[i] <= 0) continue;
    c += p[i];
    last = i;
    if (u < c) return i;
  }
  return rest > 0 ? -1 : last; // else u is within rounding of 1
}

// Entropy in nats of a distribution (terms with p = 0 contribute 0).
export function entropy(p) {
  return -p.reduce((s, v) => s + (v > 0 ? v * Math.log(v) : 0), 0);
}

// The chart: the shown tokens (rows, most probable first) as bars on a fixed axis from 0 to 1,
// each over a ghost of its probability at temperature 1, the cumulative mass (what top-p cuts)
// as a line, the top-p threshold, and a last row for all other tokens together.
// rows: [{label, p, ghost, cum}], other: {label, p, ghost} or null, topP: 1 = no line.
export const CHART = { x0: 120, W: 320, top: 20, h: 18, right: 70 };
// One row of the chart at height y: the label, the ghost (temperature 1) behind the bar, and p.
function barRow(y, { label, p, ghost }, [rowClass, ghostClass, barClass]) {
  const { x0, W, h } = CHART;
  const g = svg("g", { class: `${rowClass}${p > 0 ? "" : " removed"}` });
  g.append(
    svg("text", { class: "gptlib-samp-tok", x: x0 - 6, y: y + 13, "text-anchor": "end" }, label),
    svg("rect", {
      class: ghostClass,
      x: x0,
      y: y + 2,
      width: (W * ghost).toFixed(2),
      height: h - 4,
    }),
    svg("rect", { class: barClass, x: x0, y: y + 4, width: (W * p).toFixed(2), height: h - 8 }),
    svg("text", { class: "gptlib-samp-p", x: x0 + W + 6, y: y + 13 }, p.toFixed(4)),
  );
  return g;
}

export function drawChart(chart, rows, other, topP) {
  const { x0, W, top, h, right } = CHART;
  const n = rows.length + (other ? 1 : 0);
  const width = x0 + W + right,
    height = top + h * n + 4;
  // A fixed drawing scaled to the width available (narrow pages shrink it, never overflow).
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.setAttribute("width", String(width));
  chart.setAttribute("height", String(height));
  chart.style.maxWidth = `${width}px`;
  const parts = [];
  [0, 0.25, 0.5, 0.75, 1].forEach((t) => {
    parts.push(
      svg("line", {
        class: "gptlib-samp-grid",
        x1: x0 + W * t,
        x2: x0 + W * t,
        y1: top - 4,
        y2: top + h * n,
      }),
    );
    parts.push(
      svg(
        "text",
        { class: "gptlib-samp-tick", x: x0 + W * t, y: top - 7, "text-anchor": "middle" },
        String(t),
      ),
    );
  });
  const clip = (t) => (t.length > 14 ? `${t.slice(0, 13)}\u2026` : t); // a label that fits its column
  rows.forEach((r, k) => {
    const row = { ...r, label: clip(show(r.label)) };
    parts.push(
      barRow(top + h * k, row, ["gptlib-samp-row", "gptlib-samp-ghost", "gptlib-samp-bar"]),
    );
  });
  if (other) {
    const classes = [
      "gptlib-samp-row gptlib-samp-other",
      "gptlib-samp-other-ghost",
      "gptlib-samp-other-bar",
    ];
    parts.push(barRow(top + h * rows.length, other, classes));
  }
  const pts = rows.map((r, k) => `${(x0 + W * r.cum).toFixed(2)},${top + h * k + h / 2}`);
  parts.push(svg("polyline", { class: "gptlib-samp-cum", points: pts.join(" ") }));
  rows.forEach((r, k) => {
    parts.push(
      svg("circle", {
        class: "gptlib-samp-cum-dot",
        cx: x0 + W * r.cum,
        cy: top + h * k + h / 2,
        r: 2,
      }),
    );
  });
  if (topP < 1) {
    parts.push(
      svg("line", {
        class: "gptlib-samp-pline",
        x1: x0 + W * topP,
        x2: x0 + W * topP,
        y1: top - 4,
        y2: top + h * n,
      }),
    );
  }
  chart.replaceChildren(...parts);
}

// The legend under the chart.
export function chartKey() {
  const key = make("div", "gptlib-samp-key");
  const item = (cls, text) => {
    const s = make("span", "gptlib-samp-key-item");
    s.append(make("span", `gptlib-samp-sw ${cls}`), text);
    return s;
  };
  key.append(
    item("now", "probability now"),
    item("ghost", "at temperature 1, no cut"),
    item("cum", "cumulative mass (what top-p cuts)"),
    item("pline", "top-p"),
  );
  return key;
}

// The three sampling controls as rows of labelled sliders: temperature (0 to 3), top-k (0 = off,
// up to kMax) and top-p (1 = off). show(T, k, tp) puts settings on them; onInput(set) calls
// set(trait, value) when the reader moves one ("temperature", "top_k" or "top_p").
export function samplingControls(kMax) {
  const specs = [
    ["temperature", "gptlib-samp-temperature", "0", "3", "0.05"],
    ["top-k", "gptlib-samp-topk", "0", String(kMax), "1"],
    ["top-p", "gptlib-samp-topp", "0.05", "1", "0.05"],
  ];
  const sliders = [],
    labels = [];
  const rows = specs.map(([name, cls, min, max, step]) => {
    const s = make("input", cls),
      l = make("span"),
      row = make("label", "gptlib-controls");
    s.type = "range";
    s.min = min;
    s.max = max;
    s.step = step;
    row.append(`${name} `, s, l);
    sliders.push(s);
    labels.push(l);
    return row;
  });
  function show(T, k, tp) {
    [T, k, tp].forEach((v, i) => {
      sliders[i].value = String(v);
    });
    labels[0].textContent = ` ${T.toFixed(2)}`;
    labels[1].textContent = k > 0 ? ` ${k}` : " off";
    labels[2].textContent = tp < 1 ? ` ${tp.toFixed(2)}` : " off";
  }
  function onInput(set) {
    ["temperature", "top_k", "top_p"].forEach((trait, i) => {
      sliders[i].addEventListener("input", () => set(trait, Number(sliders[i].value)));
    });
  }
  return { rows, show, onInput };
}

// The chart's rows (drawChart): the n most probable tokens of the distribution `d`, named by
// label(i), each over its probability in `g` (temperature 1, no cut), and, when the vocabulary's
// V tokens are more than those, one row for all the others.
export function chartRows(d, g, n, label, V) {
  const rows = d.order
    .slice(0, n)
    .map((i, r) => ({ label: label(i), p: d.p[i], ghost: g.p[i], cum: d.cum[r] }));
  const shown = rows.reduce((s, r) => s + r.p, 0),
    shownGhost = rows.reduce((s, r) => s + r.ghost, 0);
  const hidden = V - rows.length;
  const other =
    hidden > 0
      ? { label: `${hidden} others`, p: Math.max(0, 1 - shown), ghost: Math.max(0, 1 - shownGhost) }
      : null;
  return { rows, other };
}
