// Sampling view (SamplingView): stored next-token distributions under temperature, top-k and
// top-p (distribution.js), and seeded draws that walk the stored tree of continuations.
// A node stores the logits of the most probable tokens; where it does not store them all, `rest`
// holds the other tokens' total weight at each temperature of the state's `temperatures`, so the
// probabilities shown are the model's own, and the other tokens are one bar.
import { button, lifetime, make, report, show, svg } from "./dom.js";
import { chartKey, chartRows, distribution, drawChart, drawIndex, entropy, samplingControls, xorshift32 } from "./distribution.js";

// top-k's slider: 0 (off) up to where the bars still differ, and never past the tokens a node
// stores when it does not store them all (beyond them the page would not know which to keep).
function topKMax(prompts, topK) {
  const nodes = [];
  const collect = (node) => { nodes.push(node); Object.values(node.next).forEach(collect); };
  prompts.forEach((p) => collect(p.root));
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
  v.promptSel.replaceChildren(...prompts.map((p, i) => {
    const o = make("option", "", p.text || "(the given distribution)");
    o.value = String(i);
    return o;
  }));
  const promptRow = make("label", "gptlib-controls");
  promptRow.append("prompt ", v.promptSel);
  if (prompts.length < 2) promptRow.style.display = "none";
  const buttons = make("div", "gptlib-controls");
  buttons.append(v.stepBtn, v.undoBtn, v.resetBtn);
  v.root.append(v.title, promptRow, ...v.controls.rows, v.stats, v.chart, chartKey(), v.text, buttons, v.msg);
  return v;
}

// The deepest stored node along `path` from `root`, and the drawn token the tree stops at (if any).
function walk(root, path) {
  let node = root, stop = null;
  for (const id of path) {
    const next = id >= 0 ? node.next[String(id)] : undefined;
    if (!next) { stop = id; break; }
    node = next;
  }
  return { node, stop };
}

// The others' weight at temperature T: stored per temperature of `temps` (the nearest if T is
// not one of them, which the sliders never produce); null where the node stores every token.
function restAt(node, T, temps) {
  if (!node.rest || T === 0) return { logZ: null, at: T };
  let g = 0;
  temps.forEach((t, k) => { if (Math.abs(t - T) < Math.abs(temps[g] - T)) g = k; });
  return { logZ: node.rest[g] === null ? -Infinity : node.rest[g], at: temps[g] };
}

// The line above the chart: entropy, or what the page stores of this node's distribution.
function statsLine(node, d, rest, T, V) {
  const n = node.ids.length, kept = d.p.filter((p) => p > 0).length;
  if (!node.rest) return `entropy ${entropy(d.p).toFixed(3)} nats, ${kept} of ${n} tokens can be sampled`;
  return `The page stores the ${n} most probable of the ${V} tokens here ` +
    `(${(100 * node.mass).toFixed(1)}% of the probability at temperature 1) and the total weight of the ` +
    `other ${V - n}: ${kept} stored tokens can be sampled` + (d.rest > 0 ? `, and the others, ${d.rest.toFixed(4)} together.` : ".") +
    (d.approx ? " Top-p reaches past the stored tokens: the page keeps the others' mass up to top-p, the model " +
      "whole tokens (a little more: less than one of those tokens' probability)." : "") +
    (rest.at !== T ? ` (The others' weight is stored at temperature ${rest.at.toFixed(2)}, the nearest to ${T}.)` : "");
}

// The message under the buttons: how many tokens were drawn, or why the text ends.
function stopMessage({ node, stop }, path, others, tok, onePrompt) {
  if (stop === null) return path.length ? `${path.length} token(s) drawn from the stored distributions` : "";
  if (stop < 0) {
    return `The draw fell among the ${others} tokens this page does not list here: the model continues ` +
      "with one of them, and the page cannot say which. Undo or reset to draw again.";
  }
  const known = Object.keys(node.next).map((id) => `\u00ab${show(tok(id))}\u00bb`);
  return `\u00ab${show(tok(stop))}\u00bb was drawn. ` + (known.length
    ? `After this text the page stores the model's next distribution only after ${known.join(", ")}, so the text ends here.`
    : (onePrompt && path.length === 1 ? "This view shows one distribution, so the text ends here."
      : `The page stores the model's distributions for up to ${path.length - 1} drawn token(s), so the text ends here.`)) +
    " Undo or reset to draw again.";
}

