// The live model in the kernel (Jupyter, Colab): the widget's custom messages to its Python object,
// which answers with PyTorch (gptlib/widgets/live.py: ping, start, encode, step).
import { fromBase64, LiveError, lensTops } from "./backend.js";
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

// Is a kernel listening? (Jupyter, Colab; a static page never answers.) A ping answered by a pong
// within timeoutMs, tried up to `tries` times: a kernel busy with a cell, or a comm still opening,
// may miss the first. A promise of true or false.
export async function pingKernel(ask, tries = 3, timeoutMs = 1000) {
  for (let i = 0; i < tries; i++) {
    try {
      await ask({ kind: "ping" }, timeoutMs);
      return true;
    } catch (e) {
      if (e instanceof LiveError && e.message !== "no answer") return false; // closed, or refused
    }
  }
  return false;
}

// How many leading entries a and b share.
const sharedPrefix = (a, b) => {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
};

const view = (b, T) => new T(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

// The kernel's backend: each run sends the whole window, and the kernel (gptlib.widgets.live's
// LiveKernel) answers with step on an empty cache (PyTorch is fast enough there); of the
// attention rows it sends only those the page lacks, cut to the heads panel's window (rows.js),
// which this backend keeps with the ids and head mask they are of.
export async function kernelBackend(ask) {
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
    run: async (ids, { mask = null, lens = null, targets = null } = {}) => {
      const t0 = performance.now();
      const T = ids.length,
        m = mask ? Array.from(mask) : null,
        mKey = m ? m.join(",") : "";
      const from = Math.min(mKey === heldMask ? sharedPrefix(heldIds, ids) : 0, win.held(), T - 1);
      const { buffers } = await ask({
        kind: "step",
        ids,
        mask: m,
        lens,
        targets,
        window: PANEL_WINDOW,
        rows_from: from,
      });
      const [logits, attn, lensIds, lensLogits, lensLse, direct, entropy] = buffers;
      const rows = rowsWanted(from, T - from);
      win.addCut(view(attn, Float32Array), view(entropy, Float32Array), from, T - from, rows);
      heldIds = ids.slice();
      heldMask = mKey;
      const heads = win.heads();
      return {
        logits: view(logits, Float32Array),
        patterns: heads.patterns,
        positions: heads.positions,
        entropy: heads.entropy,
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
