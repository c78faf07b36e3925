// One head, step by step: the arithmetic of one attention head at one query, and a compact panel
// that shows every stage beside its equation (Chapter 4; RoPE and GQA from Chapter 12). The
// Python twin is gptlib.head_trace.head_trace; tests/test_head_js.py runs traceHead with node on
// a tiny model's inputs and compares every stage with it.
//
// The inputs are what a step hands over for the chosen layer, head h, query position t and token
// v (rows are arrays or typed arrays):
//   q (d_head): the query at t, after RoPE for a rotary model (as the model computes it);
//   k, v (T rows of d_head): the keys and values of the key-value head g = floor(h / G), as the
//     KV cache holds them (keys rotated at their positions for a rotary model);
//   W_O (d_head rows of d_model): head h's slice W_O^h;
//   ln: { w (d_model), scale, centred }: ln_f's gain, its normaliser 1/rms(X_L[t]) or
//     1/sigma(X_L[t]) (frozen), and whether it centres (LayerNorm) or not (RMSNorm);
//   unembed (d_model): W_U[:, v];
//   rope: null, or { base, pair }: RoPE's base and the coordinate pair i whose angles are shown;
//   layer, head, kvHead, group, position, target: the indices (layer and heads from 0);
//   bias: whether q, k and v hold biases (GPT-2's b_Q, b_K, b_V; for the labels only).
import { make, show } from "./dom.js";

// The book's equation numbers of the stages, by label (tests/test_head_js.py counts the labels
// of the chapters and checks these).
export const EQUATIONS = {
  "ch04-softmax": "4.1",
  "ch04-mask": "4.2",
  "ch04-scale": "4.3",
  "ch04-attention": "4.6",
  "ch04-head": "4.7",
  "ch04-bias-scores": "4.9",
  "ch05-layernorm": "5.1",
  "ch06-read-out": "6.3",
  "ch12-rope": "12.2",
  "ch12-rope-relative": "12.3",
  "ch12-rmsnorm": "12.4",
  "ch12-gqa": "12.6",
};

const dot = (a, b) => {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
};

