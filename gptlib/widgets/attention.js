// Attention view: one head's pattern as a heatmap, query tokens down, key tokens across.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "gptlib-widget gptlib-attn";
  const title = document.createElement("div");
  title.className = "gptlib-title";
  const controls = document.createElement("div");
  controls.className = "gptlib-controls";
  const layerSel = document.createElement("select");
  layerSel.className = "gptlib-attn-layer";
  const headSel = document.createElement("select");
  headSel.className = "gptlib-attn-head";
  controls.append("layer ", layerSel, " head ", headSel);
  const grid = document.createElement("div");
  grid.className = "gptlib-attn-grid";
  const focus = document.createElement("div");
  focus.className = "gptlib-attn-focus";
  focus.textContent = "hover a query token (a row) to see where it looks";
  root.append(title, controls, grid, focus);
  el.appendChild(root);

  const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");

  function options(sel, labels, value) {
    sel.replaceChildren(...labels.map((lab, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = lab;
      return o;
    }));
    sel.value = String(value);
  }

  function draw() {
    const tokens = model.get("tokens");
    const T = tokens.length;
    const layer = model.get("layer"), head = model.get("head");
    const A = model.get("patterns")[layer][head];
    title.textContent = model.get("title");
    options(layerSel, model.get("layer_labels"), layer);
    options(headSel, model.get("head_labels"), head);
    grid.style.gridTemplateColumns = `max-content repeat(${T}, 22px)`;
    const cells = [document.createElement("div")];
    const keys = tokens.map((t) => {
      const k = document.createElement("div");
      k.className = "gptlib-attn-key";
      k.textContent = show(t);
      cells.push(k);
      return k;
    });
    for (let i = 0; i < T; i++) {
      const q = document.createElement("div");
      q.className = "gptlib-attn-query";
      q.textContent = show(tokens[i]);
      const row = [q];
      for (let j = 0; j < T; j++) {
        const c = document.createElement("div");
        c.className = "gptlib-attn-cell" + (j > i ? " masked" : "");
        if (j <= i) c.style.background = `rgba(76, 114, 176, ${A[i][j]})`;
        c.title = `${show(tokens[i])} -> ${show(tokens[j])}: ${A[i][j].toFixed(3)}`;
        row.push(c);
      }
      const enter = () => {
        row.forEach((c) => c.style.outline = "1px solid #c00");
        // The keys this query attends to, shaded by their weight.
        keys.forEach((k, j) => { k.style.background = j <= i ? `rgba(204, 0, 0, ${0.6 * A[i][j]})` : ""; });
        q.style.fontWeight = "bold";
        const top = A[i].map((a, j) => [a, j]).filter(([, j]) => j <= i).sort((x, y) => y[0] - x[0]).slice(0, 3);
        focus.textContent = `query "${show(tokens[i])}" attends to ` +
          top.map(([a, j]) => `"${show(tokens[j])}" (${a.toFixed(2)})`).join(", ");
        root.dataset.focus = String(i);
      };
      const leave = () => {
        row.forEach((c) => c.style.outline = "");
        keys.forEach((k) => { k.style.background = ""; });
        q.style.fontWeight = "";
      };
      row.forEach((c) => { c.addEventListener("mouseenter", enter); c.addEventListener("mouseleave", leave); });
      cells.push(...row);
    }
    grid.replaceChildren(...cells);
    // A fingerprint of what is drawn, for tests: the diagonal of the shown pattern.
    root.dataset.view = `${layer}/${head}:` + A.map((r, i) => r[i].toFixed(3)).join(",");
  }

  layerSel.addEventListener("change", () => { model.set("layer", Number(layerSel.value)); model.save_changes(); draw(); });
  headSel.addEventListener("change", () => { model.set("head", Number(headSel.value)); model.save_changes(); draw(); });
  model.on("change:layer", draw);
  model.on("change:head", draw);
  draw();
}
export default { render };
