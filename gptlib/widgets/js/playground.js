// Playground (PlaygroundView): a GPT (the book's English model, or SmolLM2 with its chat
// template) on the reader's own text. Before the live model starts, the page shows the analysis
// stored in the widget state. Started, it computes with one of the two backends of live.js (the
// kernel, or the page itself), and draws the same way with either: the tokens, the next-token
// distribution and seeded draws (one at a time, or a run of up to N with a stop button), the logit
// lens, every head with its scores, a head mask (a click ablates a head), each head's direct
// contribution to the logit of the chosen token, and one head step by step (playground_head.js).
import { fromStored } from "./analysis.js";
import { button, lifetime, make, parseSeed, report, show } from "./dom.js";
import { distribution, drawIndex, xorshift32 } from "./distribution.js";
import { attentionPanel } from "./heads.js";
import { connect, megabytes, startError, tabNeeds } from "./live.js";
import {
  decodeBytes,
  draw,
  drawCircuits,
  drawDistribution,
  drawTokens,
  enable,
  layout,
  logitOrder,
} from "./playground_draw.js";
import { mountHeadPanel } from "./playground_head.js";

// During a run of draws, the text and the distribution are drawn every this many tokens (only
// the tokens added since are drawn, and nothing while the view is off the screen); the rest of
// the views once, at the end.
const RUN_DRAW_EVERY = 8;

