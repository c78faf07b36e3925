// Helpers every view uses: elements, a view's lifetime, and the one hook for tests.

// How a token is shown: the book's one rule, twin of gptlib.tokenizers.base's token_text and
// token_label (a node test compares them). A token is bytes; bytesText decodes them as UTF-8 and
// writes each byte that is not part of a valid character as "<0xNN>" (so the 128 byte tokens of
// GPT-2 that are not text on their own read "<0xE2>", "<0x80>", ..., not all "\ufffd"); show
// then makes the invisible visible: a space "\u2423", a newline "\u21b5", a tab "\u21e5", any
// other control character the "<0xNN>" of its UTF-8 bytes. Tokens that come from Python as
// text (token_str) are already bytesText's output; show is what every view draws.
const hex = (b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;

// The length of the valid UTF-8 character starting at bytes[i], or 0 if there is none.
function charLength(bytes, i) {
  const b = bytes[i],
    n = bytes.length;
  const cont = (k, lo = 0x80, hi = 0xbf) => i + k < n && bytes[i + k] >= lo && bytes[i + k] <= hi;
  if (b < 0x80) return 1;
  if (b >= 0xc2 && b <= 0xdf) return cont(1) ? 2 : 0;
  if (b >= 0xe0 && b <= 0xef) {
    const [lo, hi] = b === 0xe0 ? [0xa0, 0xbf] : b === 0xed ? [0x80, 0x9f] : [0x80, 0xbf];
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (b >= 0xf0 && b <= 0xf4) {
    const [lo, hi] = b === 0xf0 ? [0x90, 0xbf] : b === 0xf4 ? [0x80, 0x8f] : [0x80, 0xbf];
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

export function bytesText(bytes) {
  const dec = new TextDecoder("utf-8", { ignoreBOM: true });
  let out = "";
  for (let i = 0; i < bytes.length; ) {
    const k = charLength(bytes, i);
    out += k ? dec.decode(bytes.subarray(i, i + k)) : hex(bytes[i]);
    i += k || 1;
  }
  return out;
}

const VISIBLE = { " ": "\u2423", "\n": "\u21b5", "\t": "\u21e5" };
export const show = (t) =>
  String(t).replace(
    // biome-ignore lint/suspicious/noControlCharactersInRegex: these are the characters to show
    /[\u0000-\u001f\u007f-\u009f ]/g,
    (c) => VISIBLE[c] || Array.from(new TextEncoder().encode(c), hex).join(""),
  );

// A long row of items (a text's tokens, a BPE split) cut to its first `head` and last `tail`
// items around a button "… N more" that puts the rest back; rows of at most limit items, and
// rows already opened by the reader (`open`), are left whole. Returns the elements to append.
export function collapse(items, { head = 40, tail = 20, limit = 80, open = false, onOpen } = {}) {
  if (open || items.length <= Math.max(limit, head + tail + 1)) return items;
  const more = button("gptlib-more", `\u2026 ${items.length - head - tail} more`);
  more.title = "show every token";
  const hidden = items.slice(head, items.length - tail);
  more.addEventListener("click", () => {
    more.replaceWith(...hidden);
    if (onOpen) onOpen();
  });
  return [...items.slice(0, head), more, ...items.slice(items.length - tail)];
}

// A seed typed by the reader: a whole number from 0 to 2^32 - 1, or null (an empty box, a
// letter, a fraction, a number out of range; an input of type number reads those as "").
export function parseSeed(text) {
  const t = String(text).trim();
  if (!/^\d+$/.test(t)) return null;
  const s = Number(t);
  return s < 2 ** 32 ? s : null;
}

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
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
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
      for (const f of undo.splice(0).reverse()) f();
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
    if (v !== undefined)
      root.dataset[k] = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
  }
  if (objects) root.__gptlib = { ...(root.__gptlib || {}), ...objects };
}
