// BPE merge explorer: the sentence as coloured pieces after `step` merges, with a slider.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "gptlib-widget gptlib-bpe";
  const title = document.createElement("div");
  title.className = "gptlib-title";
  const controls = document.createElement("label");
  controls.className = "gptlib-controls";
  const slider = document.createElement("input");
  slider.type = "range";
  slider.min = "0";
  slider.className = "gptlib-bpe-slider";
  const stepLabel = document.createElement("span");
  controls.append("merges applied: ", slider, stepLabel);
  const info = document.createElement("div");
  info.className = "gptlib-bpe-merge";
  const pieces = document.createElement("div");
  pieces.className = "gptlib-bpe-pieces";
  root.append(title, controls, info, pieces);
  el.appendChild(root);

  function show(piece) {
    // Make spaces and newlines visible inside a piece.
    return piece.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");
  }

  function draw() {
    const steps = model.get("steps");
    const merges = model.get("merges");
    const step = Math.max(0, Math.min(model.get("step"), steps.length - 1));
    title.textContent = model.get("title");
    slider.max = String(steps.length - 1);
    slider.value = String(step);
    const current = steps[step];
    stepLabel.textContent = ` ${step} / ${steps.length - 1}   (${current.length} tokens)`;
    info.textContent = step === 0 ? "no merge yet: one piece per byte" : `merge ${step}: ${merges[step - 1]}`;
    // Pieces the last merge created: character spans that were not pieces one step earlier.
    const spans = (list) => { let at = 0; return list.map((p) => `${at}:${(at += p.length)}`); };
    const before = new Set(step > 0 ? spans(steps[step - 1]) : []);
    const now = spans(current);
    pieces.replaceChildren(
      ...current.map((p, i) => {
        const span = document.createElement("span");
        span.className = "gptlib-bpe-piece gptlib-bpe-c" + (i % 6) + (step > 0 && !before.has(now[i]) ? " gptlib-bpe-new" : "");
        span.textContent = show(p);
        return span;
      })
    );
    root.dataset.step = String(step);
    root.dataset.tokens = String(current.length);
    root.dataset.merged = String(pieces.querySelectorAll(".gptlib-bpe-new").length);
  }

  slider.addEventListener("input", () => {
    model.set("step", Number(slider.value));
    model.save_changes();
    draw();
  });
  model.on("change:step", draw);
  model.on("change:steps", draw);
  draw();
}
export default { render };
