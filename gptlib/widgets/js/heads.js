// Attention heads: the colour scale, the head scores of gptlib.circuits, and the panel that shows
// every head as a thumbnail (layers down, heads across) with its scores, one head enlarged as a
// heatmap (query tokens down, key tokens across) on a fixed scale from 0 to 1, and the text,
// coloured by where a hovered token attends.
import { collapse, make, report } from "./dom.js";
import { clearFocus, drawHeatmap, focus, heatmapState, named, thumbnail } from "./heatmap.js";

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
const MEANING = {
  "previous token": "mean weight on key i\u22121",
  "first token": "mean weight on key 0",
  induction: "mean weight on the token that followed the last occurrence of the query's token",
};

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
      b.setAttribute("aria-label", `${layerLabels[l]}, ${headLabels[h]}`); // screen readers, touch
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
  let data = null,
    buttons = [];
  let pal = palette(STOPS); // the colour scale on the page's background (scaleOn)
  let drawnWidth = 0; // the width the heatmap was sized for
  const drawn = heatmapState(); // the text's spans and the enlarged head (heatmap.js)
  const focusQuery = (i) => {
    v.focus.textContent = focus(drawn, i, pal);
    report(root, { focus: i });
  };
  const unfocus = () => clearFocus(drawn);

  // The selected head: selectors, thumbnail outline, its scores, and the enlarged heatmap.
  function drawHead() {
    if (!data) return;
    const [layer, head] = state.get();
    const { layerLabels, headLabels, scores } = data;
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
    const A = data.patterns[layer][head];
    drawnWidth = drawHeatmap(drawn, v, data.tokens, A, pal, (i) => {
      if (drawn.focused !== i || drawn.band.style.display !== "block") focusQuery(i);
    });
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
    drawn.words = drawText(v.text, data.tokens, focusQuery, unfocus);
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
