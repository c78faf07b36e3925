// What the playground draws: its elements (layout), and the analysis shown (the playground's
// `current`) drawn on them: the tokens, the next-token distribution, the logit lens, the heads and
// their direct contributions; each function takes the playground `p` (playground.js).
import { button, make, report, show, svg } from "./dom.js";
import {
  byLogit,
  chartKey,
  chartRows,
  distribution,
  drawChart,
  entropy,
  samplingControls,
} from "./distribution.js";
import { headScores } from "./heads.js";
import { largestDirect, restLogZAt } from "./analysis.js";

// The multiplications of the logit lens at one position, (L + 1) d_model d_vocab (d_model =
// n_heads d_head in both families of models here), above which its panel starts closed: 100
// million, about 15 ms a step in onnxruntime-web on one thread. The English model's lens is far
// below it; SmolLM2's 31 streams times a 49,152-token vocabulary (878 million, about 100 ms in
// Chromium, a bare step's 60) wait for the reader to open the panel, so that a click costs about
// one step.
export const LENS_OPEN_MACS = 1e8;
export const lensIsCheap = (c) =>
  (c.n_layers + 1) * c.n_heads * c.d_head * c.d_vocab <= LENS_OPEN_MACS;

// The view's elements: the text box and the live model's switch, the context's tokens and text,
// the sampling controls and chart, the logit lens, and every head (an attention panel).
export function layout(model) {
  const v = {
    root: make("div", "gptlib-widget gptlib-play"),
    box: make("textarea", "gptlib-play-text"),
    chatBox: make("input", "gptlib-play-chat"),
    startBtn: button("gptlib-play-start", "start the live model"),
    confirm: make("div", "gptlib-play-confirm"),
    progress: make("progress", "gptlib-play-progress"),
    status: make("div", "gptlib-play-status"),
    tokenRow: make("div", "gptlib-play-tokens"),
    out: make("div", "gptlib-samp-text gptlib-play-out"),
    controls: samplingControls(Math.max(100, model.get("top_k"))),
    seedBox: make("input", "gptlib-play-seed"),
    sampleBtn: button("gptlib-samp-step", "sample next token"),
    greedyBtn: button("gptlib-play-greedy", "greedy"),
    undoBtn: button("gptlib-samp-undo", "undo"),
    resetBtn: button("gptlib-samp-reset", "reset"),
    runBtn: button("gptlib-play-run", "generate"),
    runN: make("input", "gptlib-play-run-n"),
    runGreedy: make("input", "gptlib-play-run-greedy"),
    stopBtn: button("gptlib-play-stop", "stop"),
    msg: make("div", "gptlib-samp-msg"),
    stats: make("div", "gptlib-samp-stats"),
    chart: svg("svg", { class: "gptlib-samp-chart" }),
    lens: make("div", "gptlib-play-lens"),
    ablation: make("div", "gptlib-play-ablation"),
    ablateBox: make("input", "gptlib-play-ablate-mode"),
    restoreBtn: button("gptlib-play-restore", "restore all heads"),
    direct: make("div", "gptlib-play-direct"),
    heads: make("div", "gptlib-play-heads"),
  };
  v.box.rows = 3;
  v.box.spellcheck = false;
  v.box.value = model.get("text");
  v.box.setAttribute("aria-label", "text for the model");
  v.status.setAttribute("role", "status"); // the status line and errors, read out as they change
  v.status.setAttribute("aria-live", "polite");
  v.msg.setAttribute("role", "alert");
  v.msg.setAttribute("aria-live", "assertive");
  v.chatBox.type = v.runGreedy.type = v.ablateBox.type = "checkbox";
  v.chatBox.checked = model.get("chat");
  Object.assign(v.seedBox, {
    type: "number",
    min: "0",
    max: "4294967295",
    step: "1",
    value: String(model.get("seed")),
  });
  Object.assign(v.runN, {
    type: "number",
    min: "1",
    max: "1000",
    step: "1",
    value: String(model.get("n_generate")),
  });
  Object.assign(v.progress, { max: 1, value: 0 });
  v.progress.style.display = "none";
  v.stopBtn.disabled = true;
  arrange(v, model);
  return v;
}

