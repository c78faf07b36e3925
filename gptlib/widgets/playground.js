// Playground (PlaygroundView): the book's GPT on the reader's own text. Before the live model
// starts, the page shows the analysis stored in the widget state. Started, it computes with one
// of two backends, and draws the same way with either:
//   - the kernel (Jupyter, Colab): PyTorch, reached by the widget's custom messages;
//   - the page itself (the HTML book, no kernel): onnxruntime-web (WebAssembly, one thread) runs
//     the graph gptlib.export writes, and @huggingface/tokenizers the BPE; both are files the
//     book serves itself (vendored from npm), loaded only when the reader starts the live model.

const VENDOR = {
  ort: "vendor/onnxruntime-web/ort.wasm.min.mjs",
  ortDir: "vendor/onnxruntime-web/",
  tokenizers: "vendor/tokenizers/tokenizers.min.mjs",
};

class LiveError extends Error {}

// The folder the book serves its static files from (".../_static/"), found from its scripts.
export function staticBase(doc = document) {
  for (const s of doc.querySelectorAll("script[src]")) {
    const i = s.src.lastIndexOf("/_static/");
    if (i >= 0) return s.src.slice(0, i + "/_static/".length);
  }
  return null;
}

function fromBase64(s) {
  const b = atob(s), u = new Uint8Array(b.length);
  for (let i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
  return u;
}

// The top n of a row of logits (ties: the lower id first), with their probabilities at
// temperature 1: one pass, no sort of the whole vocabulary.
export function topTokens(logits, n) {
  let m = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > m) m = logits[i];
  let z = 0;
  const top = [];  // [logit, id], best first
  for (let i = 0; i < logits.length; i++) {
    const y = logits[i];
    z += Math.exp(y - m);
    if (top.length < n || y > top[top.length - 1][0]) {
      let k = top.length;
      while (k > 0 && top[k - 1][0] < y) k--;
      top.splice(k, 0, [y, i]);
      if (top.length > n) top.pop();
    }
  }
  return { ids: top.map(([, i]) => i), probs: top.map(([y]) => Math.exp(y - m) / z) };
}

// Custom messages to the kernel, each answered by one message with the same `req`.
export function kernelLink(model) {
  let req = 0;
  const waiting = new Map();
  model.on("msg:custom", (msg, buffers) => {
    const w = msg && waiting.get(msg.req);
    if (!w) return;
    waiting.delete(msg.req);
    if (msg.kind === "error") w.reject(new LiveError(msg.message));
    else w.resolve({ msg, buffers: buffers || [] });
  });
  return (content, timeoutMs) => new Promise((resolve, reject) => {
    const id = ++req;
    waiting.set(id, { resolve, reject });
    try {
      model.send({ ...content, req: id });
    } catch (e) {
      waiting.delete(id);
      reject(e);
      return;
    }
    if (timeoutMs) setTimeout(() => { if (waiting.delete(id)) reject(new LiveError("no answer")); }, timeoutMs);
  });
}

const f32 = (b) => new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));

export async function kernelBackend(ask) {
  const { msg } = await ask({ kind: "start" });
  return {
    kind: "kernel",
    describe: "PyTorch in the kernel",
    config: msg.config,
    tokens: msg.tokens,
    bytes: msg.token_bytes.map(fromBase64),
    encode: async (text) => (await ask({ kind: "encode", text })).msg.ids,
    forward: async (ids) => {
      const { buffers } = await ask({ kind: "forward", ids });
      return { logits: f32(buffers[0]), patterns: f32(buffers[1]), lens: f32(buffers[2]) };
    },
  };
}

const FILE_PAGE = "The live model cannot start here: this page was opened from a file (file://), and browsers do " +
  "not let such pages load WebAssembly. Serve the book over http (for instance `python -m http.server` in " +
  "the built book's folder) or run the notebook in Jupyter or Colab. What is shown is the stored analysis.";
const NO_HOST = "The live model needs a running kernel (Jupyter, Colab) or the HTML book served over http, " +
  "and neither is here. What is shown is the stored analysis.";

async function fetchOk(url, what) {
  let r;
  try {
    r = await fetch(url);
  } catch (e) {
    throw new LiveError(`could not fetch ${what} (${url}): ${e.message}`);
  }
  if (!r.ok) throw new LiveError(`could not fetch ${what} (${url}): HTTP ${r.status}`);
  return r;
}

