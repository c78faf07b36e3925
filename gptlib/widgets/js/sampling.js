// Sampling view (SamplingView): next-token distributions under temperature, top-k and top-p
// (distribution.js), and seeded draws that extend a text, for as long as the view knows the next
// distribution. Where it comes from:
//   - a bigram table (from_table): the page computes the row after the last token (tableLogits),
//     so the draws never stop;
//   - a stored tree of continuations (from_model): a node stores the logits of the most probable
//     tokens; where it does not store them all, `rest` holds the other tokens' total weight at each
//     temperature of the state's `temperatures`, so the probabilities shown are the model's own,
//     and the other tokens are one bar;
//   - past the tree, the live model, when the view names one (`source`): live.js's connect, the
//     kernel in Jupyter and Colab, else the page's backend (shared with every other view of that
//     model on the page); every distribution is then computed.
import { button, lifetime, make, report, show, svg } from "./dom.js";
import {
  chartKey,
  chartRows,
  distribution,
  drawChart,
  drawIndex,
  entropy,
  samplingControls,
  tableLogits,
  xorshift32,
} from "./distribution.js";
import { connect, startError } from "./live.js";

// A distribution over a whole vocabulary, as a node with nothing stored below it.
const fullNode = (logits) => ({
  ids: [...Array(logits.length).keys()],
  logits,
  mass: 1,
  rest: null,
  next: {},
});

// top-k's slider: 0 (off) up to where the bars still differ, and never past the tokens a node
// stores when it does not store them all (beyond them the page would not know which to keep).
function topKMax(prompts, topK, V, table) {
  if (table) return Math.max(Math.min(V, 100), topK);
  const nodes = [];
  const collect = (node) => {
    nodes.push(node);
    Object.values(node.next).forEach(collect);
  };
  for (const p of prompts) collect(p.root);
  const longest = Math.max(...nodes.map((n) => n.ids.length));
  const partial = nodes.filter((n) => n.rest).map((n) => n.ids.length);
  return Math.max(Math.min(longest, 100, ...partial), topK);
}

// The view's elements: title, prompt selector, the three sliders, statistics, the chart, the text
// so far and the buttons that extend it, and a message line.
function layout(prompts, kMax) {
  const v = {
    root: make("div", "gptlib-widget gptlib-samp"),
    title: make("div", "gptlib-title"),
    promptSel: make("select", "gptlib-samp-prompt"),
    controls: samplingControls(kMax),
    stats: make("div", "gptlib-samp-stats"),
    chart: svg("svg", { class: "gptlib-samp-chart" }),
    text: make("div", "gptlib-samp-text"),
    stepBtn: button("gptlib-samp-step", "sample next token"),
    undoBtn: button("gptlib-samp-undo", "undo"),
    resetBtn: button("gptlib-samp-reset", "reset"),
    msg: make("div", "gptlib-samp-msg"),
  };
  v.promptSel.replaceChildren(
    ...prompts.map((p, i) => {
      const o = make("option", "", p.text || "(the given distribution)");
      o.value = String(i);
      return o;
    }),
  );
  const promptRow = make("label", "gptlib-controls");
  promptRow.append("prompt ", v.promptSel);
  if (prompts.length < 2) promptRow.style.display = "none";
  const buttons = make("div", "gptlib-controls");
  buttons.append(v.stepBtn, v.undoBtn, v.resetBtn);
  v.root.append(
    v.title,
    promptRow,
    ...v.controls.rows,
    v.stats,
    v.chart,
    chartKey(),
    v.text,
    buttons,
    v.msg,
  );
  return v;
}

// The deepest stored node along `path` from `root`, and the drawn token the tree stops at (if any).
function walk(root, path) {
  let node = root,
    stop = null;
  for (const id of path) {
    const next = id >= 0 ? node.next[String(id)] : undefined;
    if (!next) {
      stop = id;
      break;
    }
    node = next;
  }
  return { node, stop };
}

