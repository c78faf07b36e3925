// Sampling view (SamplingView): stored next-token distributions under temperature, top-k and
// top-p (distribution.js), and seeded draws that walk the stored tree of continuations.
// A node stores the logits of the most probable tokens; where it does not store them all, `rest`
// holds the other tokens' total weight at each temperature of the state's `temperatures`, so the
// probabilities shown are the model's own, and the other tokens are one bar.

function render({ model, el }) {
  const prompts = model.get("prompts"), vocab = model.get("tokens");
  const temps = model.get("temperatures") || [1], V = model.get("vocab_size");
  const tok = (id) => vocab[String(id)];
  const root = make("div", "gptlib-widget gptlib-samp");
  const title = make("div", "gptlib-title");

  // Controls: the prompt, then temperature, top-k and top-p.
  const promptSel = make("select", "gptlib-samp-prompt");
  promptSel.replaceChildren(...prompts.map((p, i) => {
    const o = make("option", "", p.text || "(the given distribution)");
    o.value = String(i);
    return o;
  }));
  const promptRow = make("label", "gptlib-controls");
  promptRow.append("prompt ", promptSel);
  if (prompts.length < 2) promptRow.style.display = "none";
  // top-k: 0 (off) up to where the bars still differ, and never past the tokens a node stores
  // when it does not store them all (beyond them the page would not know which tokens to keep).
  const nodes = [];
  const collect = (node) => { nodes.push(node); Object.values(node.next).forEach(collect); };
  prompts.forEach((p) => collect(p.root));
  const longest = Math.max(...nodes.map((n) => n.ids.length));
  const partial = nodes.filter((n) => n.rest).map((n) => n.ids.length);
  const kMax = Math.max(Math.min(longest, 100, ...partial), model.get("top_k"));
  const controls = samplingControls(kMax);
  const stats = make("div", "gptlib-samp-stats");
  const chart = svg("svg", { class: "gptlib-samp-chart" });

  // The text so far, and the buttons that extend it from the stored distributions.
  const text = make("div", "gptlib-samp-text");
  const stepBtn = make("button", "gptlib-samp-step", "sample next token");
  const undoBtn = make("button", "gptlib-samp-undo", "undo");
  const resetBtn = make("button", "gptlib-samp-reset", "reset");
  [stepBtn, undoBtn, resetBtn].forEach((b) => { b.type = "button"; });
  const buttons = make("div", "gptlib-controls");
  buttons.append(stepBtn, undoBtn, resetBtn);
  const msg = make("div", "gptlib-samp-msg");
  root.append(title, promptRow, ...controls.rows, stats, chart, chartKey(), text, buttons, msg);
  el.appendChild(root);

  const rng = xorshift32(model.get("seed"));
  let path = [];  // the ids drawn after the prompt; -1 for "one of the tokens the page does not store"

  // The deepest stored node along the path, and the drawn token the tree stops at (if any).
  function where() {
    let node = prompts[model.get("prompt")].root, stop = null;
    for (const id of path) {
      const next = id >= 0 ? node.next[String(id)] : undefined;
      if (!next) { stop = id; break; }
      node = next;
    }
    return { node, stop };
  }

  // The others' weight at temperature T: stored per temperature of `temps` (the nearest if T is
  // not one of them, which the sliders never produce); null where the node stores every token.
  function restAt(node, T) {
    if (!node.rest || T === 0) return { logZ: null, at: T };
    let g = 0;
    temps.forEach((t, k) => { if (Math.abs(t - T) < Math.abs(temps[g] - T)) g = k; });
    return { logZ: node.rest[g] === null ? -Infinity : node.rest[g], at: temps[g] };
  }

  function settings() {
    return { T: model.get("temperature"), k: model.get("top_k"), tp: model.get("top_p") };
  }

  function draw() {
    const { node, stop } = where();
    const logits = node.logits, ids = node.ids;
    const { T, k, tp } = settings();
    title.textContent = model.get("title");
    promptSel.value = String(model.get("prompt"));
    controls.show(T, k, tp);
    const rest = restAt(node, T);
    const d = distribution(logits, T, k, tp, rest.logZ);
    const g = distribution(logits, 1, 0, 1, restAt(node, 1).logZ);
    const n = ids.length, others = V - n;
    const kept = d.p.filter((v) => v > 0).length;
    if (!node.rest) {
      stats.textContent = `entropy ${entropy(d.p).toFixed(3)} nats, ${kept} of ${n} tokens can be sampled`;
    } else {
      stats.textContent = `The page stores the ${n} most probable of the ${V} tokens here ` +
        `(${(100 * node.mass).toFixed(1)}% of the probability at temperature 1) and the total weight of the ` +
        `other ${others}: ${kept} stored tokens can be sampled` + (d.rest > 0 ? `, and the others, ${d.rest.toFixed(4)} together.` : ".") +
        (d.approx ? " Top-p reaches past the stored tokens: the page keeps the others' mass up to top-p, the model " +
          "whole tokens (a little more: less than one of those tokens' probability)." : "") +
        (rest.at !== T ? ` (The others' weight is stored at temperature ${rest.at.toFixed(2)}, the nearest to ${T}.)` : "");
    }

    // The chart: the n_show most probable tokens, then all other tokens as one row.
    const { rows, other } = chartRows(d, g, model.get("n_show"), (i) => tok(ids[i]), V);
    drawChart(chart, rows, other, tp);

    // The text: the prompt, then the drawn tokens.
    const prompt = prompts[model.get("prompt")].text;
    const ctx = make("span", "gptlib-samp-ctx", prompt || "\u2026");
    text.replaceChildren(ctx, ...path.map((id) => id >= 0
      ? make("span", "gptlib-samp-new", tok(id).replace(/\n/g, "\u21b5\n"))
      : make("span", "gptlib-samp-new gptlib-samp-unknown", `\u27e8one of the ${others} other tokens\u27e9`)));
    stepBtn.disabled = stop !== null;
    undoBtn.disabled = resetBtn.disabled = path.length === 0;
    msg.classList.toggle("gptlib-samp-stop", stop !== null);
    if (stop === null) {
      msg.textContent = path.length ? `${path.length} token(s) drawn from the stored distributions` : "";
    } else if (stop < 0) {
      msg.textContent = `The draw fell among the ${others} tokens this page does not list here: the model continues ` +
        "with one of them, and the page cannot say which. Undo or reset to draw again.";
    } else {
      const known = Object.keys(node.next).map((id) => `\u00ab${show(tok(id))}\u00bb`);
      msg.textContent = `\u00ab${show(tok(stop))}\u00bb was drawn. ` + (known.length
        ? `After this text the page stores the model's next distribution only after ${known.join(", ")}, so the text ends here.`
        : (prompts.length === 1 && !prompt && path.length === 1 ? "This view shows one distribution, so the text ends here."
          : `The page stores the model's distributions for up to ${path.length - 1} drawn token(s), so the text ends here.`)) +
        " Undo or reset to draw again.";
    }

    // What is drawn, for the browser test to compare with Python.
    root.dataset.probs = JSON.stringify(d.p);
    root.dataset.rest = String(d.rest);
    root.dataset.restAll = String(d.restAll);
    // the others' weight used now and at temperature 1 (for the ghost); "" where every token is stored
    root.dataset.restLogz = rest.logZ === null ? "" : String(rest.logZ);
    root.dataset.restLogz1 = node.rest ? String(restAt(node, 1).logZ) : "";
    root.dataset.approx = d.approx ? "1" : "0";
    root.dataset.ghost = JSON.stringify(g.p);
    root.dataset.cum = JSON.stringify(d.cum.slice(0, rows.length));
    root.dataset.settings = JSON.stringify({ temperature: T, top_k: k, top_p: tp });
    root.dataset.logits = JSON.stringify(logits);
    root.dataset.ids = JSON.stringify(ids);
    root.dataset.path = JSON.stringify(path);
    root.dataset.prompt = String(model.get("prompt"));
    root.dataset.stuck = stop !== null ? "1" : "0";
  }

  function step() {
    const { node, stop } = where();
    if (stop !== null) return;
    const { T, k, tp } = settings();
    const d = distribution(node.logits, T, k, tp, restAt(node, T).logZ);
    const u = rng();
    const i = drawIndex(d.p, d.order, u, d.rest);
    root.dataset.u = String(u);
    path.push(i >= 0 ? node.ids[i] : -1);
    draw();
  }

  const set = (name, v) => { model.set(name, v); model.save_changes(); draw(); };
  controls.onInput(set);
  promptSel.addEventListener("change", () => { path = []; set("prompt", Number(promptSel.value)); });
  stepBtn.addEventListener("click", step);
  undoBtn.addEventListener("click", () => { path.pop(); draw(); });
  resetBtn.addEventListener("click", () => { path = []; draw(); });
  ["temperature", "top_k", "top_p", "prompt"].forEach((n) => model.on(`change:${n}`, draw));
  draw();
}
export default { render };