async function browserBackend(source, weightsSha, progress) {
  if (location.protocol === "file:") throw new LiveError(FILE_PAGE);
  const base = staticBase();
  if (!base) throw new LiveError(NO_HOST);
  const manifestUrl = new URL(source, base).href;
  progress("reading the model's manifest");
  const manifest = await (await fetchOk(manifestUrl, "the model's manifest")).json();
  if (manifest.format !== "gptlib-live" || manifest.version !== 1) {
    throw new LiveError(`${manifestUrl} is not a gptlib live-model manifest (version 1)`);
  }
  if (weightsSha && manifest.weights_sha256 !== weightsSha) {
    throw new LiveError(`the model the book serves (${manifest.name}) is not the model this view was made from ` +
      "(their weights differ), so the page will not run it in its place.");
  }
  progress(`loading the model (${(manifest.onnx.bytes / 1e6).toFixed(1)} MB), onnxruntime-web and the tokenizer`);
  const file = (f) => new URL(f, manifestUrl).href;
  const [ort, tk, tokJson, onnxBytes] = await Promise.all([
    import(base + VENDOR.ort),
    import(base + VENDOR.tokenizers),
    fetchOk(file(manifest.tokenizer.file), "the tokenizer").then((r) => r.json()),
    fetchOk(file(manifest.onnx.file), "the model").then((r) => r.arrayBuffer()),
  ]);
  if (onnxBytes.byteLength !== manifest.onnx.bytes) {
    throw new LiveError(`${manifest.onnx.file} has ${onnxBytes.byteLength} bytes, the manifest says ${manifest.onnx.bytes}`);
  }
  if (globalThis.crypto && crypto.subtle) {  // only in secure contexts (https, localhost)
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", onnxBytes));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    if (hex !== manifest.onnx.sha256) throw new LiveError(`${manifest.onnx.file} does not match its SHA-256 in the manifest`);
  }
  ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which static hosts lack
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = base + VENDOR.ortDir;
  progress("starting onnxruntime-web");
  const session = await ort.InferenceSession.create(new Uint8Array(onnxBytes), { executionProviders: ["wasm"] });
  const tokenizer = new tk.Tokenizer(tokJson, {});
  const V = manifest.config.d_vocab;
  return {
    kind: "browser",
    describe: "the page itself (onnxruntime-web, WebAssembly, one thread)",
    config: manifest.config,
    tokens: manifest.tokens,
    bytes: manifest.token_bytes.map(fromBase64),
    encode: async (text) => tokenizer.encode(text, { add_special_tokens: false }).ids,
    forward: async (ids) => {
      const T = ids.length;
      const input = new ort.Tensor("int64", BigInt64Array.from(ids, (i) => BigInt(i)), [1, T]);
      const out = await session.run({ ids: input });
      const r = { logits: out.logits.data.slice((T - 1) * V, T * V), patterns: out.patterns.data.slice(), lens: out.lens.data.slice() };
      Object.values(out).forEach((t) => t.dispose && t.dispose());
      return r;
    },
  };
}