// The others' weight at temperature T: stored per temperature of `temps` (the nearest if T is
// not one of them, which the sliders never produce); null where the node stores every token.
function restAt(node, T, temps) {
  if (!node.rest || T === 0) return { logZ: null, at: T };
  let g = 0;
  temps.forEach((t, k) => {
    if (Math.abs(t - T) < Math.abs(temps[g] - T)) g = k;
  });
  return { logZ: node.rest[g] === null ? -Infinity : node.rest[g], at: temps[g] };
}

// The line above the chart: entropy, or what the page stores of this node's distribution.
function statsLine(node, d, rest, T, V) {
  const n = node.ids.length,
    kept = d.p.filter((p) => p > 0).length;
  if (!node.rest)
    return `entropy ${entropy(d.p).toFixed(3)} nats, ${kept} of ${n} tokens can be sampled`;
  return (
    `The page stores the ${n} most probable of the ${V} tokens here ` +
    `(${(100 * node.mass).toFixed(1)}% of the probability at temperature 1) and the total weight of the ` +
    `other ${V - n}: ${kept} stored tokens can be sampled` +
    (d.rest > 0 ? `, and the others, ${d.rest.toFixed(4)} together.` : ".") +
    (d.approx
      ? " Top-p reaches past the stored tokens: the page keeps the others' mass up to top-p, the model " +
        "whole tokens (a little more: less than one of those tokens' probability)."
      : "") +
    (rest.at !== T
      ? ` (The others' weight is stored at temperature ${rest.at.toFixed(2)}, the nearest to ${T}.)`
      : "")
  );
}

// The message under the buttons: how many tokens were drawn and from what, or why the text ends.
function stopMessage({ node, stop, from }, path, others, tok, onePrompt, live) {
  if (from === "table")
    return path.length
      ? `${path.length} token(s) drawn; each row is computed from the table of counts`
      : "";
  if (from === "live")
    return `${path.length} token(s) drawn. Past the stored tree every distribution is the live model's, computed by ${live.describe}.`;
  if (stop === null)
    return path.length ? `${path.length} token(s) drawn from the stored distributions` : "";
  if (stop < 0) {
    return (
      `The draw fell among the ${others} tokens this page does not list here: the model continues ` +
      "with one of them, and the page cannot say which. Undo or reset to draw again."
    );
  }
  const known = Object.keys(node.next).map((id) => `\u00ab${show(tok(id))}\u00bb`);
  return (
    `\u00ab${show(tok(stop))}\u00bb was drawn. ` +
    (known.length
      ? `After this text the page stores the model's next distribution only after ${known.join(", ")}, so the text ends here.`
      : onePrompt && path.length === 1
        ? "This view shows one distribution, so the text ends here."
        : `The page stores the model's distributions for up to ${path.length - 1} drawn token(s), so the text ends here.`) +
    " Undo or reset to draw again."
  );
}

// The view's state and what it does: the text drawn so far, where its distribution comes from
// (the table, the stored tree, the live model), drawing it, and one seeded draw.
class Sampler {
  constructor(model, v, life) {
    this.model = model;
    this.v = v;
    this.prompts = model.get("prompts");
    this.vocab = model.get("tokens");
    this.temps = model.get("temperatures") || [1];
    this.V = model.get("vocab_size");
    this.table = Object.keys(model.get("table") || {}).length ? model.get("table") : null;
    this.canLive = !this.table && Boolean(model.get("source"));
    this.rng = xorshift32(model.get("seed"));
    this.path = []; // the ids drawn after the prompt; -1 for "one of the tokens the page does not list"
    this.live = null; // the backend, once started
    this.liveError = "";
    this.busy = false;
    this.liveNodes = new Map(); // distributions the live model computed, by prompt and path
    this.rows = new Map(); // the table's rows computed so far, by token
    this.link = null;
    if (this.canLive) {
      this.link = connect(model); // the kernel's (Jupyter, Colab) or the page's backend
      life.atEnd(() => this.link.close());
    }
  }

  tok(id) {
    return this.vocab[String(id)] ?? (this.live ? this.live.tokens[id] : `#${id}`);
  }

