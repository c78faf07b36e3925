// Attention heads: the colour scale, the head scores of gptlib.circuits, and the panel that shows
// every head as one small cell (layers down, heads across, overview.js) coloured by a score the
// reader chooses, one head in detail as a heatmap (query tokens down, key tokens across) on a
// fixed scale from 0 to 1, and the text, coloured by where a hovered token attends.
import { collapse, make, report } from "./dom.js";
import {
  clearFocus,
  drawHeatmap,
  drawLegend,
  focus,
  heatmapState,
  legend,
  named,
  scroller,
} from "./heatmap.js";
import { headGrid } from "./overview.js";
import { watchBackground } from "./theme.js";

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
export function scaleOn(bg, stops = STOPS) {
  const dark = luminance(bg) < 0.35;
  return [bg, ...(dark ? [...stops].reverse() : stops).slice(1)];
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

// A scale's colours: as CSS, as the pixels of 256 steps for canvases (a heatmap of T = 128 has
// 8256 cells), and the ink that reads on each cell.
// The negative side of a signed score (the direct contributions): white to dark red.
export const NEGATIVE_STOPS = [
  [255, 255, 255],
  [252, 187, 161],
  [251, 106, 74],
  [203, 24, 29],
  [103, 0, 13],
];

function palette(stops, negative = NEGATIVE_STOPS) {
  const lut = Uint8ClampedArray.from(
    { length: 256 * 3 },
    (_, k) => colour(Math.floor(k / 3) / 255, stops)[k % 3],
  );
  return {
    stops,
    lut,
    heat: (a) => `rgb(${colour(a, stops).join(", ")})`,
    // x in [-1, 1]: the background at 0, blue for positive values, red for negative ones
    signed: (x) => `rgb(${colour(Math.abs(x), x < 0 ? negative : stops).join(", ")})`,
    ink: (a) => (luminance(colour(a, stops)) > 0.3 ? "#000" : "#fff"),
  };
}

// The query/key pairs of an induction head (gptlib.circuits.induction_pairs): query i whose
// token last occurred at k, key k + 1, leaving out k + 1 = i. `pos`: the tokens' positions where
// some are left out (the panel's window): k + 1 must then be the position after k's.
export function inductionPairs(keys, pos = null) {
  const last = new Map(),
    pairs = [];
  keys.forEach((t, i) => {
    const k = last.get(t);
    if (k !== undefined && k + 1 < i && (!pos || pos[k + 1] === pos[k] + 1)) pairs.push([i, k + 1]);
    last.set(t, i);
  });
  return pairs;
}

// gptlib.circuits.head_scores: for patterns[l][h][i][j] on the tokens `keys`, the previous-token
// and first-token scores (mean weight on key i - 1, on key 0, over queries 1..T-1) and, when a
// token repeats, the induction score; each with a uniform causal head's score beside it. `pos`:
// the tokens' positions in a window that leaves some out (rows.js; key 0 is always there): the
// scores are then those of the queries in the window whose keys it holds. `total(l, h, pairs)`,
// when given, is the sum of patterns[l][h][i][j] over the pairs [i, j] in their order (rows.js's,
// from its kept rows: no head's pattern is cut for the scores).
export function headScores(patterns, keys, pos = null, total = null) {
  const T = keys.length;
  if (T < 2) return [];
  const at = (i) => (pos ? pos[i] : i);
  const mean = (pairs, A) => pairs.reduce((s, [i, j]) => s + A(i, j), 0) / pairs.length;
  const uniform = (i) => 1 / (at(i) + 1);
  // head (l, h)'s mean over the pairs, summed in their order (270 of SmolLM2's heads a click: a
  // loop)
  const sum =
    total ||
    ((l, h, pairs) => {
      const A = patterns[l][h];
      let s = 0;
      for (let r = 0; r < pairs.length; r++) s += A[pairs[r][0]][pairs[r][1]];
      return s;
    });
  const meanWeight = (pairs, l, h) => sum(l, h, pairs) / pairs.length;
  const rows = [...Array(T - 1).keys()].map((i) => i + 1);
  const found = [
    ["previous token", rows.filter((i) => at(i - 1) === at(i) - 1).map((i) => [i, i - 1])],
    ["first token", rows.map((i) => [i, 0])],
  ];
  const induction = inductionPairs(keys, pos);
  if (induction.length) found.push(["induction", induction]);
  const H = patterns[0]?.length ?? 0;
  return found.map(([name, pairs]) => ({
    name,
    values: patterns.map((_layer, l) => [...Array(H).keys()].map((h) => meanWeight(pairs, l, h))),
    uniform: mean(pairs, (i) => uniform(i)),
  }));
}

const MEANING = {
  "previous token": "mean weight on key i\u22121",
  "first token": "mean weight on key 0",
  induction: "mean weight on the token that followed the last occurrence of the query's token",
  entropy: "of the last query's row, in nats; coloured as a share of log T, a uniform row's",
};

// The entropy (nats) of each head's last row: where the current query looks, spread (high) or
// on one key (0). Its colour is the entropy over log T, the largest a row of T keys can have.
// `known`: the values, where the rows shown are cut (rows.js computes them on the whole rows).
export function rowEntropy(patterns, T, known = null) {
  if (T < 2) return null;
  if (known) return { name: "entropy", values: known, uniform: Math.log(T), top: Math.log(T) };
  const values = patterns.map((layer) =>
    layer.map((A) => {
      let e = 0;
      for (let j = 0; j < T; j++) {
        const a = A[T - 1][j];
        if (a > 0) e -= a * Math.log(a);
      }
      return e;
    }),
  );
  return { name: "entropy", values, uniform: Math.log(T), top: Math.log(T) };
}

// Where a score's value lies on its colour scale: 0 to 1 for weights (and entropy over its top),
// -1 to 1 for a signed score (the direct contributions, over the largest |value|).
function scaleFor(s) {
  const all = s.values.flat();
  if (all.some((x) => x < 0) || s.name === "direct") {
    const m = Math.max(1e-9, ...all.map(Math.abs));
    return { signed: true, at: (x) => x / m, ends: [-m, m] };
  }
  const top = s.top || 1;
  return { signed: false, at: (x) => x / top, ends: [0, top] };
}

// The panel's elements, appended to `root`: the score key and the colour choice, then the
// overview of every head (`grid`, overview.js) beside the detail of one head.
function panelLayout(root, grid) {
  const v = {
    title: make("div", "gptlib-title"),
    key: make("div", "gptlib-attn-score-key"),
    window: make("div", "gptlib-attn-score-key gptlib-attn-window"),
    colourSel: make("select", "gptlib-attn-colour"),
    overviewLegend: legend(),
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
  v.colourSel.setAttribute("aria-label", "colour every head by");
  v.layerSel.setAttribute("aria-label", "layer");
  v.headSel.setAttribute("aria-label", "head");
  const choose = make("div", "gptlib-controls");
  choose.append("colour every head by ", v.colourSel, v.overviewLegend);
  const overview = make("div", "gptlib-attn-ov-box");
  overview.append(grid.box);
  const controls = make("div", "gptlib-controls");
  controls.append("layer ", v.layerSel, " head ", v.headSel, v.legend);
  v.gridScroll = scroller(v.grid);
  const detail = make("div", "gptlib-attn-detail");
  detail.append(controls, v.current, v.gridScroll.box, v.gridScroll.cue);
  const both = make("div", "gptlib-attn-both");
  both.append(overview, detail);
  root.append(
    v.title,
    v.window,
    v.key,
    choose,
    both,
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

// What the chosen score means, and the level of a uniform head.
function scoreKey(s) {
  if (!s) return "";
  const meaning = s.meaning || MEANING[s.name] || "";
  const uniform =
    s.uniform === null || s.uniform === undefined
      ? ""
      : `; ${s.uniform.toFixed(2)} for a uniform head`;
  return `Each cell is a head, coloured by its ${s.name} score (${meaning}${uniform}). The pointer or the arrow keys on a cell show that head below; a click or Enter keeps it.`;
}

// A head's scores, as its hover text and the detail's line say them.
const scoreText = (scores, l, h, digits) =>
  scores.map((s) => `${s.name} score ${s.values[l][h].toFixed(digits)}`).join(", ");

// The text as tokens; hovering one calls onEnter(i) and onLeave(). Returns the tokens' spans.
// A long text shows its first and last tokens around a button that puts the others back; the
// positions a window leaves out (`pos`) are marked after the first token. The spans of the last
// draw are used again (their texts changed in place) while the text has as many tokens laid out
// the same way, as it has click after click once the panel's window is full.
function drawText(box, tokens, onEnter, onLeave, pos = null) {
  // Sub-word tokens carry their own spaces (" cat"); whole words get one between them.
  const spaced = !tokens.some((t) => /^\s|\s$/.test(t)),
    gapped = !!pos && pos.length > 1 && pos[1] > 1,
    gapText = gapped ? ` \u2026 (tokens 1 to ${pos[1] - 1} left out) \u2026 ` : "";
  const text = (t) => t.replace(/\n/g, "\u21b5\n"),
    title = (i) => `token ${named(tokens, i, pos)}`;
  const kept = box.__words;
  if (
    kept?.words.length === tokens.length &&
    kept.spaced === spaced &&
    kept.gapped === gapped &&
    box.contains(kept.words[0])
  ) {
    kept.words.forEach((w, i) => {
      const tx = text(tokens[i]),
        ti = title(i);
      if (w.textContent !== tx) w.textContent = tx;
      if (w.title !== ti) w.title = ti;
      w.style.background = w.style.color = ""; // a focus of the last draw
      w.classList.remove("gptlib-attn-hot");
    });
    if (gapped) kept.gap.textContent = gapText;
    return kept.words;
  }
  const words = tokens.map((t, i) => {
    const s = make("span", "gptlib-attn-tok", text(t));
    s.title = title(i);
    s.addEventListener("mouseenter", () => onEnter(i));
    s.addEventListener("mouseleave", onLeave);
    return s;
  });
  const items = words.map((w, i) => {
    if (!spaced || i === 0) return w;
    const s = make("span");
    s.append(" ", w);
    return s;
  });
  const gap = gapped ? make("span", "gptlib-attn-gap", gapText) : null;
  if (gap) items.splice(1, 0, gap);
  box.replaceChildren(...collapse(items));
  box.__words = { words, spaced, gapped, gap };
  return words;
}

// The overview's colours (grid, overview.js): the score chosen in v.colourSel of every head,
// its key and legend.
function paintOverview(grid, v, data, scores, pal, root) {
  const s = scores.find((x) => x.name === v.colourSel.value) || scores[0];
  v.key.textContent = scoreKey(s);
  if (!s) {
    grid.paint(
      () => "",
      () => "",
      data.mask,
    );
    drawLegend(v.overviewLegend, pal);
    return;
  }
  const sc = scaleFor(s);
  const colourOf = (l, h) => {
    const x = sc.at(s.values[l][h]);
    return sc.signed ? pal.signed(x) : pal.heat(x);
  };
  const { layerLabels, headLabels } = data;
  grid.paint(
    colourOf,
    (l, h) => `${layerLabels[l]}, ${headLabels[h]}: ${scoreText(scores, l, h, 2)}`,
    data.mask,
  );
  drawLegend(v.overviewLegend, pal, `${s.name} score`, sc);
  report(root, {
    colourBy: s.name,
    scores: Object.fromEntries(scores.map((x) => [x.name, x.values])),
  });
}

// The scores the overview can be coloured by, the reader's choice kept where it still exists.
function setScores(sel, scores) {
  const chosen = sel.value;
  sel.replaceChildren(
    ...scores.map((s) => {
      const o = make("option", "", s.name);
      o.value = s.name;
      return o;
    }),
  );
  if (scores.some((s) => s.name === chosen)) sel.value = chosen;
}

// resized() when the box of `scroll` (a scroller) changes size, themed() when the background
// behind `root` may have changed (theme.js). Returns the background's watcher ({soon, stop}).
function watch(root, scroll, { resized, themed }) {
  if (typeof ResizeObserver !== "undefined") {
    new ResizeObserver(() => {
      scroll.check();
      resized();
    }).observe(scroll.box);
  }
  return watchBackground(root, themed);
}

// The palette on the background of `root` (`pal` itself while that has not changed).
function paletteOn(root, pal) {
  const bg = backgroundOf(root),
    stops = scaleOn(bg);
  if (JSON.stringify(stops) === JSON.stringify(pal.stops)) return pal;
  return palette(stops, scaleOn(bg, NEGATIVE_STOPS));
}

// The panel's scores for `data` (its own and the last rows' entropy) and the note on the window
// of positions shown (rows.js), "" when it shows them all.
function panelScores(data) {
  const pos = data.positions || null,
    S = pos ? pos[pos.length - 1] + 1 : data.tokens.length; // the positions of the text
  const entropy = rowEntropy(data.patterns, S, data.entropy || null);
  const note =
    pos && pos[1] > 1
      ? `The heads' patterns below are those of the last ${pos.length - 1} of the ${S} ` +
        "positions, and of the first (key 0), where many heads put their spare weight: a row's " +
        "weights on the keys left out are not shown."
      : "";
  return { scores: entropy ? [...data.scores, entropy] : [...data.scores], note };
}

// The panel. `state` gets and sets the selected head: {get: () => [layer, head], set(layer, head)},
// and may have pick(layer, head) -> true when it takes a click itself (the playground's ablation).
// update({title, tokens, patterns, layerLabels, headLabels, scores, groups, mask}) redraws it for
// new data; redraw() draws the selected head again (after the state changed it).
export function attentionPanel(root, state) {
  root.classList.add("gptlib-attn");
  let data = null,
    scores = [], // the data's scores and the entropy of the last rows
    shown = null, // the head in the detail: [layer, head]
    pal = palette(STOPS), // the colour scales on the page's background (scaleOn)
    themeRead = false, // pal read on the page (getComputedStyle, up the tree): once, then on a change
    built = "", // the labels the overview's cells were made for
    drawnWidth = 0, // the width the heatmap was sized for
    boxWidth = 0; // the heatmap's box's width, as its ResizeObserver last saw it (0: unknown)
  const grid = headGrid({
    preview: (l, h) => drawDetail(...(l === null ? state.get() : [l, h])),
    pick: (l, h) => state.pick?.(l, h) || select(l, h),
  });
  const v = panelLayout(root, grid);
  const drawn = heatmapState(); // the text's spans and the enlarged head (heatmap.js)
  const focusQuery = (i) => {
    v.focus.textContent = focus(drawn, i, pal);
    report(root, { focus: i });
  };
  const unfocus = () => clearFocus(drawn);

  // One head in the detail: selectors, its scores, and the enlarged heatmap.
  function drawDetail(layer, head) {
    if (!data?.patterns[layer]?.[head]) return;
    const { layerLabels, headLabels } = data;
    shown = [layer, head];
    v.layerSel.value = String(layer);
    v.headSel.value = String(head);
    v.current.textContent =
      `${layerLabels[layer]}, ${headLabels[head]}` +
      (scores.length ? `: ${scoreText(scores, layer, head, 3)}` : "");
    const A = data.patterns[layer][head],
      pos = data.positions || null;
    const onQuery = (i) => {
      if (drawn.focused !== i || drawn.band.style.display !== "block") focusQuery(i);
    };
    drawnWidth = drawHeatmap(drawn, v, data.tokens, A, pal, onQuery, pos, boxWidth);
    requestAnimationFrame(() => {
      drawn.fit();
      v.gridScroll.check();
    });
    // What is drawn: the diagonal as a fingerprint, and the whole enlarged pattern.
    report(root, {
      view: `${layer}/${head}:${A.map((r, i) => r[i].toFixed(3)).join(",")}`,
      pattern: A.map((r) => Array.from(r)),
    });
  }

  // The selected head, outlined in the overview and in the detail.
  function drawHead() {
    if (!data) return;
    const [layer, head] = state.get();
    grid.choose(layer, head);
    drawDetail(layer, head);
  }

  function select(layer, head) {
    state.set(layer, head);
    drawHead();
  }

  const paint = () => paintOverview(grid, v, data, scores, pal, root);

  // One listener for the whole heatmap: a row (its query label or a cell) focuses its query.
  v.grid.addEventListener("mouseover", (e) => {
    if (e.target.dataset?.i !== undefined) focusQuery(Number(e.target.dataset.i));
  });
  v.grid.addEventListener("mouseleave", unfocus);
  v.layerSel.addEventListener("change", () => select(Number(v.layerSel.value), state.get()[1]));
  v.headSel.addEventListener("change", () => select(state.get()[0], Number(v.headSel.value)));
  v.colourSel.addEventListener("change", () => data && paint());

  // The scale follows the page's background (read again when it may have changed: theme.js).
  // Returns true when the palette changed.
  function theme() {
    const before = pal;
    pal = paletteOn(root, pal);
    themeRead = root.isConnected; // a root not yet in the page has no background to read
    if (!themeRead) watcher.soon(); // read it once the root is in the page
    drawLegend(v.legend, pal);
    report(root, { scale: pal.stops });
    return pal !== before;
  }

  function update(next) {
    data = next;
    if (!themeRead) theme();
    v.title.textContent = data.title || "";
    v.title.style.display = data.title ? "" : "none";
    // the selectors and the overview's cells are made again only for other labels (another
    // model): a step of the same model repaints them
    const labels = JSON.stringify([data.layerLabels, data.headLabels, data.groups || null]);
    if (labels !== built) {
      setOptions(v.layerSel, data.layerLabels);
      setOptions(v.headSel, data.headLabels);
      grid.build(data.layerLabels, data.headLabels, data.groups || null);
      built = labels;
    }
    ({ scores, note: v.window.textContent } = panelScores(data));
    setScores(v.colourSel, scores);
    paint();
    drawn.words = drawText(v.text, data.tokens, focusQuery, unfocus, data.positions || null);
    drawHead();
  }

  // Drawn again when the space changes (a narrower window: smaller cells), and coloured again
  // when the background does: the overview and the detail, not the rest (scores, text).
  const watcher = watch(root, v.gridScroll, {
    resized: () => {
      boxWidth = v.gridScroll.box.clientWidth; // laid out already: the observer reports after
      if (data && shown && Math.abs(boxWidth - drawnWidth) > 24) drawDetail(...shown);
    },
    themed: () => {
      if (!theme() || !data) return;
      unfocus();
      paint();
      drawHead();
    },
  });

  // close(): the panel stops watching the page (its view has ended).
  return { update, select, redraw: drawHead, close: watcher.stop };
}