// A label around its parts (a box and its text).
function label(cls, ...parts) {
  const l = make("label", cls);
  l.append(...parts);
  return l;
}

// The elements `v` in rows, in the view's order: the text and the start button, the tokens, the
// next token (controls, buttons, chart), the logit lens, the heads.
function arrange(v, model) {
  const chatLabel = label(
    "gptlib-play-chat-label",
    v.chatBox,
    " chat (the model's chat template around the text)",
  );
  chatLabel.style.display = model.get("chat_available") ? "" : "none";
  v.chatLabel = chatLabel;
  const startRow = make("div", "gptlib-controls");
  startRow.append(v.startBtn, v.progress, v.status);
  const buttons = make("div", "gptlib-controls");
  buttons.append(
    v.sampleBtn,
    v.greedyBtn,
    v.undoBtn,
    v.resetBtn,
    label("gptlib-play-seed-label", "seed ", v.seedBox),
  );
  const runRow = make("div", "gptlib-controls");
  runRow.append(
    v.runBtn,
    label("gptlib-play-run-label", "up to ", v.runN, " tokens"),
    label("gptlib-play-run-greedy-label", v.runGreedy, " greedy"),
    v.stopBtn,
  );
  const ablateRow = make("div", "gptlib-controls");
  ablateRow.append(
    label(
      "gptlib-play-ablate-label",
      v.ablateBox,
      " a click on a head ablates it (its output zeroed)",
    ),
    v.restoreBtn,
    v.ablation,
  );
  const section = (text) => make("div", "gptlib-play-section", text);
  // a panel the reader can close: the model computes what it shows only while it is open
  const panel = (cls, text, open, ...parts) => {
    const d = make("details", cls);
    d.open = open;
    d.append(make("summary", "gptlib-play-section", text), ...parts);
    return d;
  };
  const cheap = lensIsCheap(model.get("config"));
  v.lensPanel = panel(
    "gptlib-play-lens-panel",
    "Logit lens: the next token read off the residual stream after each block (the final norm, then W_U; temperature 1)" +
      (cheap ? "" : "; computed only while open, at more than a step's cost"),
    cheap,
    v.lens,
  );
  v.headsPanel = panel(
    "gptlib-play-heads-panel",
    "Every head on this text",
    true,
    ablateRow,
    v.direct,
    v.heads,
  );
  v.root.append(
    make("div", "gptlib-title", model.get("title")),
    v.box,
    chatLabel,
    startRow,
    v.confirm,
    v.tokenRow,
    v.out,
    section("Next token"),
    ...v.controls.rows,
    buttons,
    runRow,
    v.msg,
    v.stats,
    v.chart,
    chartKey(),
    v.lensPanel,
    v.headsPanel,
  );
}

// The text of token ids from their bytes: invalid bytes become U+FFFD, as in
// BPETokenizer.decode; a leading U+FEFF is text, not a mark.
export function decodeBytes(bytes, ids) {
  const parts = ids.map((i) => bytes[i]);
  const all = new Uint8Array(parts.reduce((s, b) => s + b.length, 0));
  let at = 0;
  parts.forEach((b) => {
    all.set(b, at);
    at += b.length;
  });
  return new TextDecoder("utf-8", { ignoreBOM: true }).decode(all);
}

// The logit lens: one row per residual stream, its top tokens shaded by probability.
function drawLens(box, lens, labels, tokenStr) {
  if (!lens) {
    box.replaceChildren(make("div", "gptlib-play-lens-row", "(read when the panel is open)"));
    return;
  }
  box.replaceChildren(
    ...lens.map((top, l) => {
      const r = make("div", "gptlib-play-lens-row");
      r.append(
        make("span", "gptlib-play-lens-label", labels[l]),
        ...top.ids.map((id, n) => {
          const c = make(
            "span",
            "gptlib-play-lens-tok",
            `${show(tokenStr(id))} ${top.probs[n].toFixed(2)}`,
          );
          c.style.setProperty("--p", String(top.probs[n]));
          return c;
        }),
      );
      return r;
    }),
  );
}

