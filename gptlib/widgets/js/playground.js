// Playground (PlaygroundView): a GPT (the book's English model, or SmolLM2 with its chat
// template) on the reader's own text. Before the live model starts, the page shows the analysis
// stored in the widget state. Started, it computes with one of the two backends of live.js (the
// kernel, or the page itself), and draws the same way with either: the tokens, the next-token
// distribution and seeded draws (one at a time, or a run of up to N with a stop button), the logit
// lens, every head with its scores, a head mask (a click ablates a head) and each head's direct
// contribution to the logit of the chosen token.
import { button, lifetime, make, report, show, svg } from "./dom.js";
import {
  byLogit,
  chartKey,
  chartRows,
  distribution,
  drawChart,
  drawIndex,
  entropy,
  samplingControls,
  xorshift32,
} from "./distribution.js";
import { attentionPanel, headScores } from "./heads.js";
import {
  browserBackend,
  fromStored,
  kernelBackend,
  kernelLink,
  largestDirect,
  LiveError,
  megabytes,
  staticBase,
} from "./live.js";

// The view's elements: the text box and the live model's switch, the context's tokens and text,
// the sampling controls and chart, the logit lens, and every head (an attention panel).
function layout(model) {
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
  const label = (cls, ...parts) => {
    const l = make("label", cls);
    l.append(...parts);
    return l;
  };
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
    section(
      "Logit lens: the next token read off the residual stream after each block (the final norm, then W_U; temperature 1)",
    ),
    v.lens,
    section("Every head on this text"),
    ablateRow,
    v.direct,
    v.heads,
  );
  return v;
}

