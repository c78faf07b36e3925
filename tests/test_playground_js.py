"""The playground's drawing during a run and the heads panel's watch on the page's background,
run with node on stand-ins for the DOM: a run (or a click) draws only the tokens added since its
last drawing, and the row it grows is the row a whole drawing makes (gptlib/widgets/js/
playground_draw.js's drawTokens); the background is read again when a theme may have changed
it (attributes of <html> and <body>, a stylesheet, the system's dark mode), at most once a
frame, and the watch ends with its view (gptlib/widgets/js/theme.js)."""

from __future__ import annotations

from node_support import import_as, run_node

# Elements enough for drawTokens: classes, text, title, children appended or replaced.
FAKE_DOM = """
class El {
  constructor(tag) { this.tag = tag; this.children = []; this.className = ""; this.own = "";
    this.title = ""; this.style = {};
    const el = this;
    this.classList = { add(c) { if (!el.className.split(" ").includes(c))
      el.className = (el.className ? el.className + " " : "") + c; } }; }
  append(...c) { this.children.push(...c); }
  replaceChildren(...c) { this.children = [...c]; }
  setAttribute() {}
  set textContent(t) { this.own = String(t); this.children = []; }
  get textContent() { return [this.own, ...this.children.map((c) => c.textContent)].join(""); }
}
globalThis.document = { createElement: (tag) => new El(tag) };
const spans = (row) => row.children.slice(1).map((s) => [s.className, s.textContent, s.title]);
"""

# A playground `p` as drawTokens reads it: 12 tokens "a".."l", each one byte.
PLAYGROUND = """
const letters = "abcdefghijkl";
const live = { bytes: [...letters].map((c) => Uint8Array.of(c.charCodeAt(0))) };
const playground = (nCtx) => ({
  v: { tokenRow: new El("div"), out: new El("div"), box: { value: "" } },
  live, cfg: { n_ctx: nCtx }, promptIds: [0, 1, 2], path: [],
  tokenStr: (id) => letters[id],
});
"""


def test_a_run_grows_the_token_row_a_whole_drawing_makes():
    js = run_node(
        FAKE_DOM
        + import_as("d", "playground_draw.js")
        + PLAYGROUND
        + """
const out = {};
for (const nCtx of [64, 6]) {
  const p = playground(nCtx);
  d.drawTokens(p);
  const firstSpan = p.v.tokenRow.children[1];
  const grown = [];
  for (const id of [3, 4, 5, 6, 7, 8, 9]) {
    p.path.push(id);
    if (p.path.length % 2 === 0) d.drawTokens(p, true);
  }
  d.drawTokens(p, true);
  const whole = playground(nCtx);
  whole.path = p.path.slice();
  d.drawTokens(whole);
  out[nCtx] = { grown: spans(p.v.tokenRow), whole: spans(whole.v.tokenRow),
    count: [p.v.tokenRow.children[0].textContent, whole.v.tokenRow.children[0].textContent],
    text: [p.v.out.textContent, whole.v.out.textContent],
    kept: p.v.tokenRow.children[1] === firstSpan };
}
// another path (a restart, an undo then new draws): the row is drawn whole again
const p = playground(64);
p.path.push(3, 4);
d.drawTokens(p);
const before = p.v.tokenRow.children[1];
p.path = [5];
d.drawTokens(p, true);
out.restart = { row: spans(p.v.tokenRow), kept: p.v.tokenRow.children[1] === before };
p.path.pop();
p.path.push(6);
d.drawTokens(p, true);
out.changed = spans(p.v.tokenRow).map((s) => s[1]).join("");
// an earlier token changed, the last the same (an undo of two, then two draws)
const q = playground(64);
q.path.push(3, 4);
d.drawTokens(q);
q.path.splice(0, 2, 5, 4);
d.drawTokens(q, true);
out.earlier = spans(q.v.tokenRow).map((s) => s[1]).join("");
console.log(JSON.stringify(out));
"""
    )
    for n_ctx in ("64", "6"):
        case = js[n_ctx]
        assert case["grown"] == case["whole"], n_ctx
        assert case["count"][0] == case["count"][1] and case["text"][0] == case["text"][1]
        assert case["kept"], "the spans drawn before are kept, not made again"
    assert [s[1] for s in js["64"]["grown"]] == list("abcdefghij")
    assert js["64"]["grown"][3][0] == "gptlib-play-tok new"
    # a window of 6: the 4 tokens before it are dimmed and say so
    out = [s for s in js["6"]["grown"] if "out" in s[0].split()]
    assert len(out) == 4 and all(s[2].endswith("(outside the model's window)") for s in out)
    assert js["6"]["count"][0] == "3 token(s) + 7 drawn; the model sees the last 6: "
    assert [s[1] for s in js["restart"]["row"]] == list("abcf") and not js["restart"]["kept"]
    assert js["changed"] == "abcg"  # the last token changed: drawn whole, not appended
    assert js["earlier"] == "abcfe"  # so did an earlier one: drawn whole too


