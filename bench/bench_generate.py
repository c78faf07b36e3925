"""Decoding benchmark: tokens/s with and without gptlib's KV cache, and against HF generate.

    python bench/bench_generate.py [--new 256] [--reps 3] [--d-model 128 --layers 4 --heads 4]
                                   [--threads 1] [--baseline /path/to/another/checkout]
                                   [--cached-only]

Greedy decoding of 256 new tokens after an 8-token prompt, batch 1, on a small GPT-2-shaped model
(d_vocab 4096, n_ctx 1024 so no cropping happens, d_model 128, 4 heads, 4 layers by default). The HF
model is built from a ``GPT2Config`` with random weights and gptlib's copy is made with
``gptlib.hf.from_hf``, so both compute the same function (the script checks that the three paths
give
identical tokens). The runs alternate (``gptlib.timing.alternating_rounds``) and the best of
``--reps`` is kept, on one torch thread by default (``--threads``): at this size a second thread
gains little, and on a machine shared with other jobs an oversubscribed thread pool makes every
timing ten times slower and noisy. ``--baseline DIR`` adds a fourth contender: the KV-cache path
of the gptlib in another checkout ``DIR`` (imported under the package name ``gptlib_baseline``,
with the same weights), to compare two versions of the decode path in one run. ``--cached-only``
leaves out the path without a cache, which dominates the run's time at GPT-2's width.
Targets: cache >= 8x no cache at 256 new tokens; gptlib >= 1.0x HF generate; with ``--baseline``,
this checkout >= 1.0x the other.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from gptlib.hf import from_hf
from gptlib.sampling import generate
from gptlib.timing import alternating_rounds


def import_baseline(root: str):
    """The package ``gptlib`` of the checkout ``root``, imported as ``gptlib_baseline``."""
    pkg = Path(root) / "gptlib"
    if not (pkg / "__init__.py").is_file():
        raise SystemExit(f"--baseline: {pkg} holds no gptlib package")
    spec = importlib.util.spec_from_file_location(
        "gptlib_baseline", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gptlib_baseline"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=256, help="new tokens to generate")
    ap.add_argument(
        "--d-model", type=int, default=128, help="d_model of the model (d_head 32 by default)"
    )
    ap.add_argument("--layers", type=int, default=4, help="n_layers of the model")
    ap.add_argument("--heads", type=int, default=4, help="n_heads of the model")
    ap.add_argument(
        "--reps", type=int, default=3, help="interleaved repetitions (the best is kept)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both libraries")
    ap.add_argument("--baseline", help="another checkout whose gptlib KV-cache path is timed too")
    ap.add_argument("--cached-only", action="store_true", help="leave out gptlib without a cache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=4096,
        n_positions=1024,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = GPT2LMHeadModel(cfg).eval()
    ours = from_hf(hf).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 8))
    n = args.new
    run = {
        "gptlib, KV cache": lambda: generate(ours, prompt, n, temperature=0.0, use_cache=True),
        "gptlib, no cache": lambda: generate(ours, prompt, n, temperature=0.0, use_cache=False),
        "HF generate (use_cache=True)": lambda: hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        ),
    }
    if args.cached_only:
        del run["gptlib, no cache"]
    if args.baseline:
        import_baseline(args.baseline)
        base_hf = importlib.import_module("gptlib_baseline.hf")
        base_sampling = importlib.import_module("gptlib_baseline.sampling")
        theirs = base_hf.from_hf(hf).eval()
        run["baseline gptlib, KV cache"] = lambda: base_sampling.generate(
            theirs, prompt, n, temperature=0.0, use_cache=True
        )
    out = {}

    def keeping(k, f):  # the call, its tokens kept for the comparison below
        return lambda: out.__setitem__(k, f())

    with torch.no_grad():
        generate(ours, prompt, 16, temperature=0.0)
        hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )  # warm-up
        if args.baseline:
            base_sampling.generate(theirs, prompt, 16, temperature=0.0)
        times = alternating_rounds({k: keeping(k, f) for k, f in run.items()}, args.reps, warmup=0)
    best = {k: min(t) for k, t in times.items()}
    rate = {k: n / t for k, t in best.items()}
    print(
        f"greedy decoding of {n} new tokens, d_model {args.d_model}, {args.layers} layers, "
        f"{args.heads} heads, "
        f"torch threads {torch.get_num_threads()}"
    )
    for k, r in rate.items():
        print(f"  {k:<30} {r:8.0f} tokens/s")
    same = all(torch.equal(out["gptlib, KV cache"], o) for o in out.values())
    print(f"identical tokens on all {len(out)} paths: {same}")
    if "gptlib, no cache" in rate:
        speed_up = rate["gptlib, KV cache"] / rate["gptlib, no cache"]
        print(f"cache speed-up: {speed_up:.1f}x (target >= 8x at 256 tokens)")
    print(
        "gptlib / HF generate: "
        f"{rate['gptlib, KV cache'] / rate['HF generate (use_cache=True)']:.2f}x (target >= 1.0x)"
    )
    if args.baseline:
        ratio = rate["gptlib, KV cache"] / rate["baseline gptlib, KV cache"]
        print(f"gptlib / baseline ({args.baseline}): {ratio:.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
