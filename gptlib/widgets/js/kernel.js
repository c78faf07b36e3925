// The live model in the kernel (Jupyter, Colab): the widget's custom messages to its Python object,
// which answers with PyTorch (gptlib/widgets/live.py: ping, start, encode, step).
import { fromBase64, LiveError, lensTops } from "./backend.js";
import { sharedPrefix } from "./page.js";
import { PANEL_WINDOW, rowsWanted, rowWindow } from "./rows.js";

// Custom messages to the kernel, each answered by one message with the same `req`:
// ask(content, timeoutMs) is a promise of {msg, buffers}. ask.close() stops listening, clears the
// timers and rejects what is still waiting (the view is closed).
export function kernelLink(model) {
  let req = 0;
  const waiting = new Map(),
    timers = new Set();
  const listener = (msg, buffers) => {
    const w = msg && waiting.get(msg.req);
    if (!w) return;
    waiting.delete(msg.req);
    if (msg.kind === "error") w.reject(new LiveError(msg.message));
    else w.resolve({ msg, buffers: buffers || [] });
  };
  model.on("msg:custom", listener);
  const ask = (content, timeoutMs) =>
    new Promise((resolve, reject) => {
      const id = ++req;
      waiting.set(id, { resolve, reject });
      try {
        model.send({ ...content, req: id });
      } catch (e) {
        waiting.delete(id);
        reject(e);
        return;
      }
      if (timeoutMs) {
        const t = setTimeout(() => {
          timers.delete(t);
          if (waiting.delete(id)) reject(new LiveError("no answer"));
        }, timeoutMs);
        timers.add(t);
      }
    });
  ask.close = () => {
    model.off("msg:custom", listener);
    timers.forEach(clearTimeout);
    timers.clear();
    for (const w of waiting.values()) w.reject(new LiveError("the view was closed"));
    waiting.clear();
  };
  return ask;
}

// Is a kernel listening? (Jupyter, Colab; a static page never answers.) A ping, and another after
// each wait of `waits` (ms) without a pong: a kernel busy with "Run All" answers once its cells
// are done, a cold Colab start or a comm still opening later still, so any ping's pong counts,
// however late, until the last wait is over. A promise of true or false (false also when the view
// is closed or the kernel refuses).
export function pingKernel(ask, waits = [1000, 2000, 4000, 8000, 15000]) {
  return new Promise((resolve) => {
    let done = false,
      timer = null,
      k = 0;
    const finish = (yes) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(yes);
    };
    const ping = () => {
      if (done) return;
      ask({ kind: "ping" }).then(
        () => finish(true),
        (e) => {
          if (e instanceof LiveError) finish(false); // closed, or refused
          // anything else (a comm not yet open refused the send): the next ping tries again
        },
      );
      if (k < waits.length) timer = setTimeout(ping, waits[k++]);
      else timer = setTimeout(() => finish(false), 0);
    };
    ping();
  });
}

// How long a kernel's step may take before the view says it got no answer.
export const STEP_TIMEOUT_MS = 60_000;

const view = (b, T) => new T(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

// The kernel's backend: each run sends the whole window, and the kernel (gptlib.widgets.live's
// LiveKernel) answers with step on an empty cache (PyTorch is fast enough there; nothing to keep
// in step between the two sides but the rows), computing only what is asked. A run with `rows`
// gets the heads panel's window of the patterns (rows.js): the kernel computes and sends only
// the rows the page lacks, cut to the window, which this backend keeps with the ids and head
// mask they are of; a run without gets none (patterns null). A step the kernel does not answer
// within timeoutMs fails with a LiveError that says so (its `timeout` true); a late answer is
// dropped.
export async function kernelBackend(ask, timeoutMs = STEP_TIMEOUT_MS) {
  const { msg } = await ask({ kind: "start" });
  const c = msg.config,
    L = c.n_layers,
    H = c.n_heads,
    K = msg.lens_top;
  const win = rowWindow(L, H);
  let heldIds = [],
    heldMask = null;
  return {
    kind: "kernel",
    describe: "PyTorch in the kernel",
    config: c,
    tokens: msg.tokens,
    bytes: msg.token_bytes.map(fromBase64),
    special: msg.special || {},
    chat: msg.chat || null,
    encode: async (text) => (await ask({ kind: "encode", text })).msg.ids,
    memory: () => null,
    // one head at one query of the window `ids` (head.js's inputs): gptlib.widgets.head's
    // head_reply, under the head mask `mask`
    head: async (ids, { mask = null, ...req }) =>
      (await ask({ kind: "head", ids, ...req, mask: mask ? Array.from(mask) : null }, timeoutMs))
        .msg.inputs,
    run: async (
      ids,
      { mask = null, lens = null, targets = null, rows = false, patterns = true } = {},
    ) => {
      const t0 = performance.now();
      const T = ids.length,
        m = mask ? Array.from(mask) : null,
        mKey = m ? m.join(",") : "";
      // the first query whose row the page lacks: the rows held are of heldIds under heldMask
      const from = rows
        ? Math.min(mKey === heldMask ? sharedPrefix(heldIds, ids) : 0, win.held(T), T - 1)
        : 0;
      const request = { kind: "step", ids, mask: m, lens, targets, rows };
      if (rows) Object.assign(request, { window: PANEL_WINDOW, rows_from: from });
      let answer;
      try {
        answer = await ask(request, timeoutMs);
      } catch (e) {
        if (!(e instanceof LiveError) || e.message !== "no answer") throw e;
        const late = new LiveError(
          `the kernel gave no answer within ${timeoutMs / 1000} s (busy with a cell, ` +
            "interrupted or stopped?): try again once it is idle, or restart it",
        );
        late.timeout = true;
        throw late;
      }
      const [logits, attn, lensIds, lensLogits, lensLse, direct, entropy] = answer.buffers;
      let heads = { patterns: null, positions: null, entropy: null }; // none without rows
      if (rows) {
        const r = rowsWanted(from, T - from);
        win.addCut(view(attn, Float32Array), view(entropy, Float32Array), from, T - from, r);
        heldIds = ids.slice();
        heldMask = mKey;
        if (patterns) heads = win.heads();
      }
      return {
        logits: view(logits, Float32Array),
        ...heads,
        lens: lens
          ? lensTops(
              view(lensIds, BigInt64Array),
              view(lensLogits, Float32Array),
              view(lensLse, Float32Array),
              lens.length,
              K,
            )
          : null,
        direct: targets?.length ? view(direct, Float32Array) : null,
        ms: performance.now() - t0,
      };
    },
  };
}