# Stand-ins for what watchBackground uses: MutationObserver, matchMedia, animation frames and
# timers that the test runs by hand.
FAKE_ENV = """
const log = [];
const frames = [], timers = new Map();
let nextTimer = 0;
class MO { constructor(f) { this.f = f; MO.all.push(this); }
  observe(target, opts) { log.push(["observe", target.name, opts.attributeFilter || "childList"]); }
  disconnect() { log.push(["disconnect"]); } }
MO.all = [];
const media = { listeners: [], addEventListener(t, f) { this.listeners.push(f); },
  removeEventListener(t, f) { this.listeners = this.listeners.filter((g) => g !== f); } };
const docListeners = [];
const env = {
  document: { documentElement: { name: "html" }, body: { name: "body" }, head: { name: "head" },
    addEventListener: (t, f) => docListeners.push(f),
    removeEventListener: (t, f) => docListeners.splice(docListeners.indexOf(f), 1) },
  MutationObserver: MO,
  matchMedia: (q) => { log.push(["media", q]); return media; },
  requestAnimationFrame: (f) => frames.push(f),
  setTimeout: (f, ms) => { timers.set(++nextTimer, [f, ms]); return nextTimer; },
  clearTimeout: (k) => timers.delete(k),
};
const frame = () => { for (const f of frames.splice(0)) f(); };
const elapse = () => { const all = [...timers.values()]; timers.clear();
  for (const [f] of all) f(); };
"""


def test_the_background_is_read_again_when_a_theme_may_have_changed_it():
    js = run_node(
        FAKE_ENV
        + import_as("t", "theme.js")
        + """
const out = {};
const root = { isConnected: true };
let reads = 0;
const w = t.watchBackground(root, () => reads++, env);
out.watched = log.slice();
// three attribute changes in one frame: one read at the frame, one after the theme settles
MO.all[0].f(); MO.all[0].f(); MO.all[0].f();
frame();
out.atFrame = reads;
out.timer = [...timers.values()].map(([, ms]) => ms);
elapse(); frame();
out.settled = reads;
// the system's dark mode, and a stylesheet that finishes loading
media.listeners[0]();
frame();
docListeners[0]({ target: { tagName: "LINK" } });
docListeners[0]({ target: { tagName: "IMG" } });
frame(); elapse(); frame();
out.afterMedia = reads;
// the view leaves the page: the next signal stops the watch (observer, listeners, timers)
root.isConnected = false;
MO.all[0].f();
frame();
out.left = { reads, media: media.listeners.length, doc: docListeners.length,
  timers: timers.size, disconnected: log.some((e) => e[0] === "disconnect") };
MO.all[0].f(); frame(); elapse(); frame();
out.afterLeft = reads;
// a root not yet in the page: soon() waits for it a frame at a time
const later = { isConnected: false };
let laterReads = 0;
const w2 = t.watchBackground(later, () => laterReads++, env);
w2.soon();
frame(); frame();
later.isConnected = true;
frame();
out.later = laterReads;
w2.stop();
MO.all[1].f(); frame();
out.stopped = laterReads;
console.log(JSON.stringify(out));
"""
    )
    attrs = [
        "class",
        "style",
        "data-theme",
        "data-mode",
        "data-jp-theme-light",
        "data-jp-theme-name",
    ]
    assert js["watched"] == [
        ["observe", "html", attrs],
        ["observe", "body", attrs],
        ["observe", "head", "childList"],
        ["media", "(prefers-color-scheme: dark)"],
    ]
    assert js["atFrame"] == 1 and js["timer"] == [400] and js["settled"] == 2
    # the media change and the stylesheet (not the image) at their frames, and one settling read
    # for both (the second signal put off the first one's)
    assert js["afterMedia"] == 5
    assert js["left"] == {"reads": 5, "media": 0, "doc": 0, "timers": 0, "disconnected": True}
    assert js["afterLeft"] == 5
    assert js["later"] == 1 and js["stopped"] == 1


def test_the_lens_panel_opens_by_itself_only_where_the_lens_is_cheap():
    """playground_draw.js's lensIsCheap: the lens's (L + 1) d_model d_vocab multiplications a step
    against LENS_OPEN_MACS. The English model's (5 x 256 x 4,096) open the panel; SmolLM2's
    (31 x 576 x 49,152, 878 million) leave it closed until the reader opens it."""
    js = run_node(
        FAKE_DOM
        + import_as("d", "playground_draw.js")
        + """
const english = { n_layers: 4, n_heads: 4, d_head: 64, d_vocab: 4096 };
const smollm2 = { n_layers: 30, n_heads: 9, d_head: 64, d_vocab: 49152 };
console.log(JSON.stringify({ cheap: [d.lensIsCheap(english), d.lensIsCheap(smollm2)],
  limit: d.LENS_OPEN_MACS }));
"""
    )
    assert js["cheap"] == [True, False]
    assert 5 * 256 * 4096 <= js["limit"] < 31 * 576 * 49152
