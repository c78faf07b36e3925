// BPE merge explorer (BPEMergeView): the sentence as coloured pieces after `step` merges, with a
// slider over the merges.
import { collapse, lifetime, make, report, show } from "./dom.js";

// The view's elements: title, slider with its label, the merge shown, the pieces.
function layout() {
  const root = make("div", "gptlib-widget gptlib-bpe");
  const title = make("div", "gptlib-title");
  const slider = make("input", "gptlib-bpe-slider");
  slider.type = "range";
  slider.min = "0";
  const stepLabel = make("span");
  const controls = make("label", "gptlib-controls");
  controls.append("merges applied: ", slider, stepLabel);
  const info = make("div", "gptlib-bpe-merge");
  const pieces = make("div", "gptlib-bpe-pieces");
  root.append(title, controls, info, pieces);
  return { root, title, slider, stepLabel, info, pieces, shown: { open: false } };
}

// Each piece as the character span it covers ("start:end"), to find the pieces a merge created.
function spans(list) {
  let at = 0;
  return list.map((p) => {
    const start = at;
    at += p.length;
    return `${start}:${at}`;
  });
}

// The pieces after `step` merges; those the last merge created (spans that were not pieces one
// step earlier) are outlined; a long split shows its first and last pieces around a button that
// puts the others back (and keeps them, once opened: `shown.open`). Returns how many were created.
function drawPieces(box, steps, step, shown) {
  const before = new Set(step > 0 ? spans(steps[step - 1]) : []);
  const now = spans(steps[step]);
  let merged = 0;
  const pieces = steps[step].map((p, i) => {
    const created = step > 0 && !before.has(now[i]);
    merged += created ? 1 : 0;
    const e = make(
      "span",
      `gptlib-bpe-piece gptlib-bpe-c${i % 6}${created ? " gptlib-bpe-new" : ""}`,
      show(p),
    );
    e.title = `piece ${i}: \u201c${show(p)}\u201d`;
    return e;
  });
  box.replaceChildren(
    ...collapse(pieces, {
      open: shown.open,
      onOpen: () => {
        shown.open = true;
      },
    }),
  );
  return merged;
}

function draw(view, model) {
  const steps = model.get("steps"),
    merges = model.get("merges");
  const step = Math.max(0, Math.min(model.get("step"), steps.length - 1));
  const n = steps[step].length;
  view.title.textContent = model.get("title");
  view.slider.max = String(steps.length - 1);
  view.slider.value = String(step);
  view.stepLabel.textContent = ` ${step} / ${steps.length - 1}   (${n} tokens)`;
  view.info.textContent =
    step === 0 ? "no merge yet: one piece per byte" : `merge ${step}: ${merges[step - 1]}`;
  const merged = drawPieces(view.pieces, steps, step, view.shown);
  report(view.root, { step, tokens: n, merged });
}

function render({ model, el }) {
  const life = lifetime(model);
  const view = layout();
  el.appendChild(view.root);
  const redraw = () => draw(view, model);
  view.slider.addEventListener("input", () => {
    model.set("step", Number(view.slider.value));
    model.save_changes();
    redraw();
  });
  life.on("change:step", redraw);
  life.on("change:steps", redraw);
  redraw();
  return () => {
    life.end();
    view.root.remove();
  };
}

export default { render };
