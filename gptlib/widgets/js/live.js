// The live model of a view: connect() is the one way in, for every view that runs a model (the
// playground, the sampling view past its stored tree). It gives a backend, one of two with one API:
//   {kind, describe, config, tokens, bytes, special, chat, encode(text) -> ids,
//    run(ids, {mask, lens, targets, rows, patterns}) -> {logits, patterns, positions, entropy,
//      total, lens, direct, ms},
//    memory(),
//    head(ids, {layer, head, position, target, pair, mask}) -> head.js's inputs}
// - the kernel (Jupyter, Colab; kernel.js): PyTorch (gptlib.step.step on the whole context) in
//   the widget's Python object (gptlib/widgets/live.py), reached by the widget's custom messages;
// - the page itself (the HTML book, no kernel; page.js): onnxruntime-web runs the step graph
//   gptlib.export writes, one session per model per page, shared by every view of that model.
// `mask` is (n_layers * n_heads) numbers, 1 keeps a head and 0 ablates it; `lens` the residual
// streams (0 .. n_layers) to read through the logit lens at the last position, or null; `targets`
// token ids whose logit each head adds to directly, or null; `rows` the heads panel's attention
// rows of the new positions, kept by the backend and returned as `patterns` (its window, each
// head's cut when first read) with total(l, h, pairs) (rows.js's heads()), unless `patterns` is
// false (a step of a run: the rows are kept, the patterns built once at its end).
import { LiveError, staticBase } from "./backend.js";
import { kernelBackend, kernelLink, pingKernel } from "./kernel.js";
import { sharedPageBackend } from "./page.js";

export { LiveError, megabytes, tabNeeds } from "./backend.js";

// The live model of the widget `model`, whose state names the manifest (`source`) and the weights
// (`weights_sha256`) of the page's files. Returns
//   {kernel: a promise of true when a kernel answers (false on a static page),
//    backend(hooks): a promise of the backend, started once (hooks, for the page's backend:
//      progress(text, fraction or null); confirm(manifest) -> promise of true to download),
//    close(): stop listening to the kernel (the view is closed)}.
// The kernel if it answered; else the page, when it holds the book's files or was opened from a
// file; else the kernel's answer decides, which may take the check's ~30 s of pings (the page's
// own error says why it cannot run there).
export function connect(model) {
  const ask = kernelLink(model);
  let answered = false;
  const kernel = pingKernel(ask).then((yes) => {
    answered = yes;
    return yes;
  });
  const inPage = (hooks) =>
    sharedPageBackend(model.get("source"), model.get("weights_sha256"), hooks);
  const start = async (hooks) => {
    if (answered) return kernelBackend(ask);
    // a page opened from a file has no kernel either: its own error says why, without waiting
    if (staticBase() || location.protocol === "file:") return inPage(hooks);
    return (await kernel) ? kernelBackend(ask) : inPage(hooks);
  };
  let backend = null;
  return {
    kernel,
    backend(hooks = {}) {
      if (!backend) {
        backend = start(hooks);
        backend.catch(() => {
          backend = null; // a failed start may be tried again
        });
      }
      return backend;
    },
    close: () => ask.close(),
  };
}

// A start's failure as the view says it: a LiveError's message is written for the reader.
export const startError = (e) =>
  e instanceof LiveError ? e.message : `The live model could not start: ${e.message}`;
