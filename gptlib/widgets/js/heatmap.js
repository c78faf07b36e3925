// One head enlarged: its pattern as a heatmap (query tokens down, key tokens across) with the
// tokens as labels, drawn as elements for short texts and on a canvas for long ones, and the
// focus on one query (its row outlined, its keys and the text coloured by its weights). Used by
// the attention panel (heads.js).
import { make, show } from "./dom.js";

// texts longer than this draw the enlarged head on a canvas: a grid of 48 x 48 cells, each an
// element, took a click 10 to 18 ms to make and as long again to lay out
const CANVAS_FROM = 24;

// The pixels (RGBA, T x T) of a pattern: row i's cells 0..i coloured through LUT, the others
// left as they are (transparent in a new image).
function paintPattern(d, P, T, LUT) {
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
}

// A token with its position, as hover texts and the focus line name it: 3 "␣the".
// `pos`: the tokens' positions in the text, where they are not 0, 1, 2, ... (the panel's window).
export const named = (tokens, i, pos = null) =>
  `${pos ? pos[i] : i} \u201c${show(tokens[i])}\u201d`;

// The labels of the heatmap's keys (across) and queries (down): every token in full, rotated
// across, where a cell is wide enough for a line of text; on smaller cells every k-th token, with
// its position, over the cells that follow it. Each label's hover text names its token in full.
function labelEvery(cell) {
  return cell >= 11 ? 1 : Math.ceil(13 / cell);
}
function axisLabel(cls, tokens, i, k, what, pos) {
  return setLabel(
    make("div", cls + (k === 1 ? "" : " gptlib-attn-sparse")),
    tokens,
    i,
    k,
    what,
    pos,
  );
}
// A label's text and hover text, changed only where they differ (a label kept from the last draw).
function setLabel(e, tokens, i, k, what, pos) {
  const text =
      k === 1 ? show(tokens[i]) : i % k === 0 ? `${pos ? pos[i] : i} ${show(tokens[i])}` : "",
    title = `${what} ${named(tokens, i, pos)}`;
  if (e.textContent !== text) e.textContent = text;
  if (e.title !== title) e.title = title;
  return e;
}

// The label of query i; `data-i` tells the heatmap's hover listener which query a row is.
function queryLabel(tokens, i, k, pos) {
  const q = axisLabel("gptlib-attn-query", tokens, i, k, "query", pos);
  q.dataset.i = String(i);
  return q;
}

const cellTitle = (tokens, A, i, j, pos) =>
  `query ${named(tokens, i, pos)} \u2192 key ${named(tokens, j, pos)}: ` +
  (j > i ? "masked (a key after the query)" : `weight ${A[i][j].toFixed(3)}`);

// The enlarged head for short texts: one element per cell. Returns the rows [query, ...cells].
function cellHeatmap(grid, tokens, A, cell, keys, pal, pos) {
  const T = tokens.length,
    k = labelEvery(cell);
  grid.style.gridTemplateColumns = `max-content repeat(${T}, ${cell}px)`;
  grid.style.gridTemplateRows = "auto"; // the keys' row as tall as its longest label
  grid.style.gridAutoRows = `${cell}px`;
  const rows = tokens.map((_t, i) => [
    queryLabel(tokens, i, k, pos),
    ...tokens.map((_, j) => {
      const c = make("div", `gptlib-attn-cell${j > i ? " masked" : ""}`);
      c.dataset.i = String(i);
      if (j <= i) c.style.background = pal.heat(A[i][j]);
      c.title = cellTitle(tokens, A, i, j, pos);
      return c;
    }),
  ]);
  grid.replaceChildren(make("div", ""), ...keys, ...rows.flat());
  return rows;
}