  settings() {
    const m = this.model;
    return { T: m.get("temperature"), k: m.get("top_k"), tp: m.get("top_p") };
  }

  promptIds() {
    return this.prompts[this.model.get("prompt")].ids;
  }

  key(p) {
    return `${this.model.get("prompt")}:${p.join(",")}`;
  }

  // The distribution after the prompt and `p`: {node, stop, from}; stop is the drawn token after
  // which the view knows no distribution (null where it knows one).
  position(p) {
    const { table, rows } = this;
    if (table) {
      const ids = this.promptIds();
      const a = p.length ? p[p.length - 1] : ids[ids.length - 1];
      if (!rows.has(a)) rows.set(a, fullNode(tableLogits(table, a)));
      return { node: rows.get(a), stop: null, from: "table" };
    }
    const at = walk(this.prompts[this.model.get("prompt")].root, p);
    if (at.stop === null) return { ...at, from: "tree" };
    const known = this.liveNodes.get(this.key(p));
    return known ? { node: known, stop: null, from: "live" } : { ...at, from: "tree" };
  }

  // Starts the live model once; true when it runs (else liveError says why).
  async ensureLive() {
    if (this.live) return true;
    const progress = (s) => {
      this.v.msg.textContent = `starting the live model: ${s}\u2026`;
    };
    try {
      this.live = await this.link.backend({ progress });
      report(this.v.root, { live: "on" });
      return true;
    } catch (e) {
      this.liveError = startError(e);
      report(this.v.root, { live: "failed", error: this.liveError });
      return false;
    }
  }

  // The live model's distribution after the prompt and `p` (computed once), or null: the
  // next-token logits, every head kept, no lens, no direct contributions.
  async liveNode(p) {
    const key = this.key(p);
    if (this.liveNodes.has(key)) return this.liveNodes.get(key);
    if (!(await this.ensureLive())) return null;
    const ids = [...this.promptIds(), ...p].slice(-this.live.config.n_ctx);
    const { logits } = await this.live.run(ids, { mask: null, lens: null, targets: null });
    const node = fullNode(Array.from(logits));
    this.liveNodes.set(key, node);
    return node;
  }

  drawText(prompt, others) {
    const ctx = make("span", "gptlib-samp-ctx", prompt || "\u2026");
    const drawn = this.path.map((id) =>
      id >= 0
        ? make("span", "gptlib-samp-new", this.tok(id).replace(/\n/g, "\u21b5\n"))
        : make(
            "span",
            "gptlib-samp-new gptlib-samp-unknown",
            `\u27e8one of the ${others} other tokens\u27e9`,
          ),
    );
    this.v.text.replaceChildren(ctx, ...drawn);
  }

  draw() {
    const { model, v, V, path, busy, temps } = this;
    const at = this.position(path),
      { node, stop } = at,
      { logits, ids } = node;
    const { T, k, tp } = this.settings();
    const prompt = this.prompts[model.get("prompt")].text;
    v.title.textContent = model.get("title");
    v.promptSel.value = String(model.get("prompt"));
    v.controls.show(T, k, tp);
    const rest = restAt(node, T, temps),
      rest1 = restAt(node, 1, temps);
    const d = distribution(logits, T, k, tp, rest.logZ);
    const g = distribution(logits, 1, 0, 1, rest1.logZ);
    v.stats.textContent = statsLine(node, d, rest, T, V);
    // The chart: the n_show most probable tokens, then all other tokens as one row.
    const label = (i) => this.tok(ids[i]);
    const { rows: bars, other } = chartRows(d, g, model.get("n_show"), label, V);
    drawChart(v.chart, bars, other, tp);
    this.drawText(prompt, V - ids.length);
    v.stepBtn.disabled = busy || stop !== null;
    v.undoBtn.disabled = v.resetBtn.disabled = busy || path.length === 0;
    v.promptSel.disabled = busy;
    v.msg.classList.toggle("gptlib-samp-stop", stop !== null);
    const onePrompt = this.prompts.length === 1 && !prompt;
    v.msg.textContent =
      (stop !== null && this.liveError ? `${this.liveError} ` : "") +
      stopMessage(at, path, V - ids.length, (id) => this.tok(id), onePrompt, this.live);
    // What is drawn, to compare with Python; the others' weight used now and at temperature 1
    // (for the ghost) are "" where every token is stored.
    report(v.root, {
      probs: d.p,
      rest: d.rest,
      restAll: d.restAll,
      approx: d.approx ? "1" : "0",
      ghost: g.p,
      restLogz: rest.logZ === null ? "" : rest.logZ,
      restLogz1: node.rest ? rest1.logZ : "",
      cum: d.cum.slice(0, bars.length),
      settings: { temperature: T, top_k: k, top_p: tp },
      logits,
      ids,
      path,
      prompt: model.get("prompt"),
      stuck: stop !== null ? "1" : "0",
      from: at.from,
      busy: busy ? "1" : "0",
    });
  }

