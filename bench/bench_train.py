"""Training-throughput benchmark at the shipped model's config: the Trainer's model FLOP/s over the
matmul rate measured in the same run, and a plain HF GPT2LMHeadModel loop as a peer.

    python bench/bench_train.py [--rounds 6] [--threads 2]

The config is the CPU preset of gptlib.recipes (the one `make model` trains), on the thread count it
trains with. Rounds alternate (and swap their order; ``gptlib.timing.alternating_rounds``): 5
Trainer
steps, 5 HF steps, one fp32 matmul-rate measurement, so machine noise hits all three alike; medians
are compared.
Model FLOPs are ``gptlib.flops.training_flops`` (3 forward passes per token, matrix products only,
every key position counted as in PaLM's MFU); the rate is ``gptlib.flops.matmul_flops_per_s``.
Target: Trainer model FLOP/s >= 70% of the matmul rate.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from gptlib.flops import matmul_flops_per_s, training_flops
from gptlib.hf import from_hf
from gptlib.recipes import PRESETS
from gptlib.timing import alternating_rounds
from gptlib.trainer import Trainer
from gptlib.training import param_groups

BLOCK = 5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2, help="the shipped model trains on 2 threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rc = PRESETS["cpu"]
    cfg = rc.model
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.d_vocab,
            n_positions=cfg.n_ctx,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="sdpa",
        )
    )
    ours = from_hf(hf)
    data = torch.randint(
        0, cfg.d_vocab, (4096, cfg.n_ctx + 1), generator=torch.Generator().manual_seed(1)
    )
    x, y = data[:, :-1], data[:, 1:]
    tc = rc.train
    trainer = Trainer(ours, (x, y), None, tc)
    opt = torch.optim.AdamW(param_groups(hf, tc.weight_decay), lr=tc.max_lr, betas=tc.betas)
    g = torch.Generator().manual_seed(0)

    def hf_steps(n: int) -> None:
        hf.train()
        for _ in range(n):
            i = torch.randint(0, len(x), (tc.batch_size,), generator=g)
            loss = F.cross_entropy(hf(x[i]).logits.reshape(-1, cfg.d_vocab), y[i].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), tc.grad_clip)
            opt.step()

    runs = {"gptlib Trainer": lambda: trainer.run(BLOCK), "HF loop": lambda: hf_steps(BLOCK)}
    rates = []  # the fp32 matmul rate, measured after every round
    times = alternating_rounds(
        runs,
        args.rounds,
        warmup=1,
        per_call=BLOCK,
        after_round=lambda: rates.append(matmul_flops_per_s(1024, repeats=3, products=8)),
    )
    tokens = tc.batch_size * cfg.n_ctx
    flops = training_flops(cfg, tokens)  # per step
    peak = statistics.median(rates)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"shipped CPU config: d_model={cfg.d_model}, n_layers={cfg.n_layers}, "
        f"n_heads={cfg.n_heads}, n_ctx={cfg.n_ctx}, "
        f"d_vocab={cfg.d_vocab}, batch={tc.batch_size}; {torch.get_num_threads()} thread(s); "
        f"{args.rounds} rounds of "
        f"{BLOCK} steps"
    )
    print(
        f"fp32 matmul rate (1024^3, median of rounds): {peak / 1e9:.1f} GFLOP/s; model FLOPs per "
        f"step {flops / 1e9:.2f} G"
    )
    for k, t in med.items():
        print(
            f"  {k:<15} {t * 1e3:6.0f} ms/step  {tokens / t:7,.0f} tokens/s  model FLOP/s "
            f"{flops / t / 1e9:5.1f} G = "
            f"{100 * flops / t / peak:.0f}% of the matmul rate"
            + (" (target >= 70%)" if k.startswith("gptlib") else "")
        )
    print(f"  Trainer / HF time ratio: {med['gptlib Trainer'] / med['HF loop']:.2f}x")


if __name__ == "__main__":
    main()
