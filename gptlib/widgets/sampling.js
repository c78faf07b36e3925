// Sampling view. nextTokenProbs mirrors gptlib.sampling.next_token_probs:
// temperature, then top-k, then top-p (smallest most-probable set reaching p), then renormalise.

// Token indices by decreasing logit, ties by the lower index (torch.sort(stable=True) order).
export function byLogit(logits) {
  return [...Array(logits.length).keys()].sort((a, b) => (logits[b] - logits[a]) || (a - b));
}

// The distribution after temperature and top-k, renormalised over what top-k keeps, in the
// order of byLogit: the distribution whose cumulative mass top-p thresholds.
function beforeTopP(logits, temperature, topK, order) {
  const n = logits.length;
  const p = new Array(n).fill(0);
  if (temperature === 0) {
    p[order[0]] = 1;
    return p;
  }
  const m = logits[order[0]];
  let z = 0;
  for (let i = 0; i < n; i++) { p[i] = Math.exp((logits[i] - m) / temperature); z += p[i]; }
  for (let i = 0; i < n; i++) p[i] /= z;
  if (topK > 0 && topK < n) order.slice(topK).forEach((i) => { p[i] = 0; });
  const zk = p.reduce((s, v) => s + v, 0);
  return p.map((v) => v / zk);
}

export function nextTokenProbs(logits, temperature, topK, topP) {
  const order = byLogit(logits);
  const q = beforeTopP(logits, temperature, topK, order);
  if (temperature === 0 || topP >= 1) return q;
  // top-p: keep tokens, most probable first, while the mass before them is below topP.
  const n = logits.length;
  const keep = [];
  let before = 0;
  for (const i of topK > 0 && topK < n ? order.slice(0, topK) : order) {
    if (before >= topP) break;
    keep.push(i);
    before += q[i];
  }
  const z = keep.reduce((s, i) => s + q[i], 0);
  const p = new Array(n).fill(0);
  keep.forEach((i) => { p[i] = q[i] / z; });
  return p;
}

// The cumulative mass top-p compares with, token by token in the order of byLogit.
export function cumulativeMass(logits, temperature, topK) {
  const order = byLogit(logits);
  const q = beforeTopP(logits, temperature, topK, order);
  let c = 0;
  return order.map((i) => (c += q[i]));
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

// Inverse-CDF draw: the first token, in the order given, whose cumulative probability exceeds u.
export function drawIndex(p, order, u) {
  let c = 0, last = -1;
  for (const i of order) {
    if (p[i] <= 0) continue;
    c += p[i];
    last = i;
    if (u < c) return i;
  }
  return last;  // u within rounding of 1
}

const NS = "http://www.w3.org/2000/svg";
const svg = (tag, attrs, text) => {
  const e = document.createElementNS(NS, tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, String(v)));
  if (text !== undefined) e.textContent = text;
  return e;
};

