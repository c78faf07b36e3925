// Playground (PlaygroundView): the book's GPT on the reader's own text. Before the live model
// starts, the page shows the analysis stored in the widget state. Started, it computes with one
// of the two backends of live.js (the kernel, or the page itself), and draws the same way with
// either.
import { button, lifetime, make, report, show, svg } from "./dom.js";
import { byLogit, chartKey, chartRows, distribution, drawChart, drawIndex, entropy, samplingControls,
  xorshift32 } from "./distribution.js";
import { attentionPanel, headScores } from "./heads.js";
import { browserBackend, kernelBackend, kernelLink, LiveError, staticBase, topTokens } from "./live.js";

// The view's elements: the text box and the live model's switch, the context's tokens and text,
// the sampling controls and chart, the logit lens, and every head (an attention panel).
function layout(model) {
  const v = {
    root: make("div", "gptlib-widget gptlib-play"),
    box: make("textarea", "gptlib-play-text"),
    startBtn: button("gptlib-play-start", "start the live model"),
    status: make("div", "gptlib-play-status"),
    tokenRow: make("div", "gptlib-play-tokens"),
    out: make("div", "gptlib-samp-text gptlib-play-out"),
    controls: samplingControls(Math.max(100, model.get("top_k"))),
    seedBox: make("input", "gptlib-play-seed"),
    sampleBtn: button("gptlib-samp-step", "sample next token"),
    greedyBtn: button("gptlib-play-greedy", "greedy"),
    undoBtn: button("gptlib-samp-undo", "undo"),
    resetBtn: button("gptlib-samp-reset", "reset"),
    msg: make("div", "gptlib-samp-msg"),
    stats: make("div", "gptlib-samp-stats"),
    chart: svg("svg", { class: "gptlib-samp-chart" }),
    lens: make("div", "gptlib-play-lens"),
    heads: make("div", "gptlib-play-heads"),
  };
  v.box.rows = 3;
  v.box.spellcheck = false;
  v.box.value = model.get("text");
  v.box.setAttribute("aria-label", "text for the model");
  Object.assign(v.seedBox, { type: "number", min: "0", max: "4294967295", step: "1", value: String(model.get("seed")) });
  const startRow = make("div", "gptlib-controls");
  startRow.append(v.startBtn, v.status);
  const seedLabel = make("label", "gptlib-play-seed-label");
  seedLabel.append("seed ", v.seedBox);
  const buttons = make("div", "gptlib-controls");
  buttons.append(v.sampleBtn, v.greedyBtn, v.undoBtn, v.resetBtn, seedLabel);
  const section = (text) => make("div", "gptlib-play-section", text);
  v.root.append(make("div", "gptlib-title", model.get("title")), v.box, startRow, v.tokenRow, v.out,
                section("Next token"), ...v.controls.rows, buttons, v.msg, v.stats, v.chart, chartKey(),
                section("Logit lens: the next token read off the residual stream after each block (LN_f, then W_U; temperature 1)"), v.lens,
                section("Every head on this text"), v.heads);
  return v;
}

// The text of token ids from their bytes: invalid bytes become U+FFFD, as in
// BPETokenizer.decode; a leading U+FEFF is text, not a mark.
function decodeBytes(bytes, ids) {
  const parts = ids.map((i) => bytes[i]);
  const all = new Uint8Array(parts.reduce((s, b) => s + b.length, 0));
  let at = 0;
  parts.forEach((b) => { all.set(b, at); at += b.length; });
  return new TextDecoder("utf-8", { ignoreBOM: true }).decode(all);
}

// The analysis of a context from a backend's flat arrays: patterns[l][h][i] as rows of T weights,
// and the lens as the top `lensTop` tokens after each block.
function fromLive(window, r, { n_layers: L, n_heads: H, d_vocab: V }, lensTop) {
  const T = window.length;
  const patterns = [...Array(L).keys()].map((l) => [...Array(H).keys()].map((h) =>
    [...Array(T).keys()].map((i) => r.patterns.subarray(((l * H + h) * T + i) * T, ((l * H + h) * T + i + 1) * T))));
  const lens = [...Array(L + 1).keys()].map((l) => topTokens(r.lens.subarray(l * V, (l + 1) * V), lensTop));
  return { window, logits: r.logits, patterns, lens, raw: r };
}

// The analysis stored in the widget state (made by Python for the view's text).
function fromStored(stored, nCtx) {
  return { window: stored.ids.slice(-nCtx), logits: stored.logits, patterns: stored.patterns, lens: stored.lens, raw: null };
}

