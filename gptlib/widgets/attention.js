// Attention view (AttentionView): the panel of heads.js on patterns and scores stored in the state.
function render({ model, el }) {
  const root = make("div", "gptlib-widget gptlib-attn");
  el.appendChild(root);
  const panel = attentionPanel(root, {
    get: () => [model.get("layer"), model.get("head")],
    set: (layer, head) => { model.set("layer", layer); model.set("head", head); model.save_changes(); },
  });
  panel.update({
    title: model.get("title"), tokens: model.get("tokens"), patterns: model.get("patterns"),
    layerLabels: model.get("layer_labels"), headLabels: model.get("head_labels"), scores: model.get("scores"),
  });
  model.on("change:layer", panel.redraw);
  model.on("change:head", panel.redraw);
}
export default { render };