// The first index of the largest logit (what byLogit puts first), in one pass.
function argmax(logits) {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
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
    this.queued = null; // the reader's latest action while another ran
    this.running = false; // a run of draws, which the stop button ends
    this.stopAsked = false;
    this.onScreen = true; // some of the view is on the screen (watched in render)
    this.startedAt = null;
    this.promptIds = model.get("stored").ids;
    this.path = []; // the ids drawn after the prompt
    this.reseed(model.get("seed"));
    this.current = fromStored(model.get("stored"), this.cfg); // the analysis shown
    this.link = connect(model); // the live model: the kernel's, or the page's (shared)
    life.atEnd(() => {
      this.panel.close();
      this.link.close();
    });
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

  // --- computing --------------------------------------------------------------------------
  // The analysis of the context, one step of the model: `full` (a single action of the reader)
  // adds what the open panels show, at the last position: the logit lens of every stream when
  // its panel is open; every head's attention rows and direct contribution to the most probable
  // token's logit when the heads' panel is open. A step of a run (`full` false) computes the
  // logits, and the new attention rows when the heads' panel is open, which the backend keeps
  // (so that the run's end need not feed its tokens again for them: 40 tokens took 0.4 s for
  // SmolLM2); it draws nothing (the run draws every few tokens) and returns the step's time.
  async compute(full = true) {
    const { v, live } = this,
      ctx = this.promptIds.concat(this.path);
    if (!ctx.length) {
      // nothing to compute on: clear what belonged to the last text
      v.msg.textContent = "Type some text: the model needs at least one token.";
      this.current = null;
      for (const e of [v.stats, v.chart, v.lens, v.direct]) e.replaceChildren();
      v.heads.style.display = "none";
      drawTokens(this);
      return;
    }
    v.heads.style.display = "";
    const window = ctx.slice(-this.cfg.n_ctx); // past n_ctx the window slides, as gptlib.sampling.generate does
    const lensOn = full && v.lensPanel.open,
      headsOn = full && v.headsPanel.open;
    const r = await live.run(window, {
      mask: this.mask,
      lens: lensOn ? [...Array(this.cfg.n_layers + 1).keys()] : null,
      targets: headsOn ? [-1] : null, // -1: the step's most probable token
      rows: v.headsPanel.open,
      patterns: full,
    });
    const n = this.model.get("lens_top");
    this.current = {
      window,
      logits: r.logits,
      rest: null,
      patterns: r.patterns,
      total: r.total || null, // sums of patterns[l][h][i][j], read where the backend keeps them
      positions: r.positions, // the heads panel's window (rows.js)
      entropy: r.entropy,
      lens: r.lens
        ? r.lens.map((t) => ({ ids: t.ids.slice(0, n), probs: t.probs.slice(0, n) }))
        : null,
      direct: r.direct,
      target: headsOn ? argmax(r.logits) : null,
      live: true,
    };
    report(v.root, { ms: r.ms.toFixed(1), fed: r.fed === undefined ? window.length : r.fed });
    if (!full) return r.ms;
    const shown = [lensOn && "the lens", headsOn && "the heads"].filter(Boolean);
    this.setStatus(
      `live: ${live.describe}; last step ${r.ms.toFixed(0)} ms (${shown.length ? `with ${shown.join(" and ")}` : "bare"})`,
    );
    draw(this, headsOn);
    await this.head?.compute(); // one head, step by step, when its panel is open
    if (this.startedAt !== null) {
      // the time from "start" to the first result drawn
      report(v.root, { firstMs: (performance.now() - this.startedAt).toFixed(0) });
      this.startedAt = null;
    }
  }

  // One action of the reader at a time: one that comes during another waits, and only the latest
  // that came waits (it supersedes those before it); a failure is said in the message line, a
  // kernel that does not answer in the status line too.
  async act(f) {
    if (this.busy) {
      this.queued = f;
      return;
    }
    this.busy = true;
    enable(this);
    const t0 = performance.now();
    try {
      await f();
      report(this.v.root, { actMs: (performance.now() - t0).toFixed(1) }); // computing and drawing
      // and to the frame that shows it drawn: the browser's style, layout and paint after the
      // script (a callback before the next frame, then a task after it)
      globalThis.requestAnimationFrame?.(() =>
        setTimeout(() => report(this.v.root, { shownMs: (performance.now() - t0).toFixed(1) })),
      );
    } catch (e) {
      this.v.msg.textContent = `The live model failed: ${e.message}`;
      if (e.timeout) this.setStatus(`live: ${this.live.describe}; ${e.message}.`, "timeout");
      report(this.v.root, { error: e.message });
    } finally {
      this.busy = this.running = false;
      enable(this);
      drawCircuits(this);
    }
    const next = this.queued;
    this.queued = null;
    if (next) await this.act(next);
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
            `the tab then needs about ${megabytes(tabNeeds(manifest))} of memory (its weights unpacked to 32-bit floats). `,
        ),
        yes,
        no,
      );
      report(v.root, { confirm: String(manifest.download_bytes) });
    });
  }

  // The backend (live.js's connect): the page's progress and the reader's consent go to this view.
  backend() {
    const { v } = this;
    return this.link.backend({
      progress: (s, f) => {
        this.setStatus(`starting the live model: ${s}\u2026`);
        if (f !== null && f !== undefined) {
          v.progress.style.display = "";
          v.progress.value = f;
        }
      },
      confirm: (m) => this.confirmDownload(m),
    });
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
      this.setStatus(startError(e), "failed");
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
    this.encoded = this.textKey();
    this.path = [];
    this.reseed(this.model.get("seed"));
    this.v.msg.textContent = "";
    this.head?.reset();
    await this.compute();
  }

  // What the prompt is made of: the text and the chat switch.
  textKey() {
    return `${this.v.chatBox.checked && !!this.live?.chat}\n${this.v.box.value}`;
  }

  // True when the analysis shown is not the live model's on the text in the box (the stored one,
  // or the box changed and its analysis was superseded by a later action of the reader).
  stale() {
    return !this.current?.live || this.encoded !== this.textKey();
  }

  // The next token from the analysis shown: the most probable (greedy), or a seeded draw under
  // the sliders' settings.
  pick(greedy) {
    const { current } = this;
    if (greedy) return argmax(current.logits);
    const { T, k, tp } = this.settings();
    const d = distribution(current.logits, T, k, tp, null, logitOrder(current));
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
    if (this.stale()) await this.retext(); // the stored analysis, or an older text
    if (!this.current || !this.promptIds.length) return;
    const id = this.pick(greedy);
    this.path.push(id);
    this.v.msg.textContent = this.stops(id)
      ? `The model ended its answer (${show(this.tokenStr(id))}).`
      : "";
    await this.compute();
  }

  // A run of up to n draws (greedy or seeded), each step computing only the logits (a bare step)
  // and the text drawn every RUN_DRAW_EVERY tokens while the view is on the screen (its new
  // tokens only); the stop button, or a stop id in chat mode, ends it; then one step with what
  // the open panels show (the rows of the run's tokens too), drawn once. Reported: the time a
  // token, everything included (runMs), and the mean time of the run's own steps (runStepMs).
  async generate(n, greedy) {
    if (!(await this.start())) return;
    if (this.stale()) await this.retext();
    if (!this.current || !this.promptIds.length) return;
    this.running = true;
    this.stopAsked = false;
    enable(this);
    const t0 = performance.now();
    let steps = 0,
      stepped = 0, // the bare steps run, and their time
      stepMs = 0,
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
          // awaits the worker or the kernel: the stop button can act
          stepMs += (await this.compute(false)) || 0;
          stepped += 1;
          if (steps % RUN_DRAW_EVERY === 0 && this.onScreen) {
            drawTokens(this, true);
            drawDistribution(this);
          }
        }
      }
    } finally {
      this.running = false;
      enable(this);
    }
    await this.compute();
    const per = (performance.now() - t0) / Math.max(1, steps);
    this.v.msg.textContent = `${steps} token(s) drawn${stopped ? `; ${stopped}` : ""} (${per.toFixed(0)} ms a token, drawing included).`;
    report(this.v.root, {
      runSteps: steps,
      runMs: per.toFixed(1),
      runStepMs: stepped ? (stepMs / stepped).toFixed(1) : undefined,
    });
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
    const s = parseSeed(v.seedBox.value);
    if (s === null) {
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
    drawDistribution(p);
  });
  for (const n of ["temperature", "top_k", "top_p", "n_show"]) {
    life.on(`change:${n}`, () => drawDistribution(p));
  }
  // a panel opened shows what the last step did not compute: one step for it
  for (const d of [v.lensPanel, v.headsPanel]) {
    d.addEventListener("toggle", () => {
      if (d.open && p.current?.live) p.act(() => p.compute());
    });
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
  p.head = mountHeadPanel(p, life);
  if (typeof IntersectionObserver === "function") {
    // whether the reader can see any of the view (a run draws nothing while not)
    const seen = new IntersectionObserver((entries) => {
      p.onScreen = entries[entries.length - 1].isIntersecting;
    });
    seen.observe(v.root);
    life.atEnd(() => seen.disconnect());
  }
  const startAndRetext = listen(p, v, model, life);
  // The stored analysis until the reader starts the live model; in a kernel, start at once.
  p.setStatus(
    "This is the stored analysis of the text above. Start the live model to edit the text and to sample: " +
      "the page then runs the model itself (or the kernel does, in Jupyter and Colab).",
    "off",
  );
  draw(p);
  enable(p);
  let closed = false;
  life.atEnd(() => {
    closed = true;
  });
  p.link.kernel.then((yes) => {
    if (yes && !closed) startAndRetext();
  });
  return () => {
    life.end();
    v.root.remove();
  };
}

export default { render };
