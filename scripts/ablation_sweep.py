"""Zero-ablation of SmolLM2-135M's induction heads against many random controls, for Chapter 12.

    nice -n 10 python scripts/ablation_sweep.py [--out models/ablation_sweep.json]

Chapter 12 picks the five heads with the highest induction score on 4 sequences of 24 random tokens
repeated once (seed 0), zeroes them, and compares with one random set of five other heads. One
control draw and 4 sequences say little about the spread, and the heads are scored and tested on
the same sequences. This script keeps the chapter's choice of heads and measures it on
``--n-seq`` fresh sequences (seed 1, the same form), against ``--draws`` random sets of five other
heads (draw d: ``torch.randperm`` of the other heads with seed d; draw 0 is the chapter's control).
It also stores the chapter's own three numbers, which the chapter recomputes and compares. Losses
are in nats per token on the second copy (positions half .. 2 half - 2 predicting the repeat) and
on the first. One thread, every random source seeded: a rerun writes the same file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gptlib.circuits import ablate_heads, score_table
from gptlib.gguf import load_smollm2
from gptlib.hooks import capture_patterns
from gptlib.runtime import atomic_write

ROOT = Path(__file__).resolve().parents[1]
HALF, N_ABL = 24, 5


def repeated_random(n: int, seed: int) -> torch.Tensor:
    """(n, 2 HALF) sequences [r, r], r of HALF tokens drawn from ids 100 .. 19999 (as Chapter
    12)."""
    r = torch.randint(100, 20000, (n, HALF), generator=torch.Generator().manual_seed(seed))
    return torch.cat([r, r], dim=1)


def half_losses(model, seqs: torch.Tensor, batch: int = 8) -> tuple[list[float], list[float]]:
    """Per sequence: mean loss (nats) on the first copy and on the second."""
    first, second = [], []
    with torch.no_grad():
        for x in seqs.split(batch):
            logits = model(x)  # (b, T, d_vocab)
            nll = F.cross_entropy(
                logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none"
            ).view(len(x), -1)  # (b, T - 1)
            first += nll[:, : HALF - 1].mean(dim=1).tolist()
            second += nll[:, HALF:].mean(dim=1).tolist()
    return first, second


def control_heads(others: list[tuple[int, int]], seed: int) -> list[tuple[int, int]]:
    pick = torch.randperm(len(others), generator=torch.Generator().manual_seed(seed))[:N_ABL]
    return [others[i] for i in pick.tolist()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "ablation_sweep.json")
    ap.add_argument("--n-seq", type=int, default=16)
    ap.add_argument("--draws", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    model, _ = load_smollm2()
    L, H = model.config.n_layers, model.config.n_heads

    chapter = repeated_random(4, 0)  # the chapter's sequences: the heads are chosen on them
    with torch.no_grad(), capture_patterns(model) as patterns:
        model(chapter)
    ind = score_table(torch.stack(patterns, dim=1), chapter)["induction"]  # (L, H)
    order = ind.flatten().argsort(descending=True)[:N_ABL].tolist()
    induction = [(i // H, i % H) for i in order]
    others = [(l, h) for l in range(L) for h in range(H) if (l, h) not in induction]

    def mean(v):
        return sum(v) / len(v)

    ch_base = half_losses(model, chapter)
    with ablate_heads(model, induction):
        ch_ind = half_losses(model, chapter)
    with ablate_heads(model, control_heads(others, 0)):
        ch_ctl = half_losses(model, chapter)

    fresh = repeated_random(args.n_seq, 1)
    base_first, base_second = half_losses(model, fresh)
    with ablate_heads(model, induction):
        ind_first, ind_second = half_losses(model, fresh)
    controls = []
    for d in range(args.draws):
        heads = control_heads(others, d)
        with ablate_heads(model, heads):
            _, second = half_losses(model, fresh)
        controls.append({"seed": d, "heads": heads, "second": round(mean(second), 4)})
        print(f"draw {d}: {heads} -> {mean(second):.3f}", flush=True)

    out = {
        "what": "SmolLM2-135M: second-copy loss with Chapter 12's five induction heads zeroed, and "
        "with random sets of five other heads; made by scripts/ablation_sweep.py",
        "half": HALF,
        "n_seq": args.n_seq,
        "seq_seed": 1,
        "induction_heads": induction,
        "chapter": {
            "second": round(mean(ch_base[1]), 4),
            "second_induction": round(mean(ch_ind[1]), 4),
            "second_control": round(mean(ch_ctl[1]), 4),
        },
        "first": [round(v, 4) for v in base_first],
        "second": [round(v, 4) for v in base_second],
        "first_induction": [round(v, 4) for v in ind_first],
        "second_induction": [round(v, 4) for v in ind_second],
        "controls": controls,
        "torch": torch.__version__,
        "seconds": round(time.time() - start),
    }
    atomic_write(args.out, json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