// The logit lens: one row per residual stream, its top tokens shaded by probability.
function drawLens(box, lens, labels, tokenStr) {
  box.replaceChildren(...lens.map((top, l) => {
    const r = make("div", "gptlib-play-lens-row");
    r.append(make("span", "gptlib-play-lens-label", labels[l]), ...top.ids.map((id, n) => {
      const c = make("span", "gptlib-play-lens-tok", `${show(tokenStr(id))} ${top.probs[n].toFixed(2)}`);
      c.style.setProperty("--p", String(top.probs[n]));
      return c;
    }));
    return r;
  }));
}

// The view's state and what it does: what is shown, the live model, drawing and computing.
class Playground {
  constructor(model, v, life) {
    this.model = model;
    this.v = v;
    this.cfg = model.get("config");
    const { n_layers: L, n_heads: H } = this.cfg;
    this.storedTokens = model.get("tokens");
    this.layerLabels = [...Array(L).keys()].map((l) => `layer ${l}`);
    this.headLabels = [...Array(H).keys()].map((h) => `head ${h}`);
    this.lensLabels = ["embedding", ...[...Array(L).keys()].map((l) => `after block ${l + 1}`)];
    this.panel = attentionPanel(v.heads, {
      get: () => [model.get("layer"), model.get("head")],
      set: (layer, head) => { model.set("layer", layer); model.set("head", head); model.save_changes(); },
    });
    this.live = null;  // the backend, once started
    this.starting = null;  // the promise of starting it
    this.busy = false;
    this.startedAt = null;
    this.promptIds = model.get("stored").ids;
    this.path = [];  // the ids drawn after the prompt
    this.reseed(model.get("seed"));
    this.current = fromStored(model.get("stored"), this.cfg.n_ctx);  // the analysis shown
    this.cache = new Map();  // analyses by context, for undo
    this.ask = kernelLink(model);
    life.atEnd(() => this.ask.close());
    // Is a kernel listening? (Jupyter, Colab.) A static page never answers.
    this.kernelAnswered = false;
    this.kernel = this.ask({ kind: "ping" }, 1500).then(() => (this.kernelAnswered = true), () => false);
  }

  reseed(seed) {
    this.rng = xorshift32(seed);
    this.draws = 0;
  }

  tokenStr(id) {
    return this.live ? this.live.tokens[id] : this.storedTokens[String(id)];
  }

  settings() {
    const m = this.model;
    return { T: m.get("temperature"), k: m.get("top_k"), tp: m.get("top_p") };
  }

  setStatus(text, state) {
    this.v.status.textContent = text;
    if (state) report(this.v.root, { live: state });
  }

  // --- drawing ----------------------------------------------------------------------------
  // The context's tokens (those outside the model's window dimmed) and the text they decode to.
  drawTokens() {
    const { v, live, promptIds, path } = this, nCtx = this.cfg.n_ctx;
    const ctx = promptIds.concat(path), first = ctx.length - Math.min(ctx.length, nCtx);
    v.tokenRow.replaceChildren(make("span", "gptlib-play-count",
      `${promptIds.length} token(s)` + (path.length ? ` + ${path.length} drawn` : "") + (first ? `; the model sees the last ${nCtx}` : "") + ": "),
    ...ctx.map((id, i) => {
      const s = make("span", "gptlib-play-tok" + (i >= promptIds.length ? " new" : "") + (i < first ? " out" : ""), show(this.tokenStr(id)));
      s.title = `token ${i}: id ${id}` + (live ? `, bytes ${Array.from(live.bytes[id], (b) => b.toString(16).padStart(2, "0")).join(" ")}` : "") +
        (i < first ? " (outside the model's window)" : "");
      return s;
    }));
    if (live) {
      const all = decodeBytes(live.bytes, ctx), head = decodeBytes(live.bytes, promptIds);
      const cont = all.startsWith(head) ? all.slice(head.length) : decodeBytes(live.bytes, path);
      v.out.replaceChildren(make("span", "gptlib-samp-ctx", v.box.value), make("span", "gptlib-samp-new", cont));
    } else {
      v.out.replaceChildren(make("span", "gptlib-samp-ctx", v.box.value));
    }
  }

  // The next-token distribution under the sliders' settings.
  drawDistribution() {
    const { v, current } = this;
    if (!current) return;
    const { T, k, tp } = this.settings();
    v.controls.show(T, k, tp);
    const d = distribution(current.logits, T, k, tp), g = distribution(current.logits, 1, 0, 1);
    const V = current.logits.length, kept = d.p.filter((p) => p > 0).length;
    v.stats.textContent = `entropy ${entropy(d.p).toFixed(3)} nats; ${kept} of the ${V} tokens can be drawn`;
    const { rows, other } = chartRows(d, g, this.model.get("n_show"), (id) => this.tokenStr(id), V);
    drawChart(v.chart, rows, other, tp);
    report(v.root, { settings: { temperature: T, top_k: k, top_p: tp } }, { probs: d.p });
  }

