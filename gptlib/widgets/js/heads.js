// Attention heads: the colour scale, the head scores of gptlib.circuits, and the panel that shows
// every head as a thumbnail (layers down, heads across) with its scores, one head enlarged as a
// heatmap (query tokens down, key tokens across) on a fixed scale from 0 to 1, and the text,
// coloured by where a hovered token attends.
import { collapse, make, report, show } from "./dom.js";

// The colour scale, the book's one for attention weights (gptlib.figures.ATTENTION_STOPS draws
// the static figures with the same stops): weight 0 is the page's background, and more weight
// moves away from it, linearly between the stops. On a light background the stops run from
// white to dark blue; on a dark one (a dark theme: the book's, JupyterLab's, Colab's) they run
// the other way, from the background through blue to white, so strong weights stand out in both.
export const STOPS = [
  [255, 255, 255],
  [198, 219, 239],
  [107, 174, 214],
  [33, 113, 181],
  [8, 48, 107],
];

// The scale on a background [r, g, b]: the background, then the stops (reversed on a dark one).
export function scaleOn(bg) {
  const dark = luminance(bg) < 0.35;
  return [bg, ...(dark ? [...STOPS].reverse() : STOPS).slice(1)];
}

// WCAG's relative luminance of an sRGB colour [r, g, b] (0 to 255).
export function luminance(rgb) {
  const lin = rgb.map((c) => {
    const v = c / 255;
    return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
}

export function colour(a, scale) {
  const stops = Array.isArray(scale) ? scale : STOPS; // (a second argument from map is an index)
  const x = Math.min(Math.max(a, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2),
    f = x - i;
  return stops[i].map((c, k) => Math.round(c + f * (stops[i + 1][k] - c)));
}

// The background an element is drawn on: the first opaque background colour from it up (white
// where there is none, as on a page not yet attached).
export function backgroundOf(el) {
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const m = getComputedStyle(e).backgroundColor.match(/[\d.]+/g);
    if (m && (m.length < 4 || Number(m[3]) > 0.5)) return m.slice(0, 3).map(Number);
  }
  return [255, 255, 255];
}

// A scale's colours: as CSS, as the pixels of 256 steps for canvases (a thumbnail of T = 128 has
// 8256 cells), and the ink that reads on each cell.
function palette(stops) {
  const lut = Uint8ClampedArray.from(
    { length: 256 * 3 },
    (_, k) => colour(Math.floor(k / 3) / 255, stops)[k % 3],
  );
  return {
    stops,
    lut,
    heat: (a) => `rgb(${colour(a, stops).join(", ")})`,
    ink: (a) => (luminance(colour(a, stops)) > 0.3 ? "#000" : "#fff"),
  };
}

// The query/key pairs of an induction head (gptlib.circuits.induction_pairs): query i whose
// token last occurred at k, key k + 1, leaving out k + 1 = i.
export function inductionPairs(keys) {
  const last = new Map(),
    pairs = [];
  keys.forEach((t, i) => {
    const k = last.get(t);
    if (k !== undefined && k + 1 < i) pairs.push([i, k + 1]);
    last.set(t, i);
  });
  return pairs;
}

// gptlib.circuits.head_scores: for patterns[l][h][i][j] on the tokens `keys`, the previous-token
// and first-token scores (mean weight on key i - 1, on key 0, over queries 1..T-1) and, when a
// token repeats, the induction score; each with a uniform causal head's score beside it.
export function headScores(patterns, keys) {
  const T = keys.length;
  if (T < 2) return [];
  const mean = (pairs, A) => pairs.reduce((s, [i, j]) => s + A(i, j), 0) / pairs.length;
  const uniform = (i) => 1 / (i + 1);
  const rows = [...Array(T - 1).keys()].map((i) => i + 1);
  const found = [
    ["previous token", rows.map((i) => [i, i - 1])],
    ["first token", rows.map((i) => [i, 0])],
  ];
  const induction = inductionPairs(keys);
  if (induction.length) found.push(["induction", induction]);
  return found.map(([name, pairs]) => ({
    name,
    values: patterns.map((layer) => layer.map((A) => mean(pairs, (i, j) => A[i][j]))),
    uniform: mean(pairs, (i) => uniform(i)),
  }));
}

const SHORT = { "previous token": "prev", "first token": "first", induction: "ind" };
const CANVAS_FROM = 48; // texts longer than this draw the enlarged head on a canvas
const MEANING = {
  "previous token": "mean weight on key i\u22121",
  "first token": "mean weight on key 0",
  induction: "mean weight on the token that followed the last occurrence of the query's token",
};

// A pattern as the pixels of a canvas T x T (masked cells stay transparent: the theme shows through).
function thumbnail(P, T, LUT) {
  const canvas = document.createElement("canvas");
  canvas.width = T;
  canvas.height = T;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(T, T);
  const d = img.data;
  for (let i = 0; i < T; i++) {
    const row = P[i];
    for (let j = 0; j <= i; j++) {
      const k = 3 * Math.round(Math.min(Math.max(row[j], 0), 1) * 255),
        o = 4 * (i * T + j);
      d[o] = LUT[k];
      d[o + 1] = LUT[k + 1];
      d[o + 2] = LUT[k + 2];
      d[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

// The colour scale's legend, 0 to 1 (its bar is coloured by drawLegend).
function legend() {
  const bar = make("div", "gptlib-attn-legend-bar");
  const ticks = make("div", "gptlib-attn-legend-ticks");
  ticks.append(...["0", "0.25", "0.5", "0.75", "1"].map((t) => make("div", "", t)));
  const scale = make("div", "gptlib-attn-legend-scale");
  scale.append(bar, ticks);
  const box = make("div", "gptlib-attn-legend");
  box.append(make("div", "", "attention weight"), scale);
  return box;
}
const drawLegend = (box, pal) => {
  box.querySelector(".gptlib-attn-legend-bar").style.background =
    `linear-gradient(to right, ${[0, 0.25, 0.5, 0.75, 1].map(pal.heat).join(", ")})`;
};

// A box that scrolls sideways when its content is wider than the page, with a cue that says so
// while there is more to see: the edges that have more fade out, and a line under it.
function scroller(content) {
  const box = make("div", "gptlib-scroll");
  const cue = make("div", "gptlib-scroll-cue", "scroll sideways to see the rest \u2194");
  box.append(content);
  const check = () => {
    const more = box.scrollWidth > box.clientWidth + 1;
    cue.style.display = more ? "" : "none";
    box.classList.toggle("gptlib-more-left", more && box.scrollLeft > 1);
    box.classList.toggle(
      "gptlib-more-right",
      more && box.scrollLeft + box.clientWidth < box.scrollWidth - 1,
    );
  };
  box.addEventListener("scroll", check, { passive: true });
  return { box, cue, check };
}

// The panel's elements, appended to `root`.
function panelLayout(root) {
  const v = {
    title: make("div", "gptlib-title"),
    thumbs: make("div", "gptlib-attn-thumbs"),
    key: make("div", "gptlib-attn-score-key"),
    layerSel: make("select", "gptlib-attn-layer"),
    headSel: make("select", "gptlib-attn-head"),
    current: make("div", "gptlib-attn-current"),
    grid: make("div", "gptlib-attn-grid"),
    legend: legend(),
    text: make("div", "gptlib-attn-text"),
    focus: make(
      "div",
      "gptlib-attn-focus",
      "hover a token of the text, or a query row, to see where it looks",
    ),
  };
  const controls = make("div", "gptlib-controls");
  controls.append("layer ", v.layerSel, " head ", v.headSel, v.legend);
  v.thumbScroll = scroller(v.thumbs);
  v.gridScroll = scroller(v.grid);
  root.append(
    v.title,
    v.thumbScroll.box,
    v.thumbScroll.cue,
    v.key,
    controls,
    v.current,
    v.gridScroll.box,
    v.gridScroll.cue,
    make("div", "gptlib-attn-text-label", "text (hover a token):"),
    v.text,
    v.focus,
  );
  return v;
}

function setOptions(sel, labels) {
  sel.replaceChildren(
    ...labels.map((lab, i) => {
      const o = make("option", "", lab);
      o.value = String(i);
      return o;
    }),
  );
}

// A token with its position, as hover texts and the focus line name it: 3 "␣the".
const named = (tokens, i) => `${i} \u201c${show(tokens[i])}\u201d`;

// The labels of the heatmap's keys (across) and queries (down): every token in full, rotated
// across, where a cell is wide enough for a line of text; on smaller cells every k-th token, with
// its position, over the cells that follow it. Each label's hover text names its token in full.
function labelEvery(cell) {
  return cell >= 11 ? 1 : Math.ceil(13 / cell);
}
function axisLabel(cls, tokens, i, k, what) {
  const text = k === 1 ? show(tokens[i]) : i % k === 0 ? `${i} ${show(tokens[i])}` : "";
  const e = make("div", cls + (k === 1 ? "" : " gptlib-attn-sparse"), text);
  e.title = `${what} ${named(tokens, i)}`;
  return e;
}

// The label of query i; `data-i` tells the heatmap's hover listener which query a row is.
function queryLabel(tokens, i, k) {
  const q = axisLabel("gptlib-attn-query", tokens, i, k, "query");
  q.dataset.i = String(i);
  return q;
}

const cellTitle = (tokens, A, i, j) =>
  `query ${named(tokens, i)} \u2192 key ${named(tokens, j)}: ` +
  (j > i ? "masked (a key after the query)" : `weight ${A[i][j].toFixed(3)}`);

// The enlarged head for short texts: one element per cell. Returns the rows [query, ...cells].
function cellHeatmap(grid, tokens, A, cell, keys, pal) {
  const T = tokens.length,
    k = labelEvery(cell);
  grid.style.gridTemplateColumns = `max-content repeat(${T}, ${cell}px)`;
  grid.style.gridTemplateRows = "auto"; // the keys' row as tall as its longest label
  grid.style.gridAutoRows = `${cell}px`;
  const rows = tokens.map((_t, i) => [
    queryLabel(tokens, i, k),
    ...tokens.map((_, j) => {
      const c = make("div", `gptlib-attn-cell${j > i ? " masked" : ""}`);
      c.dataset.i = String(i);
      if (j <= i) c.style.background = pal.heat(A[i][j]);
      c.title = cellTitle(tokens, A, i, j);
      return c;
    }),
  ]);
  grid.replaceChildren(make("div", ""), ...keys, ...rows.flat());
  return rows;
}

// The enlarged head for long texts: the cells are the pixels of one canvas (T * T elements would
// take the page seconds to lay out); the labels stay elements, and a band marks the hovered
// query. onQuery(i) is called as the pointer moves over row i. Returns {rows, band}.
function canvasHeatmap(grid, tokens, A, cell, keys, pal, onQuery) {
  const T = tokens.length,
    k = labelEvery(cell);
  grid.style.gridTemplateColumns = `max-content ${T * cell}px`;
  grid.style.gridTemplateRows = "";
  grid.style.gridAutoRows = "auto";
  const keyRow = make("div", "gptlib-attn-keys");
  keyRow.style.gridTemplateColumns = `repeat(${T}, ${cell}px)`;
  keyRow.append(...keys);
  const rows = tokens.map((_t, i) => [queryLabel(tokens, i, k)]);
  const queries = make("div", "gptlib-attn-queries");
  queries.style.gridTemplateRows = `repeat(${T}, ${cell}px)`;
  queries.append(...rows.map((r) => r[0]));
  const canvas = thumbnail(A, T, pal.lut);
  canvas.style.width = canvas.style.height = `${T * cell}px`;
  const band = make("div", "gptlib-attn-band");
  band.style.height = `${cell}px`;
  const box = make("div", "gptlib-attn-canvas");
  box.append(canvas, band);
  canvas.addEventListener("mousemove", (e) => {
    const i = Math.min(T - 1, Math.max(0, Math.floor(e.offsetY / cell)));
    const j = Math.min(T - 1, Math.max(0, Math.floor(e.offsetX / cell)));
    canvas.title = cellTitle(tokens, A, i, j);
    onQuery(i);
  });
  grid.replaceChildren(make("div", ""), keyRow, queries, box);
  return { rows, band };
}

// The thumbnails, one button per head with its scores (the best of each score in bold).
// onPick(layer, head) is called on a click. Returns the buttons.
function drawThumbs(thumbs, { tokens, patterns, layerLabels, headLabels, scores }, pal, onPick) {
  // Each head's column as wide as its thumbnail; a longer header wraps within it. Seven heads or
  // more (SmolLM2's nine) get smaller thumbnails, so that a layer fits a 736 px column.
  const dense = headLabels.length > 6;
  thumbs.classList.toggle("dense", dense);
  thumbs.style.gridTemplateColumns = `max-content repeat(${headLabels.length}, minmax(${dense ? 60 : 76}px, max-content))`;
  const best = scores.map((s) => Math.max(...s.values.flat()));
  const buttons = [];
  const items = [
    make("div", ""),
    ...headLabels.map((h) => make("div", "gptlib-attn-thumb-head", h)),
  ];
  patterns.forEach((layerPatterns, l) => {
    items.push(make("div", "gptlib-attn-thumb-layer", layerLabels[l]));
    layerPatterns.forEach((P, h) => {
      const b = make("button", "gptlib-attn-thumb");
      b.type = "button";
      b.dataset.layer = String(l);
      b.dataset.head = String(h);
      b.title = `${layerLabels[l]}, ${headLabels[h]}: click to enlarge`;
      b.append(thumbnail(P, tokens.length, pal.lut));
      scores.forEach((s, n) => {
        const v = s.values[l][h];
        const line = make(
          "div",
          `gptlib-attn-score${v === best[n] ? " best" : ""}`,
          `${SHORT[s.name] || s.name} ${v.toFixed(2)}`,
        );
        report(line, { name: s.name, value: v });
        b.append(line);
      });
      b.addEventListener("click", () => onPick(l, h));
      buttons.push(b);
      items.push(b);
    });
  });
  thumbs.replaceChildren(...items);
  return buttons;
}

// The playground's marks on the thumbnails: `groups[h]`, the key-value head that head h shares
// (alternate groups shaded), and `mask` (n_layers * n_heads), the heads ablated (0) struck out.
function markThumbs(buttons, { groups, mask, headLabels }) {
  const H = headLabels.length;
  buttons.forEach((b) => {
    const l = Number(b.dataset.layer),
      h = Number(b.dataset.head);
    if (groups) {
      b.dataset.kv = String(groups[h]);
      b.classList.toggle("kv-odd", groups[h] % 2 === 1);
    }
    const off = !!mask && mask[l * H + h] !== 1;
    b.classList.toggle("ablated", off);
    if (off) b.title += " (ablated)";
  });
}

function scoreKey(scores) {
  if (!scores.length) return "";
  return `Scores on the text below: ${scores
    .map(
      (s) =>
        `${SHORT[s.name] || s.name} = ${s.name} (${s.meaning || MEANING[s.name] || ""}` +
        (s.uniform === null ? ")" : `; ${s.uniform.toFixed(2)} for a uniform head)`),
    )
    .join(", ")}. Bold: the highest head of each score.`;
}

// The text as tokens; hovering one calls onEnter(i) and onLeave(). Returns the tokens' spans.
// A long text shows its first and last tokens around a button that puts the others back.
function drawText(box, tokens, onEnter, onLeave) {
  const words = tokens.map((t, i) => {
    const s = make("span", "gptlib-attn-tok", t.replace(/\n/g, "\u21b5\n"));
    s.title = `token ${named(tokens, i)}`;
    s.addEventListener("mouseenter", () => onEnter(i));
    s.addEventListener("mouseleave", onLeave);
    return s;
  });
  // Sub-word tokens carry their own spaces (" cat"); whole words get one between them.
  const spaced = !tokens.some((t) => /^\s|\s$/.test(t));
  const items = words.map((w, i) => {
    if (!spaced || i === 0) return w;
    const s = make("span");
    s.append(" ", w);
    return s;
  });
  box.replaceChildren(...collapse(items));
  return words;
}

// The panel. `state` gets and sets the selected head: {get: () => [layer, head], set(layer, head)}.
// update({title, tokens, patterns, layerLabels, headLabels, scores}) redraws it for new data;
// redraw() draws the selected head again (after the state changed it).
export function attentionPanel(root, state) {
  root.classList.add("gptlib-attn");
  const v = panelLayout(root);
  // The data, the thumbnails, the text's spans, the heatmap's key labels and rows (each
  // [query label, ...cells]), the enlarged pattern, the canvas band, and the focused query.
  let data = null,
    buttons = [],
    words = [],
    keys = [],
    rows = [],
    A = null,
    band = null,
    focused = null,
    cellPx = 0;
  let pal = palette(STOPS); // the colour scale on the page's background (scaleOn)
  let drawnWidth = 0; // the width the heatmap was sized for

  // Query i: its row outlined, every key and text token coloured by the weight i gives it.
  function focusQuery(i) {
    unfocus();
    rows[i].forEach((c) => {
      c.style.outline = "1px solid #c00";
    });
    rows[i][0].style.fontWeight = "bold";
    if (band) {
      band.style.top = `${i * cellPx}px`;
      band.style.display = "block";
    }
    keys.forEach((k, j) => {
      k.style.background = j <= i ? pal.heat(A[i][j]) : "";
      k.style.color = j <= i ? pal.ink(A[i][j]) : "";
    });
    words.forEach((w, j) => {
      w.style.background = j <= i ? pal.heat(A[i][j]) : "";
      w.style.color = j <= i ? pal.ink(A[i][j]) : "var(--gptlib-muted)"; // later tokens are out of its sight
    });
    words[i].classList.add("gptlib-attn-hot");
    const tokens = data.tokens;
    const top = [...A[i]]
      .map((a, j) => [a, j])
      .filter(([, j]) => j <= i)
      .sort((x, y) => y[0] - x[0])
      .slice(0, 3);
    v.focus.textContent =
      `query ${named(tokens, i)} attends to ` +
      top.map(([a, j]) => `key ${named(tokens, j)} (${a.toFixed(2)})`).join(", ");
    focused = i;
    report(root, { focus: i });
  }

  function unfocus() {
    focused = null;
    rows.forEach((r) => {
      r.forEach((c) => {
        c.style.outline = "";
      });
      r[0].style.fontWeight = "";
    });
    if (band) band.style.display = "none";
    keys.forEach((k) => {
      k.style.background = "";
      k.style.color = "";
    });
    words.forEach((w) => {
      w.style.background = "";
      w.style.color = "";
      w.classList.remove("gptlib-attn-hot");
    });
  }

  // The selected head: selectors, thumbnail outline, its scores, and the enlarged heatmap.
  function drawHead() {
    if (!data) return;
    const [layer, head] = state.get();
    const { tokens, patterns, layerLabels, headLabels, scores } = data;
    const T = tokens.length;
    A = patterns[layer][head];
    v.layerSel.value = String(layer);
    v.headSel.value = String(head);
    for (const b of buttons) {
      const on = b.dataset.layer === String(layer) && b.dataset.head === String(head);
      b.classList.toggle("selected", on);
    }
    v.current.textContent =
      `${layerLabels[layer]}, ${headLabels[head]}` +
      (scores.length
        ? `: ${scores.map((s) => `${s.name} score ${s.values[layer][head].toFixed(3)}`).join(", ")}`
        : "");
    // Cells shrink for long texts so that the heatmap stays about as wide as the space it has
    // (528 px of cells at most, beside the query labels; never under 4 px a cell).
    const room = v.gridScroll.box.clientWidth || 640;
    const budget = Math.min(528, Math.max(160, room - 110));
    const cell = Math.max(4, Math.min(22, Math.floor(budget / T)));
    cellPx = cell;
    const k = labelEvery(cell);
    v.grid.style.fontSize = `${k === 1 ? Math.min(12, cell - 2) : 10}px`;
    keys = tokens.map((_t, j) => axisLabel("gptlib-attn-key", tokens, j, k, "key"));
    band = null;
    focused = null;
    if (T > CANVAS_FROM) {
      ({ rows, band } = canvasHeatmap(v.grid, tokens, A, cell, keys, pal, (i) => {
        if (focused !== i || band.style.display !== "block") focusQuery(i);
      }));
    } else {
      rows = cellHeatmap(v.grid, tokens, A, cell, keys, pal);
    }
    drawnWidth = room;
    requestAnimationFrame(v.gridScroll.check);
    // What is drawn: the diagonal as a fingerprint, and the whole enlarged pattern.
    report(root, {
      view: `${layer}/${head}:${A.map((r, i) => r[i].toFixed(3)).join(",")}`,
      pattern: A.map((r) => Array.from(r)),
    });
  }

  function select(layer, head) {
    state.set(layer, head);
    drawHead();
  }

  // One listener for the whole heatmap: a row (its query label or a cell) focuses its query.
  v.grid.addEventListener("mouseover", (e) => {
    const i = e.target.dataset ? e.target.dataset.i : undefined;
    if (i !== undefined) focusQuery(Number(i));
  });
  v.grid.addEventListener("mouseleave", unfocus);
  v.layerSel.addEventListener("change", () => select(Number(v.layerSel.value), state.get()[1]));
  v.headSel.addEventListener("change", () => select(state.get()[0], Number(v.headSel.value)));

  // The scale follows the page's background (read again when the theme changes).
  function theme() {
    const stops = scaleOn(backgroundOf(root));
    if (JSON.stringify(stops) !== JSON.stringify(pal.stops)) pal = palette(stops);
    drawLegend(v.legend, pal);
    report(root, { scale: pal.stops });
  }

  function update(next) {
    data = next;
    theme();
    v.title.textContent = data.title || "";
    v.title.style.display = data.title ? "" : "none";
    setOptions(v.layerSel, data.layerLabels);
    setOptions(v.headSel, data.headLabels);
    buttons = drawThumbs(v.thumbs, data, pal, (l, h) => state.pick?.(l, h) || select(l, h));
    markThumbs(buttons, data);
    requestAnimationFrame(v.thumbScroll.check);
    v.key.textContent = scoreKey(data.scores);
    words = drawText(v.text, data.tokens, focusQuery, unfocus);
    drawHead();
  }

  // Drawn again when the space changes (a narrower window: smaller cells) or the theme does.
  if (typeof ResizeObserver !== "undefined") {
    new ResizeObserver(() => {
      v.thumbScroll.check();
      v.gridScroll.check();
      if (data && Math.abs(v.gridScroll.box.clientWidth - drawnWidth) > 24) drawHead();
    }).observe(v.gridScroll.box);
  }
  if (typeof MutationObserver !== "undefined") {
    const watch = new MutationObserver(() => {
      if (!root.isConnected) watch.disconnect();
      else if (data) update(data);
    });
    watch.observe(document.documentElement, {
      attributes: true,
      attributeFilter: ["data-theme", "class"],
    });
  }

  return { update, select, redraw: drawHead };
}
