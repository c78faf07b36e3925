"""The live model's forward pass: the exported ONNX graph under onnxruntime against PyTorch.

    python bench/bench_live.py [--repeats 15]

The HTML book's playground runs gptlib.export's graph of the English model in onnxruntime-web
(WebAssembly, one thread); Jupyter and Colab run gptlib.export.readout in PyTorch. This measures,
back to back in one run on one thread, one forward pass of the English model at T = 16, 64 and 128
tokens: the graph in onnxruntime (native CPU build: the same graph and kernels the page's
WebAssembly build compiles), readout in PyTorch (the kernel's path: every pattern and stream read
out), and the plain forward pass (fused attention, logits only) as the peer. It prints the medians
and their ratios. The budgets of the page itself (first result after start, time per drawn token,
bytes downloaded) are measured in the browser by tests/test_browser_live.py, which prints them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from gptlib.export import OUTPUTS, readout, to_onnx
from gptlib.model import GPT

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import onnxruntime as ort

    torch.set_num_threads(1)
    model = GPT.load(ROOT / "models" / "english").eval()
    built = ROOT / "book_static" / "live" / "english.onnx"
    graph = built.read_bytes() if built.is_file() else to_onnx(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(0)
    print(
        f"English model, one thread; graph {len(graph) / 1e6:.1f} MB "
        f"({'make book' if built.is_file() else 'exported now'})"
    )
    print(
        f"{'T':>4} {'ONNX (ms)':>10} {'readout (ms)':>13} {'forward (ms)':>13} "
        f"{'ONNX/readout':>13} {'ONNX/forward':>13}"
    )
    for T in (16, 64, 128):
        ids = torch.randint(0, model.config.d_vocab, (1, T), generator=g)
        feed = {"ids": ids.numpy()}
        runs = {
            "onnx": lambda: session.run(list(OUTPUTS), feed),
            "readout": lambda: readout(model, ids),
            "forward": lambda: model(ids),
        }
        times = {k: [] for k in runs}
        with torch.no_grad():
            for f in runs.values():  # warm up
                f()
            for r in range(args.repeats):
                for k in list(runs) if r % 2 == 0 else list(runs)[::-1]:  # alternate who goes first
                    t0 = time.perf_counter()
                    runs[k]()
                    times[k].append(time.perf_counter() - t0)
        med = {k: 1000 * statistics.median(v) for k, v in times.items()}
        print(
            f"{T:>4} {med['onnx']:>10.2f} {med['readout']:>13.2f} {med['forward']:>13.2f} "
            f"{med['onnx'] / med['readout']:>12.2f}x {med['onnx'] / med['forward']:>12.2f}x"
        )


if __name__ == "__main__":
    main()