  draw() {
    const { v, current } = this;
    const t0 = performance.now();
    this.drawTokens();
    if (!current) return;
    this.drawDistribution();
    drawLens(v.lens, current.lens, this.lensLabels, (id) => this.tokenStr(id));
    const t1 = performance.now();
    this.panel.update({ tokens: current.window.map((id) => this.tokenStr(id)), patterns: current.patterns,
                        layerLabels: this.layerLabels, headLabels: this.headLabels,
                        scores: headScores(current.patterns, current.window) });
    report(v.root, {
      drawMs: `${(t1 - t0).toFixed(1)}+${(performance.now() - t1).toFixed(1)}`, ids: this.promptIds.concat(this.path),
      window: current.window, path: this.path, draws: this.draws, lens: current.lens,
    }, {
      window: current.window, logits: current.logits, patterns: current.raw ? current.raw.patterns : null,
      lensRaw: current.raw ? current.raw.lens : null, lens: current.lens,
    });
  }

  // The buttons that need the live model, enabled when it is ready.
  enable() {
    const { v, live, busy } = this;
    const ready = !!live && !busy && this.promptIds.length > 0;
    v.sampleBtn.disabled = v.greedyBtn.disabled = !ready && !!live;
    v.undoBtn.disabled = v.resetBtn.disabled = !ready || this.path.length === 0;
    report(v.root, { busy: busy ? "1" : "0" });
  }

  // --- computing --------------------------------------------------------------------------
  // The analysis of the context (computed, or from the cache), then drawn.
  async run() {
    const { v } = this, ctx = this.promptIds.concat(this.path);
    if (!ctx.length) {  // nothing to compute on: clear what belonged to the last text
      v.msg.textContent = "Type some text: the model needs at least one token.";
      this.current = null;
      [v.stats, v.chart, v.lens].forEach((e) => e.replaceChildren());
      v.heads.style.display = "none";
      this.drawTokens();
      return;
    }
    v.heads.style.display = "";
    const window = ctx.slice(-this.cfg.n_ctx);  // past n_ctx the window slides, as gptlib.sampling.generate does
    const key = window.join(",");
    let a = this.cache.get(key);
    if (!a) {
      const t0 = performance.now();
      const r = await this.live.forward(window);
      const ms = performance.now() - t0;
      a = fromLive(window, r, this.cfg, this.model.get("lens_top"));
      report(v.root, { ms: ms.toFixed(1) });
      if (this.cache.size > 64) this.cache.delete(this.cache.keys().next().value);
      this.cache.set(key, a);
      this.setStatus(`live: ${this.live.describe}; last forward pass ${ms.toFixed(0)} ms`);
    }
    this.current = a;
    this.draw();
    if (this.startedAt !== null) {  // the time from "start" to the first result drawn
      report(v.root, { firstMs: (performance.now() - this.startedAt).toFixed(0) });
      this.startedAt = null;
    }
  }

  // One action of the reader at a time; a failure is said in the message line.
  async act(f) {
    if (this.busy) return;
    this.busy = true;
    this.enable();
    const t0 = performance.now();
    try {
      await f();
      report(this.v.root, { actMs: (performance.now() - t0).toFixed(1) });  // forward pass and drawing
    } catch (e) {
      this.v.msg.textContent = `The live model failed: ${e.message}`;
      report(this.v.root, { error: e.message });
    } finally {
      this.busy = false;
      this.enable();
    }
  }

  // The backend: the kernel if it answered; else the page, when it is served over http with the
  // book's files; else wait for the kernel's answer (the page's own error says why it cannot).
  async backend() {
    const inPage = () => browserBackend(this.model.get("source"), this.model.get("weights_sha256"),
                                        (s) => this.setStatus(`starting the live model: ${s}\u2026`));
    if (this.kernelAnswered) return kernelBackend(this.ask);
    if (staticBase() && location.protocol !== "file:") return inPage();
    return (await this.kernel) ? kernelBackend(this.ask) : inPage();
  }

  // Starts the live model once; true when it runs.
  start() {
    if (this.live) return Promise.resolve(true);
    if (!this.starting) this.starting = this.startOnce();
    return this.starting;
  }