function render({ model, el }) {
  const life = lifetime(model);
  const prompts = model.get("prompts"), vocab = model.get("tokens");
  const temps = model.get("temperatures") || [1], V = model.get("vocab_size");
  const tok = (id) => vocab[String(id)];
  const v = layout(prompts, topKMax(prompts, model.get("top_k")));
  el.appendChild(v.root);

  const rng = xorshift32(model.get("seed"));
  let path = [];  // the ids drawn after the prompt; -1 for "one of the tokens the page does not store"
  const where = () => walk(prompts[model.get("prompt")].root, path);
  const settings = () => ({ T: model.get("temperature"), k: model.get("top_k"), tp: model.get("top_p") });

  function drawText(prompt, others) {
    const ctx = make("span", "gptlib-samp-ctx", prompt || "\u2026");
    v.text.replaceChildren(ctx, ...path.map((id) => id >= 0
      ? make("span", "gptlib-samp-new", tok(id).replace(/\n/g, "\u21b5\n"))
      : make("span", "gptlib-samp-new gptlib-samp-unknown", `\u27e8one of the ${others} other tokens\u27e9`)));
  }

  function draw() {
    const at = where(), { node, stop } = at, { logits, ids } = node;
    const { T, k, tp } = settings();
    const prompt = prompts[model.get("prompt")].text;
    v.title.textContent = model.get("title");
    v.promptSel.value = String(model.get("prompt"));
    v.controls.show(T, k, tp);
    const rest = restAt(node, T, temps), rest1 = restAt(node, 1, temps);
    const d = distribution(logits, T, k, tp, rest.logZ);
    const g = distribution(logits, 1, 0, 1, rest1.logZ);
    v.stats.textContent = statsLine(node, d, rest, T, V);
    // The chart: the n_show most probable tokens, then all other tokens as one row.
    const { rows, other } = chartRows(d, g, model.get("n_show"), (i) => tok(ids[i]), V);
    drawChart(v.chart, rows, other, tp);
    drawText(prompt, V - ids.length);
    v.stepBtn.disabled = stop !== null;
    v.undoBtn.disabled = v.resetBtn.disabled = path.length === 0;
    v.msg.classList.toggle("gptlib-samp-stop", stop !== null);
    v.msg.textContent = stopMessage(at, path, V - ids.length, tok, prompts.length === 1 && !prompt);
    // What is drawn, to compare with Python; the others' weight used now and at temperature 1
    // (for the ghost) are "" where every token is stored.
    report(v.root, {
      probs: d.p, rest: d.rest, restAll: d.restAll, approx: d.approx ? "1" : "0", ghost: g.p,
      restLogz: rest.logZ === null ? "" : rest.logZ, restLogz1: node.rest ? rest1.logZ : "",
      cum: d.cum.slice(0, rows.length), settings: { temperature: T, top_k: k, top_p: tp },
      logits, ids, path, prompt: model.get("prompt"), stuck: stop !== null ? "1" : "0",
    });
  }

  // One seeded draw from the distribution shown, if the tree goes on.
  function step() {
    const { node, stop } = where();
    if (stop !== null) return;
    const { T, k, tp } = settings();
    const d = distribution(node.logits, T, k, tp, restAt(node, T, temps).logZ);
    const u = rng();
    const i = drawIndex(d.p, d.order, u, d.rest);
    report(v.root, { u });
    path.push(i >= 0 ? node.ids[i] : -1);
    draw();
  }

  const set = (name, value) => { model.set(name, value); model.save_changes(); draw(); };
  v.controls.onInput(set);
  v.promptSel.addEventListener("change", () => { path = []; set("prompt", Number(v.promptSel.value)); });
  v.stepBtn.addEventListener("click", step);
  v.undoBtn.addEventListener("click", () => { path.pop(); draw(); });
  v.resetBtn.addEventListener("click", () => { path = []; draw(); });
  ["temperature", "top_k", "top_p", "prompt"].forEach((n) => life.on(`change:${n}`, draw));
  draw();
  return () => { life.end(); v.root.remove(); };
}

export default { render };
