"""Training-throughput benchmark: the book's Trainer vs a plain loop over HF GPT2LMHeadModel.

    python bench/bench_train.py

Same config, same batches, same AdamW settings, measured back to back in one run; tokens/s of each,
and CPU model FLOP utilisation (``gptlib.flops.training_flops``) against the fp32 matmul rate
measured in the same run (``gptlib.flops.matmul_flops_per_s``).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from gptlib.flops import matmul_flops_per_s, training_flops
from gptlib.model import GPT
from gptlib.training import Trainer, TrainConfig, param_groups


D_MODEL, N_LAYERS, N_HEADS, N_CTX, BATCH, VOCAB, STEPS = 128, 4, 4, 128, 16, 2048, 30


def main() -> None:
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS,
                                    n_head=N_HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                    bos_token_id=0, eos_token_id=0))
    ours = GPT.from_hf(hf)
    data = torch.randint(0, VOCAB, (4096, N_CTX + 1), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1], data[:, 1:]
    tc = TrainConfig(steps=STEPS + 3, batch_size=BATCH, warmup=1, eval_every=10_000)

    trainer = Trainer(ours, (x, y), None, tc)
    opt = torch.optim.AdamW(param_groups(hf, tc.weight_decay), lr=tc.max_lr, betas=tc.betas)
    g = torch.Generator().manual_seed(0)

    def hf_steps(n):
        hf.train()
        for _ in range(n):
            i = torch.randint(0, len(x), (BATCH,), generator=g)
            loss = F.cross_entropy(hf(x[i]).logits.reshape(-1, VOCAB), y[i].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), tc.grad_clip)
            opt.step()

    trainer.run(3)  # warm-up
    hf_steps(3)
    t_ours = t_hf = 0.0
    for _ in range(STEPS // 5):  # alternate blocks of 5 steps
        t0 = time.perf_counter()
        trainer.run(5)
        t_ours += time.perf_counter() - t0
        t0 = time.perf_counter()
        hf_steps(5)
        t_hf += time.perf_counter() - t0
    tokens = STEPS * BATCH * N_CTX
    peak = matmul_flops_per_s(1024, repeats=3, products=8)
    flops = training_flops(ours.config, tokens)  # the book's convention (gptlib.flops)
    print(f"config: d_model={D_MODEL}, n_layers={N_LAYERS}, n_ctx={N_CTX}, batch={BATCH}, d_vocab={VOCAB}; {STEPS} steps each")
    print(f"gptlib Trainer: {tokens / t_ours:,.0f} tokens/s | plain HF loop: {tokens / t_hf:,.0f} tokens/s | "
          f"ratio {t_hf / t_ours:.2f}x")
    print(f"fp32 matmul rate {peak / 1e9:.0f} GFLOP/s; CPU MFU: gptlib {100 * flops / t_ours / peak:.0f}%, "
          f"HF {100 * flops / t_hf / peak:.0f}%")


if __name__ == "__main__":
    main()