  async startOnce() {
    const { v } = this;
    v.startBtn.disabled = true;
    this.setStatus("starting the live model\u2026", "starting");
    const t0 = performance.now();
    this.startedAt = t0;
    try {
      this.live = await this.backend();
      // The tokenizer and decoder in use, for tests.
      report(v.root, { startMs: (performance.now() - t0).toFixed(0) },
             { encode: this.live.encode, decode: (ids) => decodeBytes(this.live.bytes, ids) });
      v.startBtn.style.display = "none";
      this.setStatus(`live: ${this.live.describe}`, this.live.kind);
      return true;
    } catch (e) {
      this.setStatus(e instanceof LiveError ? e.message : `The live model could not start: ${e.message}`, "failed");
      report(v.root, { error: e.message });
      v.startBtn.disabled = false;
      this.starting = this.startedAt = null;
      return false;
    }
  }

  // The text box's text, encoded and analysed; the drawn tokens and the seed start over.
  async retext() {
    if (!(await this.start())) return;
    this.promptIds = await this.live.encode(this.v.box.value);
    this.path = [];
    this.reseed(this.model.get("seed"));
    this.v.msg.textContent = "";
    await this.run();
  }

  // One more token: the most probable (greedy), or a seeded draw under the sliders' settings.
  async drawNext(greedy) {
    if (!(await this.start())) return;
    const { current } = this;
    if (!current || !this.promptIds.length) return;
    let id;
    if (greedy) {
      id = byLogit(current.logits)[0];
    } else {
      const { T, k, tp } = this.settings();
      const d = distribution(current.logits, T, k, tp);
      const u = this.rng();
      this.draws += 1;
      id = drawIndex(d.p, d.order, u);
      report(this.v.root, { u });
    }
    this.path.push(id);
    this.v.msg.textContent = "";
    await this.run();
  }

  async restart(seed) {
    this.path = [];
    this.reseed(seed);
    this.v.msg.textContent = "";
    if (this.live) await this.run();
  }
}

// The reader's controls and the model's changes, wired to the playground `p`.
function listen(p, v, model, life) {
  let typing = null;
  life.atEnd(() => clearTimeout(typing));
  v.box.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      model.set("text", v.box.value);
      model.save_changes();
      p.act(() => p.retext());
    }, 250);
  });
  const startAndRetext = () => p.act(async () => { if (await p.start()) await p.retext(); });
  v.startBtn.addEventListener("click", startAndRetext);
  v.sampleBtn.addEventListener("click", () => p.act(() => p.drawNext(false)));
  v.greedyBtn.addEventListener("click", () => p.act(() => p.drawNext(true)));
  v.undoBtn.addEventListener("click", () => p.act(async () => { p.path.pop(); v.msg.textContent = ""; await p.run(); }));
  v.resetBtn.addEventListener("click", () => p.act(() => p.restart(model.get("seed"))));
  v.seedBox.addEventListener("change", () => {
    const s = Number(v.seedBox.value);
    if (!/^\s*\d+\s*$/.test(v.seedBox.value) || s >= 2 ** 32) { v.seedBox.value = String(model.get("seed")); v.msg.textContent = `The seed must be a whole number from 0 to 4294967295: it stays ${model.get("seed")}.`; return; }
    model.set("seed", s);
    model.save_changes();
    p.act(() => p.restart(s));
  });
  v.controls.onInput((name, value) => { model.set(name, value); model.save_changes(); p.drawDistribution(); });
  ["temperature", "top_k", "top_p", "n_show"].forEach((n) => life.on(`change:${n}`, () => p.drawDistribution()));
  life.on("change:layer", p.panel.redraw);
  life.on("change:head", p.panel.redraw);
  life.on("change:text", () => {  // set from Python, in a kernel
    if (v.box.value === model.get("text")) return;
    v.box.value = model.get("text");
    if (p.live) p.act(() => p.retext());
  });
  return startAndRetext;
}

function render({ model, el }) {
  const life = lifetime(model);
  const v = layout(model);
  el.appendChild(v.root);
  const p = new Playground(model, v, life);
  const startAndRetext = listen(p, v, model, life);
  // The stored analysis until the reader starts the live model; in a kernel, start at once.
  p.setStatus("This is the stored analysis of the text above. Start the live model to edit the text and to sample: " +
              "the page then runs the model itself (or the kernel does, in Jupyter and Colab).", "off");
  p.draw();
  p.enable();
  let closed = false;
  life.atEnd(() => { closed = true; });
  p.kernel.then((yes) => { if (yes && !closed) startAndRetext(); });
  return () => { life.end(); v.root.remove(); };
}

export default { render };
