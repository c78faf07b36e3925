// Sampling view. nextTokenProbs mirrors gptlib.sampling.next_token_probs:
// temperature, then top-k, then top-p (smallest most-probable set reaching p), then renormalise.
export function nextTokenProbs(logits, temperature, topK, topP) {
  const n = logits.length;
  const order = [...Array(n).keys()].sort((a, b) => (logits[b] - logits[a]) || (a - b));
  let p = new Array(n).fill(0);
  if (temperature === 0) {
    p[order[0]] = 1;
    return p;
  }
  const m = logits[order[0]];
  let z = 0;
  for (let i = 0; i < n; i++) { p[i] = Math.exp((logits[i] - m) / temperature); z += p[i]; }
  for (let i = 0; i < n; i++) p[i] /= z;
  const keep = new Array(n).fill(true);
  if (topK > 0 && topK < n) order.slice(topK).forEach((i) => { keep[i] = false; });
  let kept = order.filter((i) => keep[i]);
  let zk = kept.reduce((s, i) => s + p[i], 0);
  if (topP < 1) {
    let cum = 0, cut = kept.length;
    for (let r = 0; r < kept.length; r++) {
      cum += p[kept[r]] / zk;
      if (cum >= topP) { cut = r + 1; break; }
    }
    kept.slice(cut).forEach((i) => { keep[i] = false; });
    kept = kept.slice(0, cut);
  }
  const zz = kept.reduce((s, i) => s + p[i], 0);
  return p.map((v, i) => (keep[i] ? v / zz : 0));
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "gptlib-widget gptlib-samp";
  const title = document.createElement("div");
  title.className = "gptlib-title";
  const mk = (cls, min, max, step) => {
    const s = document.createElement("input");
    s.type = "range"; s.className = cls; s.min = min; s.max = max; s.step = step;
    return s;
  };
  const tSlider = mk("gptlib-samp-temperature", "0", "3", "0.05");
  // top-k: 0 (off) to a range where the bars still show a difference, or the initial k if larger.
  const kMax = Math.max(Math.min(model.get("logits").length, 100), model.get("top_k"));
  const kSlider = mk("gptlib-samp-topk", "0", String(kMax), "1");
  const pSlider = mk("gptlib-samp-topp", "0.05", "1", "0.05");
  const labels = [document.createElement("span"), document.createElement("span"), document.createElement("span")];
  const row = (name, s, l) => {
    const d = document.createElement("label");
    d.className = "gptlib-controls";
    d.append(name, s, l);
    return d;
  };
  const stats = document.createElement("div");
  const bars = document.createElement("div");
  bars.className = "gptlib-samp-bars";
  root.append(title, row("temperature ", tSlider, labels[0]), row("top-k ", kSlider, labels[1]),
              row("top-p ", pSlider, labels[2]), stats, bars);
  el.appendChild(root);
  const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");

  function draw() {
    const logits = model.get("logits"), tokens = model.get("tokens");
    const T = model.get("temperature"), k = model.get("top_k"), tp = model.get("top_p");
    title.textContent = model.get("title");
    tSlider.value = String(T); kSlider.value = String(k); pSlider.value = String(tp);
    labels[0].textContent = ` ${T.toFixed(2)}`;
    labels[1].textContent = k > 0 ? ` ${k}` : " off";
    labels[2].textContent = tp < 1 ? ` ${tp.toFixed(2)}` : " off";
    const p = nextTokenProbs(logits, T, k, tp);
    const H = -p.reduce((s, v) => s + (v > 0 ? v * Math.log(v) : 0), 0);
    const kept = p.filter((v) => v > 0).length;
    stats.textContent = `entropy ${H.toFixed(3)} nats, ${kept} of ${p.length} tokens can be sampled`;
    const order = [...Array(logits.length).keys()].sort((a, b) => (logits[b] - logits[a]) || (a - b));
    const pmax = Math.max(...p);
    bars.replaceChildren(...order.slice(0, model.get("n_show")).map((i) => {
      const r = document.createElement("div");
      r.className = "gptlib-samp-row" + (p[i] > 0 ? "" : " removed");
      const t = document.createElement("span"); t.className = "gptlib-samp-tok"; t.textContent = show(tokens[i]);
      const b = document.createElement("span"); b.className = "gptlib-samp-bar";
      b.style.width = `${(240 * p[i]) / pmax}px`;
      const v = document.createElement("span"); v.className = "gptlib-samp-p"; v.textContent = p[i].toFixed(4);
      r.append(t, b, v);
      return r;
    }));
    // The full computed distribution, for the browser test to compare with Python.
    root.dataset.probs = JSON.stringify(p);
    root.dataset.settings = JSON.stringify({ temperature: T, top_k: k, top_p: tp });
    root.dataset.logits = JSON.stringify(logits);
  }
  const set = (name, v) => { model.set(name, v); model.save_changes(); draw(); };
  tSlider.addEventListener("input", () => set("temperature", Number(tSlider.value)));
  kSlider.addEventListener("input", () => set("top_k", Number(kSlider.value)));
  pSlider.addEventListener("input", () => set("top_p", Number(pSlider.value)));
  ["temperature", "top_k", "top_p", "logits"].forEach((n) => model.on(`change:${n}`, draw));
  draw();
}
export default { render };