function render({ model, el }) {
  const cfg = model.get("config");
  const { n_layers: L, n_heads: H, n_ctx } = cfg;
  const storedTokens = model.get("tokens");
  const root = make("div", "gptlib-widget gptlib-play");
  const title = make("div", "gptlib-title", model.get("title"));

  // The text box and the live model's switch.
  const box = make("textarea", "gptlib-play-text");
  box.rows = 3;
  box.spellcheck = false;
  box.value = model.get("text");
  box.setAttribute("aria-label", "text for the model");
  const startBtn = make("button", "gptlib-play-start", "start the live model");
  startBtn.type = "button";
  const status = make("div", "gptlib-play-status");
  const startRow = make("div", "gptlib-controls");
  startRow.append(startBtn, status);

  // The tokens of the context, and the text it decodes to.
  const tokenRow = make("div", "gptlib-play-tokens");
  const out = make("div", "gptlib-samp-text gptlib-play-out");

  // Sampling controls.
  const controls = samplingControls(Math.max(100, model.get("top_k")));
  const seedBox = make("input", "gptlib-play-seed");
  seedBox.type = "number"; seedBox.min = "0"; seedBox.max = "4294967295"; seedBox.step = "1";
  const button = (cls, text) => { const b = make("button", cls, text); b.type = "button"; return b; };
  const sampleBtn = button("gptlib-samp-step", "sample next token");
  const greedyBtn = button("gptlib-play-greedy", "greedy");
  const undoBtn = button("gptlib-samp-undo", "undo");
  const resetBtn = button("gptlib-samp-reset", "reset");
  const buttons = make("div", "gptlib-controls");
  const seedLabel = make("label", "gptlib-play-seed-label");
  seedLabel.append("seed ", seedBox);
  buttons.append(sampleBtn, greedyBtn, undoBtn, resetBtn, seedLabel);
  const msg = make("div", "gptlib-samp-msg");
  const stats = make("div", "gptlib-samp-stats");
  const chart = svg("svg", { class: "gptlib-samp-chart" });

  // The logit lens, then every head.
  const lens = make("div", "gptlib-play-lens");
  const heads = make("div", "gptlib-play-heads");
  const section = (text) => make("div", "gptlib-play-section", text);
  root.append(title, box, startRow, tokenRow, out,
              section("Next token"), ...controls.rows, buttons, msg, stats, chart, chartKey(),
              section("Logit lens: the next token read off the residual stream after each block (LN_f, then W_U; temperature 1)"), lens,
              section("Every head on this text"), heads);
  el.appendChild(root);

  const panel = attentionPanel(heads, {
    get: () => [model.get("layer"), model.get("head")],
    set: (layer, head) => { model.set("layer", layer); model.set("head", head); model.save_changes(); },
  });

  // --- state -------------------------------------------------------------------------------
  let live = null, starting = null, busy = false, startedAt = null;
  let promptIds = model.get("stored").ids, path = [];
  let rng = xorshift32(model.get("seed")), draws = 0;
  let current = null;  // the analysis shown: {window, logits, patterns, lens}
  const cache = new Map();  // analyses by context, for undo
  const ask = kernelLink(model);
  // Is a kernel listening? (Jupyter, Colab.) A static page never answers.
  let kernelAnswered = false;
  const kernel = ask({ kind: "ping" }, 1500).then(() => (kernelAnswered = true), () => false);

  const tokenStr = (id) => (live ? live.tokens[id] : storedTokens[String(id)]);
  const settings = () => ({ T: model.get("temperature"), k: model.get("top_k"), tp: model.get("top_p") });
  const setStatus = (text, state) => { status.textContent = text; if (state) root.dataset.live = state; };
  const layerLabels = [...Array(L).keys()].map((l) => `layer ${l}`);
  const headLabels = [...Array(H).keys()].map((h) => `head ${h}`);
  const lensLabels = ["embedding", ...[...Array(L).keys()].map((l) => `after block ${l + 1}`)];

  function decodeIds(ids) {
    const parts = ids.map((i) => live.bytes[i]);
    const all = new Uint8Array(parts.reduce((s, b) => s + b.length, 0));
    let at = 0;
    parts.forEach((b) => { all.set(b, at); at += b.length; });
    // invalid bytes become U+FFFD, as in BPETokenizer.decode; a leading U+FEFF is text, not a mark
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(all);
  }

  // The analysis of a context from the backend's flat arrays.
  function fromLive(window, r) {
    const T = window.length, V = cfg.d_vocab;
    const patterns = [...Array(L).keys()].map((l) => [...Array(H).keys()].map((h) =>
      [...Array(T).keys()].map((i) => r.patterns.subarray(((l * H + h) * T + i) * T, ((l * H + h) * T + i + 1) * T))));
    const lensTops = [...Array(L + 1).keys()].map((l) => topTokens(r.lens.subarray(l * V, (l + 1) * V), model.get("lens_top")));
    return { window, logits: r.logits, patterns, lens: lensTops, raw: r };
  }

  function fromStored() {
    const s = model.get("stored");
    return { window: s.ids.slice(-n_ctx), logits: s.logits, patterns: s.patterns, lens: s.lens, raw: null };
  }

  // --- drawing ------------------------------------------------------------------------------
  function drawTokens() {
    const ctx = promptIds.concat(path), first = ctx.length - Math.min(ctx.length, n_ctx);
    tokenRow.replaceChildren(make("span", "gptlib-play-count",
      `${promptIds.length} token(s)` + (path.length ? ` + ${path.length} drawn` : "") + (first ? `; the model sees the last ${n_ctx}` : "") + ": "),
      ...ctx.map((id, i) => {
        const s = make("span", "gptlib-play-tok" + (i >= promptIds.length ? " new" : "") + (i < first ? " out" : ""), show(tokenStr(id)));
        s.title = `token ${i}: id ${id}` + (live ? `, bytes ${Array.from(live.bytes[id], (b) => b.toString(16).padStart(2, "0")).join(" ")}` : "") +
          (i < first ? " (outside the model's window)" : "");
        return s;
      }));
    if (live) {
      const all = decodeIds(ctx), head = decodeIds(promptIds);
      const cont = all.startsWith(head) ? all.slice(head.length) : decodeIds(path);
      out.replaceChildren(make("span", "gptlib-samp-ctx", box.value), make("span", "gptlib-samp-new", cont));
    } else {
      out.replaceChildren(make("span", "gptlib-samp-ctx", box.value));
    }
  }

  function drawDistribution() {
    if (!current) return;
    const { T, k, tp } = settings();
    controls.show(T, k, tp);
    const d = distribution(current.logits, T, k, tp), g = distribution(current.logits, 1, 0, 1);
    const V = current.logits.length, kept = d.p.filter((v) => v > 0).length;
    stats.textContent = `entropy ${entropy(d.p).toFixed(3)} nats; ${kept} of the ${V} tokens can be drawn`;
    const { rows, other } = chartRows(d, g, model.get("n_show"), tokenStr, V);
    drawChart(chart, rows, other, tp);
    root.dataset.settings = JSON.stringify({ temperature: T, top_k: k, top_p: tp });
    root.__gptlib = { ...(root.__gptlib || {}), probs: d.p };
  }

  function drawLens() {
    lens.replaceChildren(...current.lens.map((top, l) => {
      const r = make("div", "gptlib-play-lens-row");
      r.append(make("span", "gptlib-play-lens-label", lensLabels[l]),
               ...top.ids.map((id, n) => {
                 const c = make("span", "gptlib-play-lens-tok", `${show(tokenStr(id))} ${top.probs[n].toFixed(2)}`);
                 c.style.setProperty("--p", String(top.probs[n]));
                 return c;
               }));
      return r;
    }));
  }

  function draw() {
    const t0 = performance.now();
    drawTokens();
    if (!current) return;
    drawDistribution();
    drawLens();
    const t1 = performance.now();
    const tokens = current.window.map(tokenStr);
    panel.update({ tokens, patterns: current.patterns, layerLabels, headLabels, scores: headScores(current.patterns, current.window) });
    root.dataset.drawMs = `${(t1 - t0).toFixed(1)}+${(performance.now() - t1).toFixed(1)}`;
    root.__gptlib = { ...(root.__gptlib || {}), window: current.window, logits: current.logits, patterns: current.raw ? current.raw.patterns : null,
                      lensRaw: current.raw ? current.raw.lens : null, lens: current.lens };
    root.dataset.ids = JSON.stringify(promptIds.concat(path));
    root.dataset.window = JSON.stringify(current.window);
    root.dataset.path = JSON.stringify(path);
    root.dataset.draws = String(draws);
    root.dataset.lens = JSON.stringify(current.lens);
  }

  function enable() {
    const ready = !!live && !busy && promptIds.length > 0;
    sampleBtn.disabled = greedyBtn.disabled = !ready && !!live;
    undoBtn.disabled = !ready || path.length === 0;
    resetBtn.disabled = !ready || path.length === 0;
    root.dataset.busy = busy ? "1" : "0";
  }

  // --- computing ----------------------------------------------------------------------------
  async function run() {
    const ctx = promptIds.concat(path);
    if (!ctx.length) {  // nothing to compute on: clear what belonged to the last text
      msg.textContent = "Type some text: the model needs at least one token.";
      current = null;
      [stats, chart, lens].forEach((e) => e.replaceChildren());
      heads.style.display = "none";
      drawTokens();
      return;
    }
    heads.style.display = "";
    const window = ctx.slice(-n_ctx);  // past n_ctx the window slides, as gptlib.sampling.generate does
    const key = window.join(",");
    let a = cache.get(key);
    if (!a) {
      const t0 = performance.now();
      const r = await live.forward(window);
      const ms = performance.now() - t0;
      a = fromLive(window, r);
      root.dataset.ms = ms.toFixed(1);
      if (cache.size > 64) cache.delete(cache.keys().next().value);
      cache.set(key, a);
      setStatus(`live: ${live.describe}; last forward pass ${ms.toFixed(0)} ms`);
    }
    current = a;
    draw();
    if (startedAt !== null) {  // the time from "start" to the first result drawn
      root.dataset.firstMs = (performance.now() - startedAt).toFixed(0);
      startedAt = null;
    }
  }

  async function act(f) {
    if (busy) return;
    busy = true;
    enable();
    const t0 = performance.now();
    try {
      await f();
      root.dataset.actMs = (performance.now() - t0).toFixed(1);  // the last action, forward pass and drawing
    } catch (e) {
      msg.textContent = `The live model failed: ${e.message}`;
      root.dataset.error = e.message;
    } finally {
      busy = false;
      enable();
    }
  }

  async function start() {
    if (live) return true;
    if (!starting) {
      starting = (async () => {
        startBtn.disabled = true;
        setStatus("starting the live model\u2026", "starting");
        const t0 = performance.now();
        startedAt = t0;
        try {
          const inPage = () => browserBackend(model.get("source"), model.get("weights_sha256"),
                                              (s) => setStatus(`starting the live model: ${s}\u2026`));
          // The kernel if it answered; else the page, when it is served over http with the book's
          // files; else wait for the kernel's answer (the page's own error says why it cannot).
          let backend;
          if (kernelAnswered) backend = await kernelBackend(ask);
          else if (staticBase() && location.protocol !== "file:") backend = await inPage();
          else backend = (await kernel) ? await kernelBackend(ask) : await inPage();
          live = backend;
          root.dataset.startMs = (performance.now() - t0).toFixed(0);
          // For tests and the curious (the browser's console): the tokenizer and decoder in use.
          root.__gptlib = { ...(root.__gptlib || {}), encode: live.encode, decode: decodeIds };
          startBtn.style.display = "none";
          setStatus(`live: ${live.describe}`, live.kind);
          return true;
        } catch (e) {
          setStatus(e instanceof LiveError ? e.message : `The live model could not start: ${e.message}`, "failed");
          root.dataset.error = e.message;
          startBtn.disabled = false;
          starting = startedAt = null;
          return false;
        }
      })();
    }
    return starting;
  }

  async function retext() {
    if (!(await start())) return;
    promptIds = await live.encode(box.value);
    path = [];
    rng = xorshift32(model.get("seed"));
    draws = 0;
    msg.textContent = "";
    await run();
  }

  async function drawNext(greedy) {
    if (!(await start())) return;
    if (!current || !promptIds.length) return;
    let id;
    if (greedy) {
      id = byLogit(current.logits)[0];
    } else {
      const { T, k, tp } = settings();
      const d = distribution(current.logits, T, k, tp);
      const u = rng();
      draws += 1;
      id = drawIndex(d.p, d.order, u);
      root.dataset.u = String(u);
    }
    path.push(id);
    msg.textContent = "";
    await run();
  }

  // --- events -------------------------------------------------------------------------------
  let typing = null;
  box.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      model.set("text", box.value);
      model.save_changes();
      act(retext);
    }, 250);
  });
  startBtn.addEventListener("click", () => act(async () => { if (await start()) await retext(); }));
  sampleBtn.addEventListener("click", () => act(() => drawNext(false)));
  greedyBtn.addEventListener("click", () => act(() => drawNext(true)));
  undoBtn.addEventListener("click", () => act(async () => { path.pop(); msg.textContent = ""; await run(); }));
  resetBtn.addEventListener("click", () => act(async () => {
    path = []; rng = xorshift32(model.get("seed")); draws = 0; msg.textContent = ""; await run();
  }));
  seedBox.value = String(model.get("seed"));
  seedBox.addEventListener("change", () => {
    const s = Number(seedBox.value);
    if (!Number.isInteger(s) || s < 0 || s >= 2 ** 32) { seedBox.value = String(model.get("seed")); return; }
    model.set("seed", s);
    model.save_changes();
    act(async () => { path = []; rng = xorshift32(s); draws = 0; if (live) await run(); });
  });
  const set = (name, v) => { model.set(name, v); model.save_changes(); drawDistribution(); };
  controls.onInput(set);
  ["temperature", "top_k", "top_p", "n_show"].forEach((n) => model.on(`change:${n}`, drawDistribution));
  model.on("change:layer", panel.redraw);
  model.on("change:head", panel.redraw);
  model.on("change:text", () => {  // set from Python, in a kernel
    if (box.value === model.get("text")) return;
    box.value = model.get("text");
    if (live) act(retext);
  });

  // The stored analysis until the reader starts the live model; in a kernel, start at once.
  current = fromStored();
  setStatus("This is the stored analysis of the text above. Start the live model to edit the text and to sample: " +
            "the page then runs the model itself (or the kernel does, in Jupyter and Colab).", "off");
  draw();
  enable();
  kernel.then((yes) => { if (yes) act(async () => { if (await start()) await retext(); }); });
}
export default { render };
