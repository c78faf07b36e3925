// Helpers every widget module starts with (the Python side joins the files into one module).

// A token made readable: spaces as "␣", newlines as "↵".
export const show = (t) => String(t).replace(/ /g, "\u2423").replace(/\n/g, "\u21b5");

// An element with a class and a text (both optional).
export function make(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// An SVG element with attributes and a text (optional).
export function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, String(v)));
  if (text !== undefined) e.textContent = text;
  return e;
}