  // One seeded draw from the distribution shown. A draw among the tokens a stored node does not
  // list, or one the tree has no node after, goes to the live model where the view has one: the
  // first redrawn at the same u from the whole distribution (whose most probable tokens are the
  // listed ones), the second continued from the distribution the live model computes.
  async step() {
    const { v, path, canLive } = this;
    const at = this.position(path);
    if (this.busy || at.stop !== null) return;
    const { T, k, tp } = this.settings();
    let node = at.node;
    let d = distribution(node.logits, T, k, tp, restAt(node, T, this.temps).logZ);
    const u = this.rng();
    let i = drawIndex(d.p, d.order, u, d.rest);
    report(v.root, { u });
    this.busy = canLive;
    if (this.busy) {
      v.stepBtn.disabled = v.undoBtn.disabled = v.resetBtn.disabled = v.promptSel.disabled = true;
      report(v.root, { busy: "1" });
    }
    try {
      if (i < 0 && canLive) {
        v.msg.textContent =
          "The draw fell among the tokens the page does not store here: asking the live model\u2026";
        const whole = await this.liveNode(path);
        if (whole) {
          node = whole;
          d = distribution(node.logits, T, k, tp, null);
          i = drawIndex(d.p, d.order, u, 0);
        }
      }
      path.push(i >= 0 ? node.ids[i] : -1);
      if (canLive && i >= 0 && this.position(path).stop !== null) {
        v.msg.textContent =
          "Past the stored tree: the live model computes the next distribution\u2026";
        await this.liveNode(path);
      }
    } catch (e) {
      this.liveError = `The live model failed: ${e.message}`;
      report(v.root, { error: this.liveError });
    } finally {
      this.busy = false;
      this.draw();
    }
  }
}

function render({ model, el }) {
  const life = lifetime(model);
  const prompts = model.get("prompts");
  const table = Object.keys(model.get("table") || {}).length ? model.get("table") : null;
  const v = layout(prompts, topKMax(prompts, model.get("top_k"), model.get("vocab_size"), table));
  el.appendChild(v.root);
  const s = new Sampler(model, v, life);
  const redraw = () => {
    if (!s.busy) s.draw();
  };
  // the seeded generator goes on after a reset: a new text each time
  const restart = () => {
    s.path = [];
  };
  const set = (name, value) => {
    model.set(name, value);
    model.save_changes();
    s.draw();
  };
  v.controls.onInput(set);
  v.promptSel.addEventListener("change", () => {
    restart();
    set("prompt", Number(v.promptSel.value));
  });
  v.stepBtn.addEventListener("click", () => s.step());
  v.undoBtn.addEventListener("click", () => {
    if (!s.busy) s.path.pop();
    redraw();
  });
  v.resetBtn.addEventListener("click", () => {
    if (!s.busy) restart();
    redraw();
  });
  for (const n of ["temperature", "top_k", "top_p", "prompt"]) life.on(`change:${n}`, redraw);
  s.draw();
  return () => {
    life.end();
    v.root.remove();
  };
}

export default { render };