// The text of token ids from their bytes: invalid bytes become U+FFFD, as in
// BPETokenizer.decode; a leading U+FEFF is text, not a mark.
function decodeBytes(bytes, ids) {
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
    box.replaceChildren(make("div", "gptlib-play-lens-row", "(read when the run stops)"));
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

// The view's state and what it does: what is shown, the live model, drawing and computing.
class Playground {
  constructor(model, v, life) {
    this.model = model;
    this.v = v;
    this.cfg = model.get("config");
    const { n_layers: L, n_heads: H } = this.cfg;
    const G = this.cfg.n_kv_heads || H,
      per = H / G;
    this.storedTokens = model.get("tokens");
    this.layerLabels = [...Array(L).keys()].map((l) => `layer ${l}`);
    this.headLabels = [...Array(H).keys()].map((h) =>
      G < H ? `head ${h} (kv ${Math.floor(h / per)})` : `head ${h}`,
    );
    this.groups = G < H ? [...Array(H).keys()].map((h) => Math.floor(h / per)) : null;
    this.lensLabels = ["embedding", ...[...Array(L).keys()].map((l) => `after block ${l + 1}`)];
    this.mask = new Float32Array(L * H).fill(1);
    this.panel = attentionPanel(v.heads, {
      get: () => [model.get("layer"), model.get("head")],
      set: (layer, head) => {
        model.set("layer", layer);
        model.set("head", head);
        model.save_changes();
      },
      pick: (layer, head) => {
        if (!v.ablateBox.checked || !this.live) return false;
        this.act(() => this.toggleHead(layer, head));
        return true;
      },
    });
    this.live = null; // the backend, once started
    this.starting = null; // the promise of starting it
    this.busy = false;
    this.running = false; // a run of draws, which the stop button ends
    this.stopAsked = false;
    this.startedAt = null;
    this.promptIds = model.get("stored").ids;
    this.path = []; // the ids drawn after the prompt
    this.reseed(model.get("seed"));
    this.current = fromStored(model.get("stored"), this.cfg); // the analysis shown
    this.ask = kernelLink(model);
    life.atEnd(() => this.ask.close());
    // Is a kernel listening? (Jupyter, Colab.) A static page never answers.
    this.kernelAnswered = false;
    this.kernel = this.ask({ kind: "ping" }, 1500).then(
      () => (this.kernelAnswered = true),
      () => false,
    );
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

  ablated() {
    const H = this.cfg.n_heads,
      out = [];
    this.mask.forEach((m, k) => {
      if (m !== 1) out.push([Math.floor(k / H), k % H]);
    });
    return out;
  }

  // --- drawing ----------------------------------------------------------------------------
  // The context's tokens (those outside the model's window dimmed) and the text they decode to.
  drawTokens() {
    const { v, live, promptIds, path } = this,
      nCtx = this.cfg.n_ctx;
    const ctx = promptIds.concat(path),
      first = ctx.length - Math.min(ctx.length, nCtx);
    v.tokenRow.replaceChildren(
      make(
        "span",
        "gptlib-play-count",
        `${promptIds.length} token(s)${path.length ? ` + ${path.length} drawn` : ""}${first ? `; the model sees the last ${nCtx}` : ""}: `,
      ),
      ...ctx.map((id, i) => {
        const s = make(
          "span",
          `gptlib-play-tok${i >= promptIds.length ? " new" : ""}${i < first ? " out" : ""}`,
          show(this.tokenStr(id)),
        );
        s.title =
          `token ${i}: id ${id}` +
          (live
            ? `, bytes ${Array.from(live.bytes[id], (b) => b.toString(16).padStart(2, "0")).join(" ")}`
            : "") +
          (i < first ? " (outside the model's window)" : "");
        return s;
      }),
    );
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

  // The next-token distribution under the sliders' settings.
  drawDistribution() {
    const { v, current } = this;
    if (!current) return;
    const { T, k, tp } = this.settings();
    v.controls.show(T, k, tp);
    const d = distribution(current.logits, T, k, tp, current.restLogZ),
      g = distribution(current.logits, 1, 0, 1, current.restLogZ);
    const V = current.logits.length,
      kept = d.p.filter((p) => p > 0).length;
    v.stats.textContent =
      current.restLogZ === null
        ? `entropy ${entropy(d.p).toFixed(3)} nats; ${kept} of the ${V} tokens can be drawn`
        : `stored: the ${kept} most probable of the ${V} tokens (start the live model for all of them)`;
    const { rows, other } = chartRows(d, g, this.model.get("n_show"), (id) => this.tokenStr(id), V);
    drawChart(v.chart, rows, other, tp);
    report(v.root, { settings: { temperature: T, top_k: k, top_p: tp } }, { probs: d.p });
  }

  // The heads' direct contributions to the chosen token's logit, and the heads ablated.
  drawCircuits() {
    const { v, current, cfg } = this;
    const abl = this.ablated();
    v.ablation.textContent = abl.length
      ? `ablated: ${abl.map(([l, h]) => `L${l}.H${h}`).join(", ")}`
      : "no head ablated";
    v.restoreBtn.disabled = !abl.length || this.busy;
    if (!current?.direct) {
      v.direct.textContent = "";
      return;
    }
    const top = largestDirect(current.direct, cfg.n_heads, 5);
    v.direct.textContent =
      `Direct contribution of each head to the logit of "${show(this.tokenStr(current.target))}" ` +
      "(the head's output through the final norm, its scale frozen, and W_U): largest " +
      top.map(([d, l, h]) => `L${l}.H${h} ${d >= 0 ? "+" : ""}${d.toFixed(2)}`).join(", ") +
      ".";
  }

  // The heads: every pattern with its scores (and the direct contributions, when computed).
  drawHeads() {
    const { current, cfg } = this;
    const { n_layers: L, n_heads: H } = cfg;
    const scores = headScores(current.patterns, current.window);
    if (current.direct) {
      scores.push({
        name: "direct",
        values: [...Array(L).keys()].map((l) =>
          Array.from(current.direct.subarray(l * H, (l + 1) * H)),
        ),
        uniform: null,
        meaning: `to the logit of "${show(this.tokenStr(current.target))}"`,
      });
    }
    this.panel.update({
      tokens: current.window.map((id) => this.tokenStr(id)),
      patterns: current.patterns,
      layerLabels: this.layerLabels,
      headLabels: this.headLabels,
      scores,
      groups: this.groups,
      mask: this.mask,
    });
  }

  draw(heads = true) {
    const { v, current } = this;
    const t0 = performance.now();
    this.drawTokens();
    if (!current) return;
    this.drawDistribution();
    drawLens(v.lens, current.lens, this.lensLabels, (id) => this.tokenStr(id));
    this.drawCircuits();
    const t1 = performance.now();
    if (heads) this.drawHeads();
    report(
      v.root,
      {
        drawMs: `${(t1 - t0).toFixed(1)}+${(performance.now() - t1).toFixed(1)}`,
        ids: this.promptIds.concat(this.path),
        window: current.window,
        path: this.path,
        draws: this.draws,
        lens: current.lens,
        target: current.target,
        ablated: this.ablated(),
      },
      {
        window: current.window,
        logits: current.logits,
        patterns: current.patterns,
        lens: current.lens,
        direct: current.direct,
        mask: this.mask,
      },
    );
  }

  // The buttons that need the live model, enabled when it is ready.
  enable() {
    const { v, live, busy } = this;
    const ready = !!live && !busy && this.promptIds.length > 0;
    v.sampleBtn.disabled = v.greedyBtn.disabled = v.runBtn.disabled = !ready && !!live;
    v.undoBtn.disabled = v.resetBtn.disabled = !ready || this.path.length === 0;
    v.stopBtn.disabled = !this.running;
    v.restoreBtn.disabled = !ready || !this.ablated().length;
    report(v.root, { busy: busy ? "1" : "0" });
  }

  // --- computing --------------------------------------------------------------------------
  // The analysis of the context: `full` (a single action of the reader) adds the logit lens of
  // every stream and the heads' direct contributions to the most probable token's logit, at the
  // cost of running the last position again; a step of a run computes only what the run needs.
  async compute(full = true) {
    const { v, live } = this,
      ctx = this.promptIds.concat(this.path);
    if (!ctx.length) {
      // nothing to compute on: clear what belonged to the last text
      v.msg.textContent = "Type some text: the model needs at least one token.";
      this.current = null;
      for (const e of [v.stats, v.chart, v.lens, v.direct]) e.replaceChildren();
      v.heads.style.display = "none";
      this.drawTokens();
      return;
    }
    v.heads.style.display = "";
    const window = ctx.slice(-this.cfg.n_ctx); // past n_ctx the window slides, as gptlib.sampling.generate does
    const r = await live.run(window, { mask: this.mask });
    const a = {
      window,
      logits: r.logits,
      restLogZ: null,
      patterns: r.patterns,
      lens: null,
      direct: null,
      target: null,
      live: true,
    };
    let ms = r.ms;
    if (full) {
      a.target = byLogit(r.logits)[0];
      const s = await live.run(window, {
        mask: this.mask,
        lens: [...Array(this.cfg.n_layers + 1).keys()],
        targets: [a.target],
      });
      const n = this.model.get("lens_top");
      a.lens = s.lens.map((r) => ({ ids: r.ids.slice(0, n), probs: r.probs.slice(0, n) }));
      a.direct = s.direct;
      a.patterns = s.patterns;
      ms += s.ms;
    }
    report(v.root, { ms: r.ms.toFixed(1), fed: r.fed === undefined ? window.length : r.fed });
    this.setStatus(
      `live: ${live.describe}; last step ${r.ms.toFixed(0)} ms${full ? ` (${ms.toFixed(0)} ms with the lens)` : ""}`,
    );
    this.current = a;
    this.draw(full);
    if (this.startedAt !== null) {
      // the time from "start" to the first result drawn
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
      report(this.v.root, { actMs: (performance.now() - t0).toFixed(1) }); // computing and drawing
    } catch (e) {
      this.v.msg.textContent = `The live model failed: ${e.message}`;
      report(this.v.root, { error: e.message });
    } finally {
      this.busy = this.running = false;
      this.enable();
      this.drawCircuits();
    }
  }

  // The reader agrees to a large download (or not): a promise of true or false.
  confirmDownload(manifest) {
    const { v } = this;
    return new Promise((resolve) => {
      const yes = button(
        "gptlib-play-confirm-yes",
        `download ${megabytes(manifest.download_bytes)}`,
      );
      const no = button("gptlib-play-confirm-no", "not now");
      const done = (ok) => {
        v.confirm.replaceChildren();
        resolve(ok);
      };
      yes.addEventListener("click", () => {
        this.startedAt = performance.now(); // the time to the first result counts from here
        done(true);
      });
      no.addEventListener("click", () => done(false));
      v.confirm.replaceChildren(
        make(
          "span",
          "",
          `${manifest.name} runs in this page after a download of ` +
            `${megabytes(manifest.download_bytes)} (the model in ${manifest.onnx.pieces.length} piece(s) and its tokenizer); ` +
            "the tab then holds its weights unpacked to 32-bit floats. ",
        ),
        yes,
        no,
      );
      report(v.root, { confirm: String(manifest.download_bytes) });
    });
  }

  // The backend: the kernel if it answered; else the page, when it is served over http with the
  // book's files; else wait for the kernel's answer (the page's own error says why it cannot).
  async backend() {
    const { v } = this;
    const inPage = () =>
      browserBackend(this.model.get("source"), this.model.get("weights_sha256"), {
        progress: (s, f) => {
          this.setStatus(`starting the live model: ${s}\u2026`);
          if (f !== null && f !== undefined) {
            v.progress.style.display = "";
            v.progress.value = f;
          }
        },
        confirm: (m) => this.confirmDownload(m),
      });
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
      const mem = this.live.memory();
      // The tokenizer and decoder in use, for tests.
      report(
        v.root,
        { startMs: (performance.now() - t0).toFixed(0), memory: mem ? mem.bytes : "unknown" },
        {
          encode: this.live.encode,
          decode: (ids) => decodeBytes(this.live.bytes, ids),
          backend: this.live,
        },
      );
      v.startBtn.style.display = v.progress.style.display = "none";
      v.chatLabel.style.display = this.live.chat ? "" : "none";
      this.memoryNote =
        this.live.kind === "kernel"
          ? ""
          : mem
            ? ` The tab's ${mem.what} holds ${megabytes(mem.bytes)}.`
            : " This browser does not say how much memory the tab uses.";
      this.setStatus(`live: ${this.live.describe}.${this.memoryNote}`, this.live.kind);
      return true;
    } catch (e) {
      this.setStatus(
        e instanceof LiveError ? e.message : `The live model could not start: ${e.message}`,
        "failed",
      );
      report(v.root, { error: e.message });
      v.startBtn.disabled = false;
      v.progress.style.display = "none";
      this.starting = this.startedAt = null;
      return false;
    }
  }

  // The text box's text (in the chat template when the switch is on), encoded and analysed; the
  // drawn tokens and the seed start over.
  async retext() {
    if (!(await this.start())) return;
    const chat = this.v.chatBox.checked && this.live.chat;
    const text = chat ? chat.prefix + this.v.box.value + chat.suffix : this.v.box.value;
    this.promptIds = await this.live.encode(text);
    this.path = [];
    this.reseed(this.model.get("seed"));
    this.v.msg.textContent = "";
    await this.compute();
  }

  // The next token from the analysis shown: the most probable (greedy), or a seeded draw under
  // the sliders' settings.
  pick(greedy) {
    const { current } = this;
    if (greedy) return byLogit(current.logits)[0];
    const { T, k, tp } = this.settings();
    const d = distribution(current.logits, T, k, tp);
    const u = this.rng();
    this.draws += 1;
    report(this.v.root, { u });
    return drawIndex(d.p, d.order, u);
  }

  // True when `id` ends the model's answer (a stop id of the chat template, with the switch on).
  stops(id) {
    const chat = this.v.chatBox.checked && this.live.chat;
    return !!chat && chat.stop.includes(id);
  }

  // One more token, drawn from the live model's analysis.
  async drawNext(greedy) {
    if (!(await this.start())) return;
    if (!this.current?.live) await this.retext(); // the stored analysis is not the model's
    if (!this.current || !this.promptIds.length) return;
    const id = this.pick(greedy);
    this.path.push(id);
    this.v.msg.textContent = this.stops(id)
      ? `The model ended its answer (${show(this.tokenStr(id))}).`
      : "";
    await this.compute();
  }

  // A run of up to n draws (greedy or seeded), each step computing only the logits and the
  // attention rows; the stop button, or a stop id in chat mode, ends it; then the lens.
  async generate(n, greedy) {
    if (!(await this.start())) return;
    if (!this.current?.live) await this.retext();
    if (!this.current || !this.promptIds.length) return;
    this.running = true;
    this.stopAsked = false;
    this.enable();
    const t0 = performance.now();
    let steps = 0,
      stopped = "";
    try {
      while (steps < n) {
        if (this.stopAsked) {
          stopped = "stopped";
          break;
        }
        const id = this.pick(greedy);
        this.path.push(id);
        steps += 1;
        if (this.stops(id)) {
          stopped = `the model ended its answer (${show(this.tokenStr(id))})`;
          break;
        }
        if (steps < n) {
          await this.compute(false);
          await new Promise((r) => setTimeout(r, 0)); // let the page draw and the stop button act
        }
      }
    } finally {
      this.running = false;
      this.enable();
    }
    await this.compute();
    const per = (performance.now() - t0) / Math.max(1, steps);
    this.v.msg.textContent = `${steps} token(s) drawn${stopped ? `; ${stopped}` : ""} (${per.toFixed(0)} ms a token, drawing included).`;
    report(this.v.root, { runSteps: steps, runMs: per.toFixed(1) });
  }

  async toggleHead(layer, head) {
    const k = layer * this.cfg.n_heads + head;
    this.mask[k] = this.mask[k] === 1 ? 0 : 1;
    await this.compute();
  }

  async restoreHeads() {
    this.mask.fill(1);
    await this.compute();
  }

  async restart(seed) {
    this.path = [];
    this.reseed(seed);
    this.v.msg.textContent = "";
    if (this.live) await this.compute();
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
  v.chatBox.addEventListener("change", () => {
    model.set("chat", v.chatBox.checked);
    model.save_changes();
    if (p.live) p.act(() => p.retext());
  });
  const startAndRetext = () =>
    p.act(async () => {
      if (await p.start()) await p.retext();
    });
  v.startBtn.addEventListener("click", startAndRetext);
  v.sampleBtn.addEventListener("click", () => p.act(() => p.drawNext(false)));
  v.greedyBtn.addEventListener("click", () => p.act(() => p.drawNext(true)));
  v.runBtn.addEventListener("click", () => {
    const n = Number(v.runN.value);
    if (!Number.isInteger(n) || n < 1 || n > 1000) {
      v.msg.textContent = "The number of tokens to generate must be a whole number from 1 to 1000.";
      v.runN.value = String(model.get("n_generate"));
      return;
    }
    p.act(() => p.generate(n, v.runGreedy.checked));
  });
  v.stopBtn.addEventListener("click", () => {
    p.stopAsked = true;
  });
  v.undoBtn.addEventListener("click", () =>
    p.act(async () => {
      p.path.pop();
      v.msg.textContent = "";
      await p.compute();
    }),
  );
  v.resetBtn.addEventListener("click", () => p.act(() => p.restart(model.get("seed"))));
  v.restoreBtn.addEventListener("click", () => p.act(() => p.restoreHeads()));
  v.seedBox.addEventListener("change", () => {
    const s = Number(v.seedBox.value);
    if (!/^\s*\d+\s*$/.test(v.seedBox.value) || s >= 2 ** 32) {
      v.seedBox.value = String(model.get("seed"));
      v.msg.textContent = `The seed must be a whole number from 0 to 4294967295: it stays ${model.get("seed")}.`;
      return;
    }
    model.set("seed", s);
    model.save_changes();
    p.act(() => p.restart(s));
  });
  v.controls.onInput((name, value) => {
    model.set(name, value);
    model.save_changes();
    p.drawDistribution();
  });
  for (const n of ["temperature", "top_k", "top_p", "n_show"]) {
    life.on(`change:${n}`, () => p.drawDistribution());
  }
  life.on("change:layer", p.panel.redraw);
  life.on("change:head", p.panel.redraw);
  life.on("change:text", () => {
    // set from Python, in a kernel
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
  p.setStatus(
    "This is the stored analysis of the text above. Start the live model to edit the text and to sample: " +
      "the page then runs the model itself (or the kernel does, in Jupyter and Colab).",
    "off",
  );
  p.draw();
  p.enable();
  let closed = false;
  life.atEnd(() => {
    closed = true;
  });
  p.kernel.then((yes) => {
    if (yes && !closed) startAndRetext();
  });
  return () => {
    life.end();
    v.root.remove();
  };
}

export default { render };