const OUT = " (outside the model's window)";

// One token of the context as a span: position i, those drawn after the prompt marked "new",
// those before the model's window (`first`) dimmed.
function tokenSpan(p, id, i, first) {
  const { live, promptIds } = p;
  const s = make(
    "span",
    `gptlib-play-tok${i >= promptIds.length ? " new" : ""}${i < first ? " out" : ""}`,
    show(p.tokenStr(id)),
  );
  s.title =
    `token ${i}: id ${id}` +
    (live
      ? `, bytes ${Array.from(live.bytes[id], (b) => b.toString(16).padStart(2, "0")).join(" ")}`
      : "") +
    (i < first ? OUT : "");
  return s;
}

// The tokens row of `ctx` drawn whole, or (`grow`: a run of draws, a click's new token) only its
// new tokens appended to the row drawn before, when that row is a prefix of this one
// (p.tokensDrawn: the spans drawn, for which prompt and path, and their ids), and the tokens
// that left the model's window dimmed.
function tokenRow(p, ctx, first, grow) {
  const { v, promptIds, path } = p,
    d = p.tokensDrawn,
    nCtx = p.cfg.n_ctx;
  const count =
    `${promptIds.length} token(s)${path.length ? ` + ${path.length} drawn` : ""}` +
    `${first ? `; the model sees the last ${nCtx}` : ""}: `;
  const prefix =
    grow &&
    d?.prompt === promptIds &&
    d.path === path &&
    d.spans.length <= ctx.length &&
    d.spans.length > 0 &&
    d.spans.every((_s, i) => d.ids[i] === ctx[i]); // an undo and new draws change the path
  if (!prefix) {
    const spans = ctx.map((id, i) => tokenSpan(p, id, i, first));
    const head = make("span", "gptlib-play-count", count);
    v.tokenRow.replaceChildren(head, ...spans);
    p.tokensDrawn = { prompt: promptIds, path, ids: ctx, spans, first, head };
    return;
  }
  for (let i = d.first; i < Math.min(first, d.spans.length); i++) {
    d.spans[i].classList.add("out");
    d.spans[i].title += OUT;
  }
  const added = ctx
    .slice(d.spans.length)
    .map((id, k) => tokenSpan(p, id, d.spans.length + k, first));
  v.tokenRow.append(...added);
  d.spans.push(...added);
  d.head.textContent = count;
  Object.assign(d, { ids: ctx, first });
}

// The context's tokens (those outside the model's window dimmed) and the text they decode to;
// `grow`: only the tokens added since the last drawing are drawn, where the tokens drawn are
// still the first ones (a run of draws, a click).
export function drawTokens(p, grow = false) {
  const { v, live, promptIds, path } = p,
    nCtx = p.cfg.n_ctx;
  const ctx = promptIds.concat(path),
    first = ctx.length - Math.min(ctx.length, nCtx);
  tokenRow(p, ctx, first, grow);
  if (live) {
    const all = decodeBytes(live.bytes, ctx),
      head = decodeBytes(live.bytes, promptIds);
    const cont = all.startsWith(head) ? all.slice(head.length) : decodeBytes(live.bytes, path);
    v.out.replaceChildren(
      make("span", "gptlib-samp-ctx", head),
      make("span", "gptlib-samp-new", cont),
    );
  } else {
    v.out.replaceChildren(make("span", "gptlib-samp-ctx", v.box.value));
  }
}

// The tokens of the analysis shown, most probable first (byLogit), sorted once per analysis: the
// chart's two distributions and a draw share it.
export const logitOrder = (current) => {
  if (!current.order) current.order = byLogit(current.logits);
  return current.order;
};