// Row x rotated pair by pair: pair i by the angle sign * n theta_i (row convention, eq. 12.2):
// (x_2i cos a - x_2i+1 sin a, x_2i sin a + x_2i+1 cos a).
function rotate(x, n, freqs, sign) {
  const out = new Float64Array(x.length);
  for (let i = 0; i < freqs.length; i++) {
    const a = sign * n * freqs[i],
      c = Math.cos(a),
      s = Math.sin(a);
    out[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
    out[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c;
  }
  return out;
}

// The rows of a flat array: n rows of `width` numbers.
const rowsOf = (flat, width) =>
  Array.from({ length: flat.length / width }, (_, n) => flat.subarray(n * width, (n + 1) * width));

// The inputs above from what the page's step hands over (page.js's cacheStepper with a `head`
// request): `req` {layer, head, position, target, pair}; `got` {q (d_head), W_O (d_head *
// d_model), lnScale, lnW (d_model), unembed (d_model): gptlib.step's head_* outputs; k, v
// (T * d_head): the cache's rows of key-value head g at that layer}; `config` the manifest's
// (d_head, n_heads, n_kv_heads, rope_base, ln_f_centred, attn_bias). The same object as the
// kernel's answer (gptlib.widgets.head.view_inputs), so one traceHead serves both.
export function pageInputs(req, got, config) {
  const D = config.d_head,
    group = config.n_heads / config.n_kv_heads;
  const rope = config.rope_base === null || config.rope_base === undefined;
  return {
    layer: req.layer,
    head: req.head,
    kvHead: Math.floor(req.head / group),
    group,
    position: req.position,
    target: req.target,
    bias: !!config.attn_bias,
    q: got.q,
    k: rowsOf(got.k, D),
    v: rowsOf(got.v, D),
    W_O: rowsOf(got.W_O, got.W_O.length / D),
    ln: { w: got.lnW, scale: got.lnScale, centred: !!config.ln_f_centred },
    unembed: got.unembed,
    rope: rope ? null : { base: config.rope_base, pair: req.pair ?? 0 },
  };
}

// theta_i = base^(-2i / d_head), i = 0 .. d_head/2 - 1: radians per position.
export function ropeFrequencies(dHead, base) {
  return Float64Array.from({ length: dHead / 2 }, (_, i) =>
    Math.exp((-2 * i * Math.log(base)) / dHead),
  );
}

// The RoPE stages: the rows before rotation, the chosen pair's angles and its part of each score.
function ropeStages(inp, T) {
  const { q, k, position: t } = inp;
  if (!inp.rope) {
    return { qRaw: Array.from(q), kRaw: Array.from(k, (r) => Array.from(r)), theta: null };
  }
  const freqs = ropeFrequencies(q.length, inp.rope.base);
  const i = inp.rope.pair,
    theta = freqs[i];
  const kRaw = Array.from(k, (r, n) => Array.from(rotate(r, n, freqs, -1))); // K[n] rho_n^T
  const n = Array.from({ length: T }, (_, j) => j);
  return {
    qRaw: Array.from(rotate(q, t, freqs, -1)), // q rho_t^T: the query before RoPE
    kRaw,
    theta,
    angleQ: t * theta,
    angleK: n.map((j) => j * theta),
    angleRel: n.map((j) => (t - j) * theta),
    pairScores: n.map((j) => q[2 * i] * k[j][2 * i] + q[2 * i + 1] * k[j][2 * i + 1]),
  };
}

// Every stage of the head at the query, in double precision (see the inputs above).
export function traceHead(inp) {
  const { q, k, v, W_O, ln, unembed, position: t } = inp;
  const T = k.length,
    dHead = q.length,
    dModel = unembed.length;
  const scores = Array.from(k, (row) => dot(q, row)); // q K[n]^T
  const scaled = scores.map((s) => s / Math.sqrt(dHead));
  const mask = scores.map((_, n) => (n <= t ? 0 : -Infinity)); // M[t]
  const shifted = scaled.map((s, n) => s + mask[n]);
  const top = Math.max(...shifted);
  const e = shifted.map((s) => Math.exp(s - top));
  const total = e.reduce((a, b) => a + b, 0);
  const pattern = e.map((x) => x / total); // softmax*: row t of A^h
  const z = new Float64Array(dHead);
  for (let n = 0; n < T; n++) for (let d = 0; d < dHead; d++) z[d] += pattern[n] * v[n][d];
  const out = new Float64Array(dModel);
  for (let d = 0; d < dHead; d++) for (let j = 0; j < dModel; j++) out[j] += z[d] * W_O[d][j];
  const mean = ln.centred ? out.reduce((a, b) => a + b, 0) / dModel : 0;
  const lnOut = Array.from(out, (o, j) => (o - mean) * ln.w[j] * ln.scale);
  return {
    ...ropeStages(inp, T),
    q: Array.from(q),
    k: Array.from(k, (r) => Array.from(r)),
    v: Array.from(v, (r) => Array.from(r)),
    scores,
    scaled,
    mask,
    pattern,
    sum: pattern.reduce((a, b) => a + b, 0),
    z: Array.from(z),
    out: Array.from(out),
    lnOut,
    contribution: dot(lnOut, unembed),
  };
}

// A number to 4 significant figures ("-inf" for the mask's minus infinity).
export function fmt(x) {
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x < 0 ? "\u2212\u221e" : "\u221e";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-3 && a < 1e5) return String(Number(x.toPrecision(4)));
  return x.toExponential(3);
}

// Which entries of a wide vector to show: the first `first`, and the `largest` others of the
// largest `weight` (|value| by default); the rest go behind a <details>. Short vectors are shown
// whole. Indices in increasing order.
export function fold(values, { first = 4, largest = 4, weight } = {}) {
  const n = values.length;
  const all = Array.from({ length: n }, (_, i) => i);
  if (n <= first + largest + 2) return { shown: all, rest: [] };
  const w = weight || Array.from(values, Math.abs);
  const big = all
    .slice(first)
    .sort((a, b) => w[b] - w[a] || a - b)
    .slice(0, largest);
  const keep = new Set([...all.slice(0, first), ...big]);
  return { shown: all.filter((i) => keep.has(i)), rest: all.filter((i) => !keep.has(i)) };
}

const eqs = (...labels) => labels.map((l) => `(${EQUATIONS[l]})`).join(" ");

// The panel's rows, as data: each stage's equation numbers, what it computes, its values (a
// vector, the per-key table, or a number). `names` are the context's tokens as shown.
export function stages(tr, inp) {
  const rope = inp.rope !== null && inp.rope !== undefined;
  const bias = inp.bias ? " + b_Q\u02b0" : "";
  const rows = [
    {
      id: "gqa",
      eq: eqs("ch12-gqa"),
      text:
        inp.group > 1
          ? `query head ${inp.head} reads key-value head g = \u230a${inp.head}/${inp.group}\u230b = ${inp.kvHead}, shared by heads ${inp.kvHead * inp.group}\u2013${inp.kvHead * inp.group + inp.group - 1}`
          : `head ${inp.head} has its own keys and values (G = 1)`,
    },
    {
      id: "q_raw",
      eq: eqs("ch04-head", ...(inp.bias ? ["ch04-bias-scores"] : [])),
      text: `q = X[${inp.position}] W_Q\u02b0${bias}`,
      vector: tr.qRaw,
    },
  ];
  if (rope) {
    rows.push({
      id: "q",
      eq: eqs("ch12-rope"),
      text: `rope(q, ${inp.position}) = q \u03c1_${inp.position}`,
      vector: tr.q,
    });
    rows.push({
      id: "pair",
      eq: eqs("ch12-rope", "ch12-rope-relative"),
      text: `pair i = ${inp.rope.pair}: \u03b8_i = ${fmt(tr.theta)} rad per position; q turns by t\u03b8_i = ${fmt(tr.angleQ)}, key n by n\u03b8_i; the pair's score q_i \u03c1_(t\u2212n) k_i\u1d40 turns by (t\u2212n)\u03b8_i`,
    });
  }
  const g = inp.group > 1 ? "\u1d4d" : "\u02b0"; // W_K^g, shared; W_K^h, its own
  const kb = inp.bias ? " + b_K" : "";
  rows.push(
    {
      id: "k",
      eq: eqs("ch04-head", ...(rope ? ["ch12-rope"] : [])),
      text: rope
        ? `K[n] = X[n] W_K${g}, then rope(K[n], n) = K[n] \u03c1_n (the rows the cache holds)`
        : `K[n] = X[n] W_K${g}${kb}`,
      rows: rope
        ? [
            ["before RoPE", tr.kRaw],
            ["rotated", tr.k],
          ]
        : [["", tr.k]],
    },
    {
      id: "keys",
      eq: eqs("ch04-attention", "ch04-scale", "ch04-mask", "ch04-softmax"),
      text: "per key n",
      table: true,
    },
    { id: "sum", eq: eqs("ch04-softmax"), text: "\u03a3_n A[t, n]", number: tr.sum },
    {
      id: "v",
      eq: eqs("ch04-head"),
      text: `V[n] = X[n] W_V${g}${inp.bias ? " + b_V" : ""}`,
      rows: [["", tr.v]],
    },
    { id: "z", eq: eqs("ch04-attention"), text: "z = \u03a3_n A[t, n] v_n", vector: tr.z },
    { id: "out", eq: eqs("ch04-head"), text: "o = z W_O\u02b0", vector: tr.out },
    {
      id: "ln_out",
      eq: eqs(inp.ln.centred ? "ch05-layernorm" : "ch12-rmsnorm"),
      text: inp.ln.centred
        ? `N(o) = (o \u2212 mean o) \u2299 w \u00b7 ${fmt(inp.ln.scale)}  (1/\u03c3(X_L[t]), frozen)`
        : `N(o) = o \u2299 w \u00b7 ${fmt(inp.ln.scale)}  (1/rms(X_L[t]), frozen)`,
      vector: tr.lnOut,
    },
    {
      id: "contribution",
      eq: eqs("ch06-read-out"),
      text: `N(o) \u00b7 W_U[:, ${inp.target}]: head ${inp.head}'s direct part of the logit`,
      number: tr.contribution,
    },
  );
  return rows;
}

// One folded vector: "[i] value" for the shown entries, the rest in a <details>.
function vectorCell(values) {
  const cell = make("span", "gptlib-head-vector");
  const { shown, rest } = fold(values);
  const entry = (i) => make("span", "gptlib-head-entry", `[${i}] ${fmt(values[i])}`);
  cell.append(...shown.map(entry));
  if (rest.length) {
    const more = make("details", "gptlib-head-more");
    more.append(
      make("summary", null, `${rest.length} more of ${values.length}`),
      ...rest.map(entry),
    );
    cell.append(more);
  }
  return cell;
}

// The keys the panel shows first: the first two and the six of the largest weights.
const keysShown = (tr) => fold(tr.pattern, { first: 2, largest: 6, weight: tr.pattern });

// Rows of matrices, each [label, rows] (one row per key; a rotary model's keys before and after
// RoPE side by side), behind a <details>: the shown keys' rows, folded like any wide vector.
function rowsCell(matrices, { shown }) {
  const more = make("details", "gptlib-head-more");
  more.append(make("summary", null, `rows n = ${shown.join(", ")}`));
  for (const n of shown) {
    const line = make("div", "gptlib-head-row", `n = ${n}: `);
    for (const [label, m] of matrices) {
      if (label) line.append(make("span", "gptlib-head-label", label));
      line.append(vectorCell(m[n]));
    }
    more.append(line);
  }
  return more;
}

// The per-key table: one column per key shown (the first keys and those of the largest weights),
// the others in a second table behind a <details>.
function keyTable(tr, inp, names, columns) {
  const table = make("table", "gptlib-head-keys");
  const line = (label, f) => {
    const tr_ = make("tr");
    tr_.append(make("th", null, label), ...columns.map((n) => make("td", null, f(n))));
    return tr_;
  };
  const rows = [line("n", (n) => String(n)), line("token", (n) => (names ? show(names[n]) : ""))];
  if (tr.theta !== null)
    rows.push(
      line("(t\u2212n)\u03b8_i", (n) => fmt(tr.angleRel[n])),
      line("pair i of q\u00b7k_n", (n) => fmt(tr.pairScores[n])),
    );
  rows.push(
    line("q\u00b7k_n", (n) => fmt(tr.scores[n])),
    line(`/\u221a${inp.q.length}`, (n) => fmt(tr.scaled[n])),
    line("M[t, n]", (n) => fmt(tr.mask[n])),
    line("A[t, n]", (n) => fmt(tr.pattern[n])),
  );
  table.append(...rows);
  return table;
}

// The panel: a title, then one row per stage with its equation numbers.
export function headPanel(inp, { names } = {}) {
  const tr = traceHead(inp);
  const root = make("div", "gptlib-head");
  const who = names ? ` "${show(names[inp.position])}"` : "";
  root.append(
    make(
      "div",
      "gptlib-head-title",
      `layer ${inp.layer}, head ${inp.head}, query t = ${inp.position}${who}, token v = ${inp.target}`,
    ),
  );
  const list = make("ol", "gptlib-head-stages");
  for (const s of stages(tr, inp)) {
    const li = make("li", `gptlib-head-stage gptlib-head-${s.id}`);
    li.append(make("span", "gptlib-head-eq", s.eq), make("span", "gptlib-head-what", s.text));
    if (s.vector) li.append(vectorCell(s.vector));
    if (s.rows) li.append(rowsCell(s.rows, keysShown(tr)));
    if (s.number !== undefined) li.append(make("span", "gptlib-head-number", fmt(s.number)));
    if (s.table) {
      const { shown, rest } = keysShown(tr);
      li.append(keyTable(tr, inp, names, shown));
      if (rest.length) {
        const more = make("details", "gptlib-head-more");
        more.append(
          make("summary", null, `${rest.length} more keys`),
          keyTable(tr, inp, names, rest),
        );
        li.append(more);
      }
    }
    list.append(li);
  }
  root.append(list);
  return root;
}

// One head's share of a step's outputs (gptlib.step's head_* for the one head asked) and the
// keys and values of its key-value head g = floor(h / (n_heads / n_kv_heads)) at its layer, read
// off the cache `kv` (positions, n_layers, 2, n_kv, d_head): what pageInputs takes (page.js's
// cacheStepper makes it in the worker).
export function headOutputs(out, kv, head, c) {
  const D = c.d_head,
    G = c.n_kv_heads,
    per = c.n_layers * 2 * G * D,
    N = kv.length / per;
  const g = Math.floor(head.head / (c.n_heads / G));
  const rows = (which) => {
    const r = new Float32Array(N * D);
    const at = ((head.layer * 2 + which) * G + g) * D;
    for (let n = 0; n < N; n++) r.set(kv.subarray(n * per + at, n * per + at + D), n * D);
    return r;
  };
  return {
    q: out.head_q.data.slice(),
    W_O: out.head_W_O.data.slice(),
    lnScale: out.head_ln_scale.data[0],
    lnW: out.head_ln_w.data.slice(),
    unembed: out.head_W_U.data.slice(),
    k: rows(0),
    v: rows(1),
  };
}
