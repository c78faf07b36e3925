// Helpers every view uses: elements, a view's lifetime, and the one hook for tests.

// A token made readable: spaces as "␣", newlines as "↵".
export const show = (t) => String(t).replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");

// An element with a class and a text (both optional).
export function make(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// A button (type "button": it submits no form) with a class and a text.
export function button(cls, text) {
  const b = make("button", cls, text);
  b.type = "button";
  return b;
}

// An SVG element with attributes and a text (optional).
export function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, String(v)));
  if (text !== undefined) e.textContent = text;
  return e;
}

// What a view leaves behind outside its own elements: listeners on the widget model, and tasks
// to run at the end (clear a timer, close a channel). end() undoes them all; render returns it,
// with the view's root removed, and anywidget calls that when the view is closed. Listeners on
// the view's own elements go with the elements.
export function lifetime(model) {
  const undo = [];
  return {
    on(name, f) {
      model.on(name, f);
      undo.push(() => model.off(name, f));
    },
    atEnd(f) {
      undo.push(f);
    },
    end() {
      undo.splice(0).reverse().forEach((f) => f());
    },
  };
}

// The one hook for tests. A page that sets `window.__gptlibTest = true` before the widgets load
// (the browser tests do) finds what a view draws on its root: `facts` as data-* attributes
// (strings as they are, numbers through String, other values as JSON) and `objects` (typed
// arrays, functions) in `root.__gptlib`. On any other page this does nothing.
export function report(root, facts, objects) {
  if (globalThis.__gptlibTest !== true) return;
  for (const [k, v] of Object.entries(facts || {})) {
    if (v !== undefined) root.dataset[k] = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
  }
  if (objects) root.__gptlib = { ...(root.__gptlib || {}), ...objects };
}