// The next-token distribution under the sliders' settings.
export function drawDistribution(p) {
  const { v, current } = p;
  if (!current) return;
  const { T, k, tp } = p.settings();
  v.controls.show(T, k, tp);
  const order = logitOrder(current);
  const d = distribution(current.logits, T, k, tp, restLogZAt(current.rest, T), order),
    g = distribution(current.logits, 1, 0, 1, restLogZAt(current.rest, 1), order);
  const V = current.logits.length,
    kept = d.p.filter((p) => p > 0).length;
  v.stats.textContent = !current.rest
    ? `entropy ${entropy(d.p).toFixed(3)} nats; ${kept} of the ${V} tokens can be drawn`
    : `stored: the ${kept} most probable of the ${V} tokens (start the live model for all of them)`;
  const { rows, other } = chartRows(d, g, p.model.get("n_show"), (id) => p.tokenStr(id), V);
  drawChart(v.chart, rows, other, tp);
  report(v.root, { settings: { temperature: T, top_k: k, top_p: tp } }, { probs: d.p });
}

// The heads' direct contributions to the chosen token's logit, and the heads ablated.
export function drawCircuits(p) {
  const { v, current, cfg } = p;
  const abl = p.ablated();
  v.ablation.textContent = abl.length
    ? `ablated: ${abl.map(([l, h]) => `L${l}.H${h}`).join(", ")}`
    : "no head ablated";
  v.restoreBtn.disabled = !abl.length || p.busy;
  if (!current?.direct) {
    v.direct.textContent = "";
    return;
  }
  const top = largestDirect(current.direct, cfg.n_heads, 5);
  v.direct.textContent =
    `Direct contribution of each head to the logit of "${show(p.tokenStr(current.target))}" ` +
    "(the head's output through the final norm, its scale frozen, and W_U): largest " +
    top.map(([d, l, h]) => `L${l}.H${h} ${d >= 0 ? "+" : ""}${d.toFixed(2)}`).join(", ") +
    ".";
}

// The heads: every pattern with its scores (and the direct contributions, when computed).
export function drawHeads(p) {
  const { current, cfg } = p;
  const { n_layers: L, n_heads: H } = cfg;
  const pos = current.positions || null; // the heads panel's window of the context (rows.js)
  const ids = pos ? pos.map((i) => current.window[i]) : current.window;
  const scores = headScores(current.patterns, ids, pos, current.total);
  if (current.direct) {
    scores.push({
      name: "direct",
      values: [...Array(L).keys()].map((l) =>
        Array.from(current.direct.subarray(l * H, (l + 1) * H)),
      ),
      uniform: null,
      meaning: `to the logit of "${show(p.tokenStr(current.target))}"`,
    });
  }
  p.panel.update({
    tokens: ids.map((id) => p.tokenStr(id)),
    positions: pos,
    entropy: current.entropy || null,
    patterns: current.patterns,
    layerLabels: p.layerLabels,
    headLabels: p.headLabels,
    scores,
    groups: p.groups,
    mask: p.mask,
  });
}

export function draw(p, heads = true) {
  const { v, current } = p;
  const t0 = performance.now();
  drawTokens(p, true);
  if (!current) return;
  drawDistribution(p);
  drawLens(v.lens, current.lens, p.lensLabels, (id) => p.tokenStr(id));
  drawCircuits(p);
  const t1 = performance.now();
  if (heads) drawHeads(p);
  report(
    v.root,
    {
      drawMs: `${(t1 - t0).toFixed(1)}+${(performance.now() - t1).toFixed(1)}`,
      ids: p.promptIds.concat(p.path),
      window: current.window,
      path: p.path,
      draws: p.draws,
      lens: current.lens,
      target: current.target,
      ablated: p.ablated(),
    },
    {
      window: current.window,
      logits: current.logits,
      patterns: current.patterns,
      lens: current.lens,
      direct: current.direct,
      mask: p.mask,
    },
  );
}

// The buttons that need the live model, enabled when it is ready (also during a step: the
// reader's action then waits for it, see Playground.act; not during a run of draws).
export function enable(p) {
  const { v, live, busy } = p;
  const ready = !!live && !p.running && p.promptIds.length > 0;
  v.sampleBtn.disabled = v.greedyBtn.disabled = v.runBtn.disabled = !ready && !!live;
  v.undoBtn.disabled = v.resetBtn.disabled = !ready || p.path.length === 0;
  v.stopBtn.disabled = !p.running;
  v.restoreBtn.disabled = !ready || !p.ablated().length;
  report(v.root, { busy: busy ? "1" : "0" });
}
