"""Training-step benchmark: gptlib GPT vs HF GPT2LMHeadModel on the CPU, and model FLOP utilisation.

    python bench/bench_model.py

One forward + backward + AdamW step, same config and weights, measured alternately in one run
(medians). Targets (issue 4): time ratio gptlib / HF <= 1.00; model FLOP/s >= 75% of the fp32
matmul rate measured in the same run (HF reaches about 78% on these machines).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from gptlib.model import GPT

D_MODEL, N_LAYERS, N_HEADS, N_CTX, BATCH, VOCAB = 256, 4, 4, 256, 8, 8192


def matmul_peak(n: int = 1024, reps: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best


def step_fn(model, logits_of, ids, targets):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        logits = logits_of(model, ids)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS,
                                    n_head=N_HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                    bos_token_id=0, eos_token_id=0, attn_implementation="sdpa"))
    ours = GPT.from_hf(hf)
    hf.train(), ours.train()
    ids = torch.randint(0, VOCAB, (BATCH, N_CTX))
    targets = torch.randint(0, VOCAB, (BATCH, N_CTX))
    steps = {
        "gptlib": step_fn(ours, lambda m, x: m(x), ids, targets),
        "HF": step_fn(hf, lambda m, x: m(x).logits, ids, targets),
    }
    for s in steps.values():  # warm-up
        s(), s()
    times = {k: [] for k in steps}
    for _ in range(7):
        for k, s in steps.items():  # alternate so that machine noise hits both
            t0 = time.perf_counter()
            s()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = matmul_peak()
    n_params = ours.num_parameters(exclude_positional=True)
    tokens = BATCH * N_CTX
    flops = 6 * n_params * tokens + 6 * N_LAYERS * N_CTX * D_MODEL * tokens  # weights + attention scores
    print(f"config: d_model={D_MODEL}, n_layers={N_LAYERS}, n_heads={N_HEADS}, n_ctx={N_CTX}, batch={BATCH}, "
          f"d_vocab={VOCAB}; {torch.get_num_threads()} threads")
    print(f"step time: gptlib {med['gptlib'] * 1e3:.0f} ms, HF {med['HF'] * 1e3:.0f} ms")
    print(f"  ratio gptlib / HF: {med['gptlib'] / med['HF']:.2f}x (target <= 1.00x)")
    print(f"measured fp32 matmul rate: {peak / 1e9:.0f} GFLOP/s")
    for k in steps:
        print(f"  {k} model FLOP/s: {flops / med[k] / 1e9:.0f} GFLOP/s = {100 * flops / med[k] / peak:.0f}% of the matmul rate"
              + (" (target >= 75%)" if k == "gptlib" else ""))


if __name__ == "__main__":
    main()
