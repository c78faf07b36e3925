// Attention view: every head as a thumbnail (layers down, heads across) with its scores; the
// selected head enlarged as a heatmap (query tokens down, key tokens across) on a fixed colour
// scale from 0 to 1; the text, coloured by where a hovered token attends.

// The colour scale: attention weight 0 (near white) to 1 (dark blue), linear between the stops.
const STOPS = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];

export function colour(a) {
  const x = Math.min(Math.max(a, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
  return STOPS[i].map((c, k) => Math.round(c + f * (STOPS[i + 1][k] - c)));
}
const css = (a) => `rgb(${colour(a).join(", ")})`;
const ink = (a) => (a > 0.55 ? "#fff" : "#000");  // readable text on a cell of weight a
const MASKED = [238, 238, 238];
const SHORT = { "previous token": "prev", "first token": "first", induction: "induct" };
const MEANING = {
  "previous token": "mean weight on key i\u22121",
  "first token": "mean weight on key 0",
  induction: "mean weight on the token that followed the last occurrence of the query's token",
};

function render({ model, el }) {
  const tokens = model.get("tokens"), patterns = model.get("patterns");
  const layerLabels = model.get("layer_labels"), headLabels = model.get("head_labels");
  const scores = model.get("scores");
  const T = tokens.length;
  const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");
  const div = (cls, text) => {
    const d = document.createElement("div");
    if (cls) d.className = cls;
    if (text !== undefined) d.textContent = text;
    return d;
  };

  const root = div("gptlib-widget gptlib-attn");
  const title = div("gptlib-title", model.get("title"));

  // 1. The thumbnails, one per head, with their scores; a click enlarges one.
  const thumbs = div("gptlib-attn-thumbs");
  thumbs.style.gridTemplateColumns = `max-content repeat(${headLabels.length}, max-content)`;
  thumbs.append(div(""), ...headLabels.map((h) => div("gptlib-attn-thumb-head", h)));
  const best = scores.map((s) => Math.max(...s.values.flat()));
  const buttons = [];
  patterns.forEach((layerPatterns, l) => {
    thumbs.append(div("gptlib-attn-thumb-layer", layerLabels[l]));
    layerPatterns.forEach((A, h) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "gptlib-attn-thumb";
      b.dataset.layer = String(l);
      b.dataset.head = String(h);
      b.title = `${layerLabels[l]}, ${headLabels[h]}: click to enlarge`;
      const canvas = document.createElement("canvas");
      canvas.width = T; canvas.height = T;
      const ctx = canvas.getContext("2d");
      const img = ctx.createImageData(T, T);
      for (let i = 0; i < T; i++) {
        for (let j = 0; j < T; j++) {
          const [r, g, bl] = j <= i ? colour(A[i][j]) : MASKED;
          img.data.set([r, g, bl, 255], 4 * (i * T + j));
        }
      }
      ctx.putImageData(img, 0, 0);
      b.append(canvas);
      scores.forEach((s, n) => {
        const v = s.values[l][h];
        const line = div("gptlib-attn-score" + (v === best[n] ? " best" : ""), `${SHORT[s.name] || s.name} ${v.toFixed(2)}`);
        line.dataset.name = s.name;
        line.dataset.value = String(v);
        b.append(line);
      });
      b.addEventListener("click", () => select(l, h));
      buttons.push(b);
      thumbs.append(b);
    });
  });
  const key = div("gptlib-attn-score-key");
  key.textContent = scores.length
    ? "Scores on this text: " + scores.map((s) => `${SHORT[s.name] || s.name} = ${s.name} (${MEANING[s.name] || ""}; ` +
        `${s.uniform.toFixed(2)} for a uniform head)`).join(", ") + ". Bold: the highest head of each score."
    : "";

  // 2. The selected head, enlarged: selectors, the colour scale's legend, the heatmap.
  const controls = div("gptlib-controls");
  const layerSel = document.createElement("select");
  layerSel.className = "gptlib-attn-layer";
  const headSel = document.createElement("select");
  headSel.className = "gptlib-attn-head";
  const options = (sel, labels) => sel.replaceChildren(...labels.map((lab, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = lab;
    return o;
  }));
  options(layerSel, layerLabels);
  options(headSel, headLabels);
  const legend = div("gptlib-attn-legend");
  const bar = div("gptlib-attn-legend-bar");
  bar.style.background = `linear-gradient(to right, ${[0, 0.25, 0.5, 0.75, 1].map(css).join(", ")})`;
  const ticks = div("gptlib-attn-legend-ticks");
  ticks.append(...["0", "0.25", "0.5", "0.75", "1"].map((t) => div("", t)));
  legend.append(div("", "attention weight"), div("gptlib-attn-legend-scale"));
  legend.lastChild.append(bar, ticks);
  controls.append("layer ", layerSel, " head ", headSel, legend);
  const current = div("gptlib-attn-current");
  const grid = div("gptlib-attn-grid");
  grid.style.gridTemplateColumns = `max-content repeat(${T}, 22px)`;

  // 3. The text: hover a token to colour every token by the weight it gets from that one.
  const text = div("gptlib-attn-text");
  const words = tokens.map((t, i) => {
    const s = document.createElement("span");
    s.className = "gptlib-attn-tok";
    s.textContent = t.replace(/\n/g, "\u21b5\n");
    s.addEventListener("mouseenter", () => focusQuery(i));
    s.addEventListener("mouseleave", unfocus);
    return s;
  });
  // Sub-word tokens carry their own spaces (" cat"); whole words get one between them.
  const spaced = !tokens.some((t) => /^\s|\s$/.test(t));
  words.forEach((w, i) => text.append(...(spaced && i > 0 ? [" ", w] : [w])));
  const focus = div("gptlib-attn-focus", "hover a token of the text, or a query row, to see where it looks");
  root.append(title, thumbs, key, controls, current, grid, div("gptlib-attn-text-label", "text (hover a token):"), text, focus);
  el.appendChild(root);

  let A = null, keys = [], rows = [];

  function focusQuery(i) {
    unfocus();
    rows[i].forEach((c) => { c.style.outline = "1px solid #c00"; });
    rows[i][0].style.fontWeight = "bold";
    keys.forEach((k, j) => { k.style.background = j <= i ? css(A[i][j]) : ""; k.style.color = j <= i ? ink(A[i][j]) : ""; });
    words.forEach((w, j) => {
      w.style.background = j <= i ? css(A[i][j]) : "";
      w.style.color = j <= i ? ink(A[i][j]) : "#aaa";  // later tokens are out of its sight
    });
    words[i].classList.add("gptlib-attn-hot");
    const top = A[i].map((a, j) => [a, j]).filter(([, j]) => j <= i).sort((x, y) => y[0] - x[0]).slice(0, 3);
    focus.textContent = `query "${show(tokens[i])}" attends to ` +
      top.map(([a, j]) => `"${show(tokens[j])}" (${a.toFixed(2)})`).join(", ");
    root.dataset.focus = String(i);
  }

  function unfocus() {
    rows.forEach((r) => r.forEach((c) => { c.style.outline = ""; }));
    rows.forEach((r) => { r[0].style.fontWeight = ""; });
    keys.forEach((k) => { k.style.background = ""; k.style.color = ""; });
    words.forEach((w) => { w.style.background = ""; w.style.color = ""; w.classList.remove("gptlib-attn-hot"); });
  }

  function draw() {
    const layer = model.get("layer"), head = model.get("head");
    A = patterns[layer][head];
    layerSel.value = String(layer);
    headSel.value = String(head);
    buttons.forEach((b) => b.classList.toggle("selected", b.dataset.layer === String(layer) && b.dataset.head === String(head)));
    current.textContent = `${layerLabels[layer]}, ${headLabels[head]}` +
      (scores.length ? ": " + scores.map((s) => `${s.name} score ${s.values[layer][head].toFixed(3)}`).join(", ") : "");
    const cells = [div("")];
    keys = tokens.map((t) => div("gptlib-attn-key", show(t)));
    cells.push(...keys);
    rows = [];
    for (let i = 0; i < T; i++) {
      const row = [div("gptlib-attn-query", show(tokens[i]))];
      for (let j = 0; j < T; j++) {
        const c = div("gptlib-attn-cell" + (j > i ? " masked" : ""));
        if (j <= i) c.style.background = css(A[i][j]);
        c.title = `${show(tokens[i])} -> ${show(tokens[j])}: ${A[i][j].toFixed(3)}`;
        row.push(c);
      }
      row.forEach((c) => { c.addEventListener("mouseenter", () => focusQuery(i)); c.addEventListener("mouseleave", unfocus); });
      rows.push(row);
      cells.push(...row);
    }
    grid.replaceChildren(...cells);
    // What is drawn, for tests: the diagonal as a fingerprint, and the whole enlarged pattern.
    root.dataset.view = `${layer}/${head}:` + A.map((r, i) => r[i].toFixed(3)).join(",");
    root.dataset.pattern = JSON.stringify(A);
  }

  function select(layer, head) {
    model.set("layer", layer);
    model.set("head", head);
    model.save_changes();
    draw();
  }

  layerSel.addEventListener("change", () => select(Number(layerSel.value), model.get("head")));
  headSel.addEventListener("change", () => select(model.get("layer"), Number(headSel.value)));
  model.on("change:layer", draw);
  model.on("change:head", draw);
  draw();
}
export default { render };
