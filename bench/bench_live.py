"""The live models' step: the exported ONNX graph under onnxruntime against step() in PyTorch.

    python bench/bench_live.py [--models english smollm2] [--repeats 15]

The HTML book's playground runs gptlib.export's step graph in onnxruntime-web (WebAssembly, one
thread); Jupyter and Colab run gptlib.export.step in PyTorch. This measures, back to back in one
run on one thread, the time of one new token with a cache of P = 16 and P = 200 positions, with no
logit lens (n = 0) and with the lens on n = L + 1 streams: the graph in onnxruntime (its native
CPU build: the same graph and kernels the page's WebAssembly build compiles) and step() in
PyTorch, their medians and ratio; and the session's creation time (onnxruntime unpacks SmolLM2's
4-bit blocks then) and the process's peak memory after it. The graphs are those `make book`
wrote into book_static/live, or exported now. The page's own budgets (first token after start,
time per drawn token, bytes downloaded) are measured in the browser by tests/test_browser_live.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch

from gptlib.export import INPUTS, OUTPUTS, export, export_smollm2, step, step_inputs

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "book_static" / "live"


def _graph(name: str) -> bytes:
    if not (LIVE / f"{name}.json").is_file():
        print(f"{name}: no graph in {LIVE}; exporting it now")
        (export(ROOT / "models" / "english", LIVE) if name == "english" else export_smollm2(LIVE))
    info = json.loads((LIVE / f"{name}.json").read_text("utf-8"))
    return b"".join((LIVE / p["file"]).read_bytes() for p in info["onnx"]["pieces"])


def _model(name: str):
    if name == "english":
        from gptlib.model import GPT

        return GPT.load(ROOT / "models" / "english").eval()
    from gptlib.gguf import load_smollm2

    return load_smollm2()[0]


def bench(name: str, repeats: int) -> None:
    import onnxruntime as ort

    model, data = _model(name), _graph(name)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    t0 = time.perf_counter()
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{name}: graph {len(data) / 1e6:.1f} MB, session created in {created:.2f} s, "
        f"peak RSS {rss:.0f} MB (the PyTorch model included)"
    )
    L, V = model.config.n_layers, model.config.d_vocab
    g = torch.Generator().manual_seed(0)
    print(f"{'P':>5} {'lens n':>7} {'ONNX (ms)':>10} {'step (ms)':>10} {'ONNX/step':>10}")
    for P in (16, 200):
        if P + 1 > model.config.n_ctx:
            continue
        prefix = torch.randint(0, V, (1, P), generator=g)
        past = step(model, prefix, *step_inputs(model))["present"]
        for n in (0, L + 1):
            _, mask, lens, targets = step_inputs(model, range(n), [])
            args = (torch.randint(0, V, (1, 1), generator=g), past, mask, lens, targets)
            feed = {k: t.numpy() for k, t in zip(INPUTS, args)}
            runs = {
                "onnx": lambda: session.run(list(OUTPUTS), feed),
                "step": lambda: step(model, *args),
            }
            times = {k: [] for k in runs}
            for f in runs.values():  # warm up
                f()
            for r in range(repeats):
                for k in list(runs) if r % 2 == 0 else list(runs)[::-1]:  # alternate who goes first
                    t0 = time.perf_counter()
                    runs[k]()
                    times[k].append(time.perf_counter() - t0)
            med = {k: 1000 * statistics.median(v) for k, v in times.items()}
            print(
                f"{P:>5} {n:>7} {med['onnx']:>10.2f} {med['step']:>10.2f} "
                f"{med['onnx'] / med['step']:>9.2f}x"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["english", "smollm2"])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        bench(name, args.repeats)


if __name__ == "__main__":
    main()
