"""Decoding benchmark: tokens/s with and without gptlib's KV cache, and against HF generate.

    python bench/bench_generate.py

512 new tokens, greedy, batch 1, on a small model (n_ctx 1024, so no cropping), same random
weights for gptlib and HF. Targets (issue 5): cache >= 5x no cache; gptlib >= 1.0x HF generate.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gptlib.model import GPT
from gptlib.sampling import generate

N_NEW = 512


def timed(fn, reps):
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=4096, n_positions=1024, n_embd=128, n_layer=4, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(cfg).eval()
    ours = GPT.from_hf(hf).eval()
    prompt = torch.randint(0, 4096, (1, 8))
    with torch.no_grad():
        run = {
            "gptlib, KV cache": lambda: generate(ours, prompt, N_NEW, temperature=0.0, use_cache=True),
            "gptlib, no cache": lambda: generate(ours, prompt, N_NEW, temperature=0.0, use_cache=False),
            "HF generate (use_cache=True)": lambda: hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                do_sample=False, use_cache=True, pad_token_id=0),
        }
        for f in run.values():  # warm-up
            f()
        res = {k: timed(f, 1 if "no cache" in k else 3) for k, f in run.items()}
    rate = {k: N_NEW / t for k, (t, _) in res.items()}
    for k, r in rate.items():
        print(f"{k:<30} {r:8.0f} tokens/s")
    same = torch.equal(res["gptlib, KV cache"][1], res["gptlib, no cache"][1]) and torch.equal(
        res["gptlib, KV cache"][1], res["HF generate (use_cache=True)"][1])
    print(f"identical tokens on all three paths: {same}")
    print(f"  cache speed-up: {rate['gptlib, KV cache'] / rate['gptlib, no cache']:.1f}x (target >= 5x)")
    print(f"  gptlib / HF generate: {rate['gptlib, KV cache'] / rate['HF generate (use_cache=True)']:.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
