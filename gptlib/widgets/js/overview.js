// Every head at a glance: one small cell per head (layers down, heads across), coloured by a score
// the reader chooses, for the attention panel (heads.js). The pointer over a cell, or the keyboard
// (arrow keys move, Enter or a click chooses), shows that head's pattern in the panel's detail.
import { make, report } from "./dom.js";

// Each cell's side in pixels: a few pixels for a deep model (30 layers: 14), larger for a small
// one, so that the grid is about 420 px tall at most and never under 14 px a cell (a finger's
// reach is larger: a touch on a cell chooses it, and the detail shows which head it was).
export function cellSize(L) {
  return Math.max(14, Math.min(28, Math.floor(420 / L)));
}

// The overview's element and its methods. hooks: preview(l, h) (the pointer or the keyboard is on
// a head; null, null when it leaves; called at most once a frame, with the latest),
// pick(l, h) (a click, Enter or Space on a head).
export function headGrid(hooks) {
  const box = make("div", "gptlib-attn-overview");
  let next; // the head to preview at the next frame (null: none), or undefined when none waits
  const preview = (l, h) => {
    if (next === undefined)
      requestAnimationFrame(() => {
        hooks.preview(...next);
        next = undefined;
      });
    next = [l, h];
  };
  box.setAttribute("role", "group");
  let cells = [], // cells[l][h]: the head's button
    at = [0, 0]; // the cell the keyboard is on (the one in the tab order)

  // The grid for L layers (labels `layerLabels`) and the heads `headLabels`; `groups[h]` the key-
  // value head h reads (a gap between groups), or null.
  function build(layerLabels, headLabels, groups) {
    const L = layerLabels.length,
      H = headLabels.length,
      px = cellSize(L);
    box.style.gridTemplateColumns = `max-content repeat(${H}, ${px}px)`;
    box.style.gridAutoRows = `${px}px`;
    box.setAttribute(
      "aria-label",
      `every head, ${L} layers down and ${H} heads across: the arrow keys move, Enter chooses`,
    );
    const items = [make("div", "")];
    for (let h = 0; h < H; h++) {
      const c = make("div", "gptlib-attn-ov-head", String(h));
      c.title = headLabels[h];
      if (groups && h > 0 && groups[h] !== groups[h - 1]) c.classList.add("kv-start");
      items.push(c);
    }
    cells = layerLabels.map((lab, l) => {
      items.push(make("div", "gptlib-attn-ov-layer", lab));
      return headLabels.map((hl, h) => {
        const b = make("button", "gptlib-attn-thumb");
        b.type = "button";
        b.tabIndex = -1;
        b.dataset.layer = String(l);
        b.dataset.head = String(h);
        b.setAttribute("aria-label", `${lab}, ${hl}`); // screen readers, touch
        if (groups && h > 0 && groups[h] !== groups[h - 1]) b.classList.add("kv-start");
        items.push(b);
        return b;
      });
    });
    box.replaceChildren(...items);
    at = [Math.min(at[0], L - 1), Math.min(at[1], H - 1)];
    cells[at[0]][at[1]].tabIndex = 0;
  }

  // The cells coloured: colourOf(l, h) -> CSS colour, titleOf(l, h) -> the hover text; `mask`
  // (n_layers * n_heads, 0 ablated) strikes out the heads ablated.
  function paint(colourOf, titleOf, mask) {
    cells.forEach((row, l) => {
      row.forEach((b, h) => {
        b.style.background = colourOf(l, h);
        const off = !!mask && mask[l * row.length + h] !== 1;
        b.classList.toggle("ablated", off);
        b.title = titleOf(l, h) + (off ? " (ablated)" : "");
      });
    });
  }

  // The chosen head outlined (and the keyboard's place, unless it is on another cell).
  function choose(l, h) {
    for (const row of cells) for (const b of row) b.classList.remove("selected");
    const b = cells[l]?.[h];
    if (!b) return;
    b.classList.add("selected");
    if (!box.contains(document.activeElement)) moveTo(l, h, false);
  }

  function moveTo(l, h, focus) {
    cells[at[0]][at[1]].tabIndex = -1;
    at = [l, h];
    const b = cells[l][h];
    b.tabIndex = 0;
    if (focus) b.focus();
  }

  listen(box, preview, hooks.pick, {
    size: () => [cells.length, cells[0]?.length || 0],
    at: () => at,
    moveTo,
  });

  return { box, build, paint, choose };
}

// The overview's pointer and keys: preview(l, h) for the head under the pointer or the keyboard's
// focus (null, null when both leave), pick(l, h) for a click, Enter or Space; nav: size() ->
// [layers, heads], at() -> the keyboard's cell, moveTo(l, h, focus).
function listen(box, preview, pick, nav) {
  const headOf = (e) => {
    const b = e.target.closest?.(".gptlib-attn-thumb");
    return b && box.contains(b) ? [Number(b.dataset.layer), Number(b.dataset.head)] : null;
  };
  box.addEventListener("mouseover", (e) => {
    const lh = headOf(e);
    if (lh) preview(...lh);
  });
  box.addEventListener("mouseleave", () => {
    if (!box.contains(document.activeElement)) preview(null, null);
  });
  box.addEventListener("click", (e) => {
    const lh = headOf(e);
    if (lh) {
      nav.moveTo(...lh, false);
      pick(...lh);
    }
  });
  box.addEventListener("focusin", (e) => {
    const lh = headOf(e);
    if (lh) preview(...lh);
  });
  box.addEventListener("focusout", (e) => {
    if (!box.contains(e.relatedTarget)) preview(null, null);
  });
  const MOVES = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  box.addEventListener("keydown", (e) => {
    const d = MOVES[e.key];
    if (!d || !nav.size()[0]) return;
    e.preventDefault();
    const l = Math.min(nav.size()[0] - 1, Math.max(0, nav.at()[0] + d[0]));
    const h = Math.min(nav.size()[1] - 1, Math.max(0, nav.at()[1] + d[1]));
    nav.moveTo(l, h, true);
    report(box, { at: `${l}/${h}` });
  });
}