// The enlarged head for long texts: the cells are the pixels of one canvas (T * T elements would
// take the page seconds to lay out); the labels stay elements, and a band marks the hovered
// query. onQuery(i) is called as the pointer moves over row i. The elements are kept in d.kit and
// used again while the text's length and the cell size stay (a click past the panel's window
// changes the labels' texts and the pixels, not the elements: making the 2 T labels and the
// canvas again took a click of SmolLM2's about 10 ms, and as long again to style). Returns
// {rows, band, keys}.
function canvasHeatmap(d, grid, tokens, A, cell, pal, onQuery, pos) {
  const T = tokens.length,
    k = labelEvery(cell);
  let kit = d.kit;
  if (!kit || kit.T !== T || kit.cell !== cell || kit.box.parentNode !== grid) {
    grid.style.gridTemplateColumns = `max-content ${T * cell}px`;
    grid.style.gridTemplateRows = "";
    grid.style.gridAutoRows = "auto";
    const keys = tokens.map((_t, j) => axisLabel("gptlib-attn-key", tokens, j, k, "key", pos));
    const keyRow = make("div", "gptlib-attn-keys");
    keyRow.style.gridTemplateColumns = `repeat(${T}, ${cell}px)`;
    keyRow.append(...keys);
    const labels = tokens.map((_t, i) => queryLabel(tokens, i, k, pos));
    const queries = make("div", "gptlib-attn-queries");
    queries.style.gridTemplateRows = `repeat(${T}, ${cell}px)`;
    queries.append(...labels);
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = T;
    canvas.style.width = canvas.style.height = `${T * cell}px`;
    const ctx = canvas.getContext("2d");
    const band = make("div", "gptlib-attn-band");
    band.style.height = `${cell}px`;
    const box = make("div", "gptlib-attn-canvas");
    box.append(canvas, band);
    kit = d.kit = { T, cell, keys, labels, canvas, ctx, img: ctx.createImageData(T, T), band, box };
    canvas.addEventListener("mousemove", (e) => {
      const i = Math.min(T - 1, Math.max(0, Math.floor(e.offsetY / cell)));
      const j = Math.min(T - 1, Math.max(0, Math.floor(e.offsetX / cell)));
      canvas.title = cellTitle(d.tokens, d.A, i, j, d.positions);
      kit.onQuery(i);
    });
    grid.replaceChildren(make("div", ""), keyRow, queries, box);
  } else {
    for (let j = 0; j < T; j++) {
      const e = kit.keys[j];
      setLabel(e, tokens, j, k, "key", pos);
      e.style.background = e.style.color = ""; // a focus of the last draw
    }
    for (let i = 0; i < T; i++) {
      const e = kit.labels[i];
      setLabel(e, tokens, i, k, "query", pos);
      e.style.outline = e.style.fontWeight = "";
    }
    kit.band.style.display = "none";
  }
  kit.onQuery = onQuery;
  paintPattern(kit.img.data, A, T, pal.lut); // the same cells each time: row i's 0..i
  kit.ctx.putImageData(kit.img, 0, 0);
  return { rows: kit.labels.map((q) => [q]), band: kit.band, keys: kit.keys };
}

// What the panel has drawn of the enlarged head: the text's spans (`words`), the heatmap's key
// labels and rows (each [query label, ...cells]), the pattern A, the canvas band (long texts), the
// cell size in pixels, the focused query (or null) and fit() (drawHeatmap's).
export function heatmapState() {
  return {
    tokens: [],
    positions: null,
    words: [],
    keys: [],
    rows: [],
    A: null,
    band: null,
    cellPx: 0,
    focused: null,
    fit: () => {},
  };
}

// The pattern A of a head over `tokens`, into the panel's grid (v.grid, in v.gridScroll). Cells
// shrink for long texts so that the heatmap stays about as wide as the space it has (528 px of
// cells at most, beside the query labels; never under 4 px a cell, or 2 px on the canvas of a long
// text, so that the panel's whole window fits a phone); where the query labels are wider than the
// 110 px first allowed them, d.fit() shrinks the cells once more to leave them room. onQuery(i):
// the pointer is on row i of a canvas. `width`: the box's width when the caller knows it (its
// ResizeObserver's), else measured here. Returns the width drawn for.
//
// Nothing here reads the page's layout after changing it: a click's drawing changes the text and
// the charts before it comes here, and each read would lay the whole page out again (10 to 20 ms
// a click for SmolLM2's panel). d.fit() reads it; the caller runs it at the next frame, when the
// browser lays the page out anyway.
export function drawHeatmap(d, v, tokens, A, pal, onQuery, pos = null, width = 0) {
  const T = tokens.length;
  const box = v.gridScroll.box;
  const room = width || box.clientWidth || 640;
  const budget = Math.min(528, Math.max(160, room - 110));
  const least = T > CANVAS_FROM ? 2 : 4;
  const draw = (cell) => {
    const k = labelEvery(cell);
    v.grid.style.fontSize = `${k === 1 ? Math.min(12, cell - 2) : 10}px`;
    Object.assign(d, { tokens, positions: pos, A, cellPx: cell, band: null, focused: null });
    if (T > CANVAS_FROM) {
      ({
        rows: d.rows,
        band: d.band,
        keys: d.keys,
      } = canvasHeatmap(d, v.grid, tokens, A, cell, pal, onQuery, pos));
    } else {
      d.keys = tokens.map((_t, j) => axisLabel("gptlib-attn-key", tokens, j, k, "key", pos));
      d.rows = cellHeatmap(v.grid, tokens, A, cell, d.keys, pal, pos);
      d.kit = null;
    }
  };
  const cell = Math.max(least, Math.min(22, Math.floor(budget / T)));
  draw(cell);
  d.fit = () => {
    if (d.A !== A || d.cellPx !== cell || cell === least) return; // drawn again since, or least
    const over = box.clientWidth > 0 ? box.scrollWidth - box.clientWidth : 0;
    if (over > 0) draw(Math.max(least, cell - Math.ceil(over / T)));
  };
  return room;
}

