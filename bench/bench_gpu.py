"""GPU figures for bench/README.md: training MFU in bf16 and KV-cache decoding against HF.

    python bench/bench_gpu.py [--json F]   # on a CUDA machine (an H100 or H200 for the book)
    python bench/bench_gpu.py --smoke      # a tiny CPU run that only checks the script works

1. Training MFU: a GPT-2-small-sized gptlib model (124M parameters, n_ctx 1024), AdamW, bf16
   autocast where ``torch.cuda.is_bf16_supported()``, optionally ``torch.compile``.
   MFU = training FLOPs per token (``gptlib.flops``: 6 N_mm + 12 n_layers n_ctx d_attn) x tokens/s
   / peak FLOP/s, with the peak given on the command line (989e12 for a dense bf16 H100 SXM) and
   the matmul rate (``gptlib.flops.matmul_flops_per_s``) measured in the same run. Four
   variants, in this order: eager with PyTorch's choice of attention kernel, eager with SDPA's
   flash kernel required, compiled with it required, and the same with the vocabulary padded
   to 50304 = 786 x 64 rows (better shaped products; the FLOPs are still counted at 50257,
   and the padded logits never win: no target is among them). A variant that cannot run says
   why.
2. Decoding: tokens/s generating 512 tokens greedily with gptlib's KV cache vs HF
   ``GPT2LMHeadModel.generate(use_cache=True)`` on the same random weights, batch 1 (measured
   before the compiled variant, whose compilation may take the most time).

``--json F`` writes every figure to F as it is measured, so a run stopped early keeps the ones
before.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
from pathlib import Path

import torch

from gptlib.flops import matmul_flops_per_s, training_flops
from gptlib.hf import from_hf
from gptlib.model import GPT, GPTConfig
from gptlib.runtime import autocast, autocast_dtype
from gptlib.timing import alternating_rounds


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def tflops(rate: float) -> str:
    """A FLOP/s rate in TFLOP/s, or in GFLOP/s below one TFLOP/s (a CPU in a smoke run)."""
    return f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.1f} GFLOP/s"


def flash_only():
    """A context in which SDPA must use its flash kernel (it raises where that cannot run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def train_mfu(
    cfg: GPTConfig,
    dev: torch.device,
    batch: int,
    steps: int,
    compile_: bool,
    peak: float,
    flash: bool = False,
    pad_vocab: int | None = None,
) -> dict:
    torch.manual_seed(0)
    shape = cfg if pad_vocab is None else dataclasses.replace(cfg, d_vocab=pad_vocab)
    model = GPT(shape).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
    step_model = torch.compile(model) if compile_ else model
    ids = torch.randint(0, cfg.d_vocab, (batch, cfg.n_ctx + 1), device=dev)
    x, y = ids[:, :-1], ids[:, 1:]

    def step():
        with autocast(dev), flash_only() if flash else contextlib.nullcontext():
            logits = step_model(x)
            loss = torch.nn.functional.cross_entropy(
                logits.float().view(-1, shape.d_vocab), y.reshape(-1)
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # three warm-up steps (and the compilation), then one timed step per round
    t = statistics.median(
        alternating_rounds({"step": step}, steps, warmup=3, sync=lambda: sync(dev))["step"]
    )
    flops_per_token = training_flops(cfg, 1)  # the real vocabulary's, padded or not
    tokens_per_s = batch * cfg.n_ctx / t
    return {
        "tokens_per_s": tokens_per_s,
        "model_flops_per_s": flops_per_token * tokens_per_s,
        "mfu": flops_per_token * tokens_per_s / peak,
        "step_s": t,
        "batch": batch,
        "n_ctx": cfg.n_ctx,
        "compile": compile_,
        "flash_required": flash,
        "d_vocab_run": shape.d_vocab,
    }


@torch.no_grad()
def decode_rate(cfg: GPTConfig, dev: torch.device, n_new: int) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from gptlib.sampling import generate

    hf_cfg = GPT2Config(
        vocab_size=cfg.d_vocab,
        n_positions=cfg.n_ctx,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_cfg).to(dev).eval()
    ours = from_hf(hf).to(dev).eval()
    prompt = torch.randint(0, cfg.d_vocab, (1, 8), device=dev)

    decoders = {
        "gptlib": lambda: generate(ours, prompt, n_new, temperature=0.0, use_cache=True),
        "HF": lambda: hf.generate(
            prompt,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompt),
        ),
    }
    out_ours, out_hf = decoders["gptlib"](), decoders["HF"]()  # the tokens compared (and a warm-up)
    times = alternating_rounds(decoders, 3, warmup=0, sync=lambda: sync(dev))
    t_ours, t_hf = statistics.median(times["gptlib"]), statistics.median(times["HF"])
    same = bool(torch.equal(out_ours.reshape(-1)[: out_hf.numel()], out_hf.reshape(-1)))
    return {
        "gptlib_tok_s": n_new / t_ours,
        "hf_tok_s": n_new / t_hf,
        "ratio": t_hf / t_ours,
        "same_tokens": same,
    }


def save(path: Path | None, results: dict) -> None:
    if path is not None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(results, indent=1) + "\n")
        os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny CPU run: checks the script, measures nothing useful",
    )
    ap.add_argument(
        "--peak",
        type=float,
        default=989e12,
        help="peak dense bf16 FLOP/s of the GPU (H100 and H200 SXM: 989e12)",
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", type=Path, help="write the figures here as they are measured")
    args = ap.parse_args()

    if args.smoke:
        dev, cfg, dcfg = (
            torch.device("cpu"),
            GPTConfig.preset("tiny"),
            GPTConfig.preset("tiny", n_ctx=128),
        )
        args.batch, args.steps, n_new = 2, 2, 32
        variants = {"eager": {}, "eager, flash": {"flash": True}}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --smoke on a CPU")
        dev = torch.device("cuda")
        cfg = GPTConfig.preset("gpt2")
        dcfg = GPTConfig.preset("gpt2")
        n_new = 512
        print(torch.cuda.get_device_name(), "bf16:", torch.cuda.is_bf16_supported())
        variants = {"eager": {}, "eager, flash": {"flash": True}}
        if not args.no_compile:
            variants["compiled, flash"] = {"compile_": True, "flash": True}
            variants["compiled, flash, vocabulary padded to 50304"] = {
                "compile_": True,
                "flash": True,
                "pad_vocab": 50304,
            }

    results = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "smoke": args.smoke,
        "training": {},
    }
    dtype = autocast_dtype(dev) or torch.float32
    n, products = (256, 3) if args.smoke else (8192, 50)
    rate = matmul_flops_per_s(n, repeats=3, device=dev, dtype=dtype, products=products)
    print(f"measured {dtype} matmul rate: {tflops(rate)}", flush=True)
    # a CPU has no data-sheet peak: the smoke run uses the measured rate
    peak = rate if args.smoke else args.peak
    results.update(matmul_flops_per_s=rate, matmul_dtype=str(dtype), peak_flops_per_s=peak)
    save(args.json, results)

    def train(name: str, compile_: bool = False, **kw) -> None:
        try:
            r = train_mfu(cfg, dev, args.batch, args.steps, compile_, peak, **kw)
        except Exception as e:  # a variant that cannot run here (no flash kernel, say)
            results["training"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"training, {name}: could not run ({type(e).__name__}: {e})"[:300], flush=True)
        else:
            r["of_matmul_rate"] = r["model_flops_per_s"] / rate
            results["training"][name] = r
            print(
                f"training, {name}: {r['tokens_per_s']:.0f} tokens/s, "
                f"{tflops(r['model_flops_per_s'])} of model FLOPs, MFU {100 * r['mfu']:.1f}% "
                f"of the {tflops(peak)} peak ({100 * r['of_matmul_rate']:.1f}% of the measured "
                "matmul rate)",
                flush=True,
            )
        save(args.json, results)

    for name, kw in variants.items():
        if not kw.get("compile_"):
            train(name, **kw)
    d = decode_rate(dcfg, dev, n_new)
    results["decoding"] = {"n_new": n_new, **d}
    save(args.json, results)
    print(
        f"decoding {n_new} tokens: gptlib {d['gptlib_tok_s']:.0f} tok/s, HF generate "
        f"{d['hf_tok_s']:.0f} tok/s, "
        f"ratio {d['ratio']:.2f}x, identical tokens: {d['same_tokens']}",
        flush=True,
    )
    for name, kw in variants.items():
        if kw.get("compile_"):
            train(name, **kw)


if __name__ == "__main__":
    main()
