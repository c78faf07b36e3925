"""Training-step benchmark: gptlib GPT vs HF GPT2LMHeadModel on the CPU, and model FLOP utilisation.

    python bench/bench_model.py [--repeats 9]

One forward + backward + AdamW step, the same config, weights, batch and optimiser (fused AdamW)
for both models, measured back to back in one run (``gptlib.timing.alternating_rounds``): the two
alternate (and swap who goes first each round) so that machine noise hits both, and the medians are
compared. The fp32 matmul rate is measured in the same rounds. Targets: time ratio gptlib / HF
<= 1.00; model FLOP/s >= 75% of the measured matmul rate at d_model 256.

Model FLOPs per step: ``gptlib.flops.training_flops``, the book's one convention (PaLM's model
FLOPs): 6 N_mm + 12 n_layers n_ctx d_attn per token, N_mm the weights of the matrix products,
attention counted over all n_ctx keys. The matmul rate is ``gptlib.flops.matmul_flops_per_s``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from gptlib.flops import matmul_flops_per_s, training_flops
from gptlib.hf import from_hf
from gptlib.timing import alternating_rounds

D_MODEL, N_LAYERS, N_HEADS, N_CTX, BATCH, VOCAB = 256, 4, 4, 256, 8, 8192


def step_fn(model, logits_of, ids, targets):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        logits = logits_of(model, ids)  # (B, T, d_vocab)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_layer=N_LAYERS,
            n_head=N_HEADS,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="sdpa",
        )
    )
    ours = from_hf(hf)
    hf.train(), ours.train()
    ids = torch.randint(0, VOCAB, (BATCH, N_CTX))
    targets = torch.randint(0, VOCAB, (BATCH, N_CTX))
    steps = {
        "gptlib": step_fn(ours, lambda m, x: m(x), ids, targets),
        "HF": step_fn(hf, lambda m, x: m(x).logits, ids, targets),
    }
    rates = []  # the fp32 matmul rate, measured after every round
    times = alternating_rounds(
        steps,
        args.repeats,
        warmup=2,
        after_round=lambda: rates.append(matmul_flops_per_s(1024, repeats=3, products=8)),
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = statistics.median(rates)
    tokens = BATCH * N_CTX
    flops = training_flops(ours.config, tokens)
    ratios = [a / b for a, b in zip(times["gptlib"], times["HF"])]
    print(
        f"config: d_model={D_MODEL}, n_layers={N_LAYERS}, n_heads={N_HEADS}, n_ctx={N_CTX}, "
        f"batch={BATCH}, "
        f"d_vocab={VOCAB}; {torch.get_num_threads()} threads; {args.repeats} alternating rounds"
    )
    print(f"step time (median): gptlib {med['gptlib'] * 1e3:.0f} ms, HF {med['HF'] * 1e3:.0f} ms")
    # The headline ratio pairs the two steps of each round (same machine state), then takes
    # the median.
    print(
        f"  ratio gptlib / HF: {statistics.median(ratios):.2f}x (target <= 1.00x; median of the "
        "per-round "
        f"ratios, which range {min(ratios):.2f} to {max(ratios):.2f}; ratio of the medians "
        f"{med['gptlib'] / med['HF']:.2f}x)"
    )
    print(f"measured fp32 matmul rate (1024^3, median of rounds): {peak / 1e9:.0f} GFLOP/s")
    print(f"model FLOPs per step: {flops / 1e9:.1f} GFLOP")
    for k in steps:
        print(
            f"  {k} model FLOP/s: {flops / med[k] / 1e9:.0f} GFLOP/s = "
            f"{100 * flops / med[k] / peak:.0f}% of the matmul rate"
            + (" (target >= 75%)" if k == "gptlib" else "")
        )


if __name__ == "__main__":
    main()