// Query i in focus: its row outlined, every key and text token coloured by the weight i gives it
// (later tokens are out of its sight). Returns the line that says where it attends most.
export function focus(d, i, pal) {
  const { A, tokens, positions: pos } = d;
  clearFocus(d);
  for (const c of d.rows[i]) c.style.outline = "1px solid #c00";
  d.rows[i][0].style.fontWeight = "bold";
  if (d.band) {
    d.band.style.top = `${i * d.cellPx}px`;
    d.band.style.display = "block";
  }
  d.keys.forEach((k, j) => {
    k.style.background = j <= i ? pal.heat(A[i][j]) : "";
    k.style.color = j <= i ? pal.ink(A[i][j]) : "";
  });
  d.words.forEach((w, j) => {
    w.style.background = j <= i ? pal.heat(A[i][j]) : "";
    w.style.color = j <= i ? pal.ink(A[i][j]) : "var(--gptlib-muted)";
  });
  d.words[i].classList.add("gptlib-attn-hot");
  d.focused = i;
  const top = [...A[i]]
    .map((a, j) => [a, j])
    .filter(([, j]) => j <= i)
    .sort((x, y) => y[0] - x[0])
    .slice(0, 3);
  return (
    `query ${named(tokens, i, pos)} attends to ` +
    top.map(([a, j]) => `key ${named(tokens, j, pos)} (${a.toFixed(2)})`).join(", ")
  );
}

export function clearFocus(d) {
  d.focused = null;
  for (const r of d.rows) {
    for (const c of r) c.style.outline = "";
    r[0].style.fontWeight = "";
  }
  if (d.band) d.band.style.display = "none";
  for (const k of d.keys) {
    k.style.background = "";
    k.style.color = "";
  }
  for (const w of d.words) {
    w.style.background = "";
    w.style.color = "";
    w.classList.remove("gptlib-attn-hot");
  }
}

// The colour scale's legend (its bar coloured and its ends written by drawLegend).
export function legend() {
  const bar = make("div", "gptlib-attn-legend-bar");
  const ticks = make("div", "gptlib-attn-legend-ticks");
  const scale = make("div", "gptlib-attn-legend-scale");
  scale.append(bar, ticks);
  const box = make("div", "gptlib-attn-legend");
  box.append(make("div", "gptlib-attn-legend-name", "attention weight"), scale);
  return box;
}
const tick = (x) => (Math.abs(x) >= 10 ? x.toFixed(0) : String(Number(x.toFixed(2))));
export function drawLegend(box, pal, name = "attention weight", sc = null) {
  const bar = box.querySelector(".gptlib-attn-legend-bar");
  const at = sc?.signed ? [-1, -0.5, 0, 0.5, 1] : [0, 0.25, 0.5, 0.75, 1];
  bar.style.background = `linear-gradient(to right, ${at.map((a) => (sc?.signed ? pal.signed(a) : pal.heat(a))).join(", ")})`;
  const [lo, hi] = sc ? sc.ends : [0, 1];
  const ticks = sc?.signed ? [lo, 0, hi] : [lo, (lo + hi) / 2, hi];
  box
    .querySelector(".gptlib-attn-legend-ticks")
    .replaceChildren(
      ...(sc ? ticks : [0, 0.25, 0.5, 0.75, 1]).map((t) => make("div", "", tick(t))),
    );
  box.querySelector(".gptlib-attn-legend-name").textContent = name;
}

// A box that scrolls sideways when its content is wider than the page, with a cue that says so
// while there is more to see: the edges that have more fade out, and a line under it.
export function scroller(content) {
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
