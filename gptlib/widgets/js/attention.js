// Attention view (AttentionView): the panel of heads.js on patterns and scores stored in the state.
import { lifetime, make } from "./dom.js";
import { attentionPanel } from "./heads.js";

function render({ model, el }) {
  const life = lifetime(model);
  const root = make("div", "gptlib-widget gptlib-attn");
  el.appendChild(root);
  const panel = attentionPanel(root, {
    get: () => [model.get("layer"), model.get("head")],
    set: (layer, head) => {
      model.set("layer", layer);
      model.set("head", head);
      model.save_changes();
    },
  });
  panel.update({
    title: model.get("title"),
    tokens: model.get("tokens"),
    patterns: model.get("patterns"),
    layerLabels: model.get("layer_labels"),
    headLabels: model.get("head_labels"),
    scores: model.get("scores"),
  });
  life.on("change:layer", panel.redraw);
  life.on("change:head", panel.redraw);
  return () => {
    life.end();
    panel.close();
    root.remove();
  };
}

export default { render };
