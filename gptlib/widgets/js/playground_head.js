// The playground's "one head, step by step" panel (head.js's panel on the live model): the reader
// picks the layer and head (also by a click on a head in the heads panel), the query position (a
// click on a token of the context) and the token v whose logit the head's direct contribution is
// to (by default the token that follows the query in the text, or at the last position the most
// probable next token, whose logit the heads panel decomposes). The model computes it only while
// the panel is open: one step that asks the graph for that head (page.js) or the kernel's head
// request (kernel.js), both giving head.js's inputs; head.js draws them.
import { make, report, show } from "./dom.js";
import { headPanel, traceHead } from "./head.js";

// The first index of the largest logit.
function argmax(logits) {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

const numberBox = (cls, label) => {
  const box = make("input", `gptlib-head-box ${cls}`);
  Object.assign(box, { type: "number", min: "0", step: "1" });
  const l = make("label", "gptlib-head-control", `${label} `);
  l.append(box);
  return [box, l];
};

// The panel's elements: a closed <details> (nothing computed until it opens), its controls, the
// line that says what to do, and the drawn panel.
function layout(cfg) {
  const v = { details: make("details", "gptlib-play-head-panel") };
  v.details.append(
    make(
      "summary",
      "gptlib-play-section",
      "One head, step by step: its query, keys, scores, softmax, values and direct contribution",
    ),
  );
  v.layer = make("select", "gptlib-head-pick-layer");
  v.head = make("select", "gptlib-head-pick-head");
  for (let l = 0; l < cfg.n_layers; l++) v.layer.append(new Option(`layer ${l}`, String(l)));
  for (let h = 0; h < cfg.n_heads; h++) v.head.append(new Option(`head ${h}`, String(h)));
  v.layer.setAttribute("aria-label", "layer");
  v.head.setAttribute("aria-label", "head");
  const [position, positionLabel] = numberBox("gptlib-head-pick-position", "query t");
  const [target, targetLabel] = numberBox("gptlib-head-pick-target", "token v (id)");
  const [pair, pairLabel] = numberBox("gptlib-head-pick-pair", "RoPE pair i");
  Object.assign(v, { position, target, pair, pairLabel });
  target.max = String(cfg.d_vocab - 1);
  pair.value = "0";
  pairLabel.style.display = "none"; // until an answer says the model rotates its queries
  v.targetName = make("span", "gptlib-head-target-name");
  v.note = make("div", "gptlib-head-note");
  v.view = make("div", "gptlib-head-view");
  const controls = make("div", "gptlib-controls gptlib-head-controls");
  controls.append(v.layer, v.head, positionLabel, targetLabel, v.targetName, pairLabel);
  v.details.append(controls, v.note, v.view);
  return v;
}

// The panel, mounted in the playground `p` (playground.js) after its heads panel. Returns
// {compute(): the head for the context shown, when the panel is open}.
export function mountHeadPanel(p, life) {
  const { model, cfg } = p;
  const v = layout(cfg);
  p.v.root.append(v.details);
  // the reader's choices; null: follow the default (the last position; the next token)
  const chosen = { position: null, target: null };
  const rotary = { yes: false };
  let answers = 0; // how many the panel has drawn (for tests)

  const syncHead = () => {
    v.layer.value = String(model.get("layer"));
    v.head.value = String(model.get("head"));
  };
  syncHead();

  async function compute() {
    if (!v.details.open) return;
    const { live, current } = p;
    if (!live || !current?.live) {
      v.note.textContent =
        "Start the live model (above) to follow one head of it on this text, stage by stage.";
      v.view.replaceChildren();
      return;
    }
    const window = current.window,
      T = window.length;
    const t = chosen.position === null ? T - 1 : Math.min(chosen.position, T - 1);
    const target =
      chosen.target !== null ? chosen.target : t < T - 1 ? window[t + 1] : argmax(current.logits);
    v.position.max = String(T - 1);
    v.position.value = String(t);
    v.target.value = String(target);
    v.targetName.textContent = `"${show(p.tokenStr(target))}"`;
    const req = {
      layer: model.get("layer"),
      head: model.get("head"),
      position: t,
      target,
      mask: p.mask,
    };
    if (rotary.yes) req.pair = Number(v.pair.value);
    const t0 = performance.now();
    const inputs = await live.head(window, req);
    rotary.yes = inputs.rope !== null;
    v.pairLabel.style.display = rotary.yes ? "" : "none";
    if (rotary.yes) v.pair.max = String(inputs.q.length / 2 - 1);
    const names = window.map((id) => p.tokenStr(id));
    v.view.replaceChildren(headPanel(inputs, { names }));
    v.note.textContent =
      "A click on a token of the context picks the query; a click on a head in the panel above " +
      "picks the head. The row A[t, \u00b7] is the heads panel's row t of this head.";
    const { mask, ...asked } = req;
    answers += 1;
    report(
      p.v.root,
      { headMs: (performance.now() - t0).toFixed(1), headAsked: asked, headN: answers },
      { headInputs: inputs, headTrace: traceHead(inputs) },
    );
  }

  const redo = () => p.act(() => compute());
  v.details.addEventListener("toggle", () => {
    if (v.details.open) redo();
  });
  const pickHead = () => {
    model.set("layer", Number(v.layer.value));
    model.set("head", Number(v.head.value));
    model.save_changes();
  };
  v.layer.addEventListener("change", pickHead);
  v.head.addEventListener("change", pickHead);
  for (const name of ["change:layer", "change:head"]) {
    life.on(name, () => {
      syncHead();
      if (v.details.open) redo();
    });
  }
  v.position.addEventListener("change", () => {
    const t = Number(v.position.value);
    chosen.position = Number.isInteger(t) && t >= 0 ? t : null;
    chosen.target = null; // the default token follows the query
    redo();
  });
  v.target.addEventListener("change", () => {
    const id = Number(v.target.value);
    chosen.target = Number.isInteger(id) && id >= 0 && id < cfg.d_vocab ? id : null;
    redo();
  });
  v.pair.addEventListener("change", redo);
  // a click on a token of the context (playground_draw.js's drawTokens) picks the query
  p.v.tokenRow.addEventListener("click", (e) => {
    const tok = e.target.closest?.(".gptlib-play-tok");
    if (!tok || !v.details.open || !p.current?.live) return;
    const all = [...p.v.tokenRow.querySelectorAll(".gptlib-play-tok")];
    const i = all.indexOf(tok) - (all.length - p.current.window.length); // in the window
    if (i < 0) return;
    chosen.position = i;
    chosen.target = null;
    redo();
  });
  // a new text starts from the defaults
  const reset = () => {
    chosen.position = chosen.target = null;
  };
  return { compute, reset };
}