function render({ model, el }) {
  const prompts = model.get("prompts"), vocab = model.get("tokens");
  const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");
  const clip = (t) => (t.length > 14 ? t.slice(0, 13) + "\u2026" : t);  // a label that fits its column
  const tok = (id) => vocab[String(id)];
  const make = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const root = make("div", "gptlib-widget gptlib-samp");
  const title = make("div", "gptlib-title");

  // Controls: the prompt, then temperature, top-k and top-p.
  const promptSel = make("select", "gptlib-samp-prompt");
  promptSel.replaceChildren(...prompts.map((p, i) => {
    const o = make("option", "", p.text || "(the given distribution)");
    o.value = String(i);
    return o;
  }));
  const promptRow = make("label", "gptlib-controls");
  promptRow.append("prompt ", promptSel);
  if (prompts.length < 2) promptRow.style.display = "none";
  const slider = (cls, min, max, step) => {
    const s = make("input", cls);
    s.type = "range"; s.min = min; s.max = max; s.step = step;
    return s;
  };
  const tSlider = slider("gptlib-samp-temperature", "0", "3", "0.05");
  // top-k: 0 (off) to a range where the bars still show a difference, or the initial k if larger.
  const longest = Math.max(...prompts.map((p) => p.root.ids.length));
  const kSlider = slider("gptlib-samp-topk", "0", String(Math.max(Math.min(longest, 100), model.get("top_k"))), "1");
  const pSlider = slider("gptlib-samp-topp", "0.05", "1", "0.05");
  const labels = [make("span"), make("span"), make("span")];
  const row = (name, s, l) => {
    const d = make("label", "gptlib-controls");
    d.append(name, s, l);
    return d;
  };
  const stats = make("div", "gptlib-samp-stats");
  const chart = svg("svg", { class: "gptlib-samp-chart" });
  const key = make("div", "gptlib-samp-key");
  key.innerHTML = '<span class="gptlib-samp-sw now"></span> probability now ' +
    '<span class="gptlib-samp-sw ghost"></span> at temperature 1, no cut ' +
    '<span class="gptlib-samp-sw cum"></span> cumulative mass (what top-p cuts) ' +
    '<span class="gptlib-samp-sw pline"></span> top-p';

  // The text so far, and the buttons that extend it from the stored distributions.
  const text = make("div", "gptlib-samp-text");
  const stepBtn = make("button", "gptlib-samp-step", "sample next token");
  const undoBtn = make("button", "gptlib-samp-undo", "undo");
  const resetBtn = make("button", "gptlib-samp-reset", "reset");
  [stepBtn, undoBtn, resetBtn].forEach((b) => { b.type = "button"; });
  const buttons = make("div", "gptlib-controls");
  buttons.append(stepBtn, undoBtn, resetBtn);
  const msg = make("div", "gptlib-samp-msg");
  root.append(title, promptRow, row("temperature ", tSlider, labels[0]), row("top-k ", kSlider, labels[1]),
              row("top-p ", pSlider, labels[2]), stats, chart, key, text, buttons, msg);
  el.appendChild(root);

  const rng = xorshift32(model.get("seed"));
  let path = [];  // the ids drawn after the prompt

  // The deepest stored node along the path, and whether the path left the stored tree.
  function where() {
    let node = prompts[model.get("prompt")].root, stuck = false;
    for (const id of path) {
      const next = node.next[String(id)];
      if (!next) { stuck = true; break; }
      node = next;
    }
    return { node, stuck };
  }

  function draw() {
    const { node, stuck } = where();
    const logits = node.logits, ids = node.ids;
    const T = model.get("temperature"), k = model.get("top_k"), tp = model.get("top_p");
    title.textContent = model.get("title");
    promptSel.value = String(model.get("prompt"));
    tSlider.value = String(T); kSlider.value = String(k); pSlider.value = String(tp);
    labels[0].textContent = ` ${T.toFixed(2)}`;
    labels[1].textContent = k > 0 ? ` ${k}` : " off";
    labels[2].textContent = tp < 1 ? ` ${tp.toFixed(2)}` : " off";
    const p = nextTokenProbs(logits, T, k, tp);
    const ghost = nextTokenProbs(logits, 1, 0, 1);
    const cum = cumulativeMass(logits, T, k);
    const H = -p.reduce((s, v) => s + (v > 0 ? v * Math.log(v) : 0), 0);
    const kept = p.filter((v) => v > 0).length;
    stats.textContent = `entropy ${H.toFixed(3)} nats, ${kept} of ${p.length} stored tokens can be sampled` +
      (node.mass < 1 ? ` (the ${p.length} stored tokens hold ${(100 * node.mass).toFixed(1)}% of the model's probability at temperature 1)` : "");

    // The chart: fixed axis from 0 to 1; ghost (temperature 1) behind each bar; cumulative mass.
    const order = byLogit(logits).slice(0, model.get("n_show"));
    const x0 = 120, W = 320, top = 20, h = 18;
    chart.setAttribute("width", String(x0 + W + 70));
    chart.setAttribute("height", String(top + h * order.length + 4));
    const parts = [];
    [0, 0.25, 0.5, 0.75, 1].forEach((t) => {
      parts.push(svg("line", { class: "gptlib-samp-grid", x1: x0 + W * t, x2: x0 + W * t, y1: top - 4, y2: top + h * order.length }));
      parts.push(svg("text", { class: "gptlib-samp-tick", x: x0 + W * t, y: top - 7, "text-anchor": "middle" }, String(t)));
    });
    order.forEach((i, r) => {
      const y = top + h * r;
      const g = svg("g", { class: "gptlib-samp-row" + (p[i] > 0 ? "" : " removed") });
      g.append(
        svg("text", { class: "gptlib-samp-tok", x: x0 - 6, y: y + 13, "text-anchor": "end" }, clip(show(tok(ids[i])))),
        svg("rect", { class: "gptlib-samp-ghost", x: x0, y: y + 2, width: (W * ghost[i]).toFixed(2), height: h - 4 }),
        svg("rect", { class: "gptlib-samp-bar", x: x0, y: y + 4, width: (W * p[i]).toFixed(2), height: h - 8 }),
        svg("text", { class: "gptlib-samp-p", x: x0 + W + 6, y: y + 13 }, p[i].toFixed(4)),
      );
      parts.push(g);
    });
    const pts = order.map((i, r) => `${(x0 + W * cum[r]).toFixed(2)},${top + h * r + h / 2}`);
    parts.push(svg("polyline", { class: "gptlib-samp-cum", points: pts.join(" ") }));
    order.forEach((i, r) => parts.push(svg("circle", { class: "gptlib-samp-cum-dot", cx: x0 + W * cum[r], cy: top + h * r + h / 2, r: 2 })));
    if (tp < 1) {
      parts.push(svg("line", { class: "gptlib-samp-pline", x1: x0 + W * tp, x2: x0 + W * tp, y1: top - 4, y2: top + h * order.length }));
    }
    chart.replaceChildren(...parts);

    // The text: the prompt, then the drawn tokens.
    const prompt = prompts[model.get("prompt")].text;
    const ctx = make("span", "gptlib-samp-ctx", prompt || "\u2026");
    text.replaceChildren(ctx, ...path.map((id) => make("span", "gptlib-samp-new", tok(id).replace(/\n/g, "\u21b5\n"))));
    stepBtn.disabled = stuck;
    undoBtn.disabled = resetBtn.disabled = path.length === 0;
    if (stuck) {
      const last = show(tok(path[path.length - 1]));
      const known = Object.keys(node.next).map((id) => `\u00ab${show(tok(id))}\u00bb`);
      msg.textContent = known.length
        ? `\u00ab${last}\u00bb was drawn, but this page stores the model's next distribution only after ${known.join(", ")} here. ` +
          "It cannot run the model, so it stops here: undo or reset to draw again."
        : `\u00ab${last}\u00bb was drawn; this page stores no distribution after it, and it cannot run the model. Undo or reset to draw again.`;
    } else {
      msg.textContent = path.length ? `${path.length} token(s) drawn from the stored distributions` : "";
    }

    // What is drawn, for the browser test to compare with Python.
    root.dataset.probs = JSON.stringify(p);
    root.dataset.ghost = JSON.stringify(ghost);
    root.dataset.cum = JSON.stringify(cum.slice(0, order.length));
    root.dataset.settings = JSON.stringify({ temperature: T, top_k: k, top_p: tp });
    root.dataset.logits = JSON.stringify(logits);
    root.dataset.ids = JSON.stringify(ids);
    root.dataset.path = JSON.stringify(path);
    root.dataset.prompt = String(model.get("prompt"));
    root.dataset.stuck = stuck ? "1" : "0";
  }

  function step() {
    const { node, stuck } = where();
    if (stuck) return;
    const p = nextTokenProbs(node.logits, model.get("temperature"), model.get("top_k"), model.get("top_p"));
    const u = rng();
    const i = drawIndex(p, byLogit(node.logits), u);
    root.dataset.u = String(u);
    path.push(node.ids[i]);
    draw();
  }

  const set = (name, v) => { model.set(name, v); model.save_changes(); draw(); };
  tSlider.addEventListener("input", () => set("temperature", Number(tSlider.value)));
  kSlider.addEventListener("input", () => set("top_k", Number(kSlider.value)));
  pSlider.addEventListener("input", () => set("top_p", Number(pSlider.value)));
  promptSel.addEventListener("change", () => { path = []; set("prompt", Number(promptSel.value)); });
  stepBtn.addEventListener("click", step);
  undoBtn.addEventListener("click", () => { path.pop(); draw(); });
  resetBtn.addEventListener("click", () => { path = []; draw(); });
  ["temperature", "top_k", "top_p", "prompt"].forEach((n) => model.on(`change:${n}`, draw));
  draw();
}
export default { render };
