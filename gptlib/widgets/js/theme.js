// The page's background, watched for the heads panel (heads.js), whose colour scale starts at it.
// What is behind an element can change with no event of its own: a theme switch (the book's
// data-theme and data-mode on <html>, JupyterLab's data-jp-theme-* on <body>, classes and styles
// that Colab, VS Code and others set on either), a stylesheet added or loaded, or the system's
// dark mode under an automatic theme (prefers-color-scheme). watchBackground listens to those and
// calls changed() at most once a frame, and once more a little later (a theme's stylesheet may
// arrive after the attribute that asks for it); changed() reads the background again (one
// getComputedStyle up the tree) and redraws only where it differs. Nothing is read per step.

// The attributes of <html> and <body> that themes set.
export const THEME_ATTRIBUTES = [
  "class",
  "style",
  "data-theme",
  "data-mode",
  "data-jp-theme-light",
  "data-jp-theme-name",
];

// How long after a signal the background is read a second time (ms).
export const SETTLE_MS = 400;

// Watch the background behind `root`: changed() after each signal (coalesced to one call a frame,
// and one SETTLE_MS later), until stop() or until `root` has left the page (then it stops
// itself). `env` is the global object (a test gives a stand-in). Returns {soon, stop}: soon()
// asks for a read at the next frame (a root not yet in the page has no background to read: it
// is waited for, a frame at a time, for up to 60 frames).
export function watchBackground(root, changed, env = globalThis) {
  const doc = env.document;
  const undo = [];
  let frame = false,
    stopped = false,
    later = null,
    inPage = false, // the root has been in the page
    waits = 0; // the frames a root not yet in the page has been waited for
  const check = () => {
    frame = false;
    if (stopped) return;
    if (root.isConnected) {
      inPage = true;
      changed();
    } else if (inPage) {
      stop(); // the view has left the page
    } else if (++waits < 60) {
      soon(); // not in the page yet (a view is put there after it is drawn)
    }
  };
  const soon = () => {
    if (stopped || frame) return;
    frame = true;
    (env.requestAnimationFrame || ((f) => env.setTimeout(f, 16)))(check);
  };
  const signal = () => {
    soon();
    if (later !== null) env.clearTimeout(later);
    later = env.setTimeout(() => {
      later = null;
      soon();
    }, SETTLE_MS);
  };
  function stop() {
    if (stopped) return;
    stopped = true;
    if (later !== null) env.clearTimeout(later);
    for (const f of undo.splice(0)) f();
  }
  if (typeof env.MutationObserver === "function" && doc) {
    const seen = new env.MutationObserver(signal);
    const attrs = { attributes: true, attributeFilter: THEME_ATTRIBUTES };
    if (doc.documentElement) seen.observe(doc.documentElement, attrs);
    if (doc.body) seen.observe(doc.body, attrs);
    if (doc.head) seen.observe(doc.head, { childList: true }); // a stylesheet added or removed
    undo.push(() => seen.disconnect());
  }
  if (doc?.addEventListener) {
    // a stylesheet that finishes loading (load events do not bubble: seen while capturing)
    const loaded = (e) => {
      if (e.target?.tagName === "LINK") signal();
    };
    doc.addEventListener("load", loaded, true);
    undo.push(() => doc.removeEventListener("load", loaded, true));
  }
  const dark = env.matchMedia?.("(prefers-color-scheme: dark)");
  if (dark?.addEventListener) {
    dark.addEventListener("change", signal);
    undo.push(() => dark.removeEventListener("change", signal));
  }
  return { soon, stop };
}
