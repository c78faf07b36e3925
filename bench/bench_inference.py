"""Speculative decoding on the book's English model: acceptance rate and speed-up, in one run.

    python bench/bench_inference.py [--new 60] [--rounds 3] [--out bench/inference.json]

(``make bench`` runs it without ``--out``: the stored figures that Chapter 13 prints change only
when it is run with ``--out bench/inference.json`` and the chapter re-executed.)

Target: the English model (``models/english``, 4 layers, d_model 256). Draft: a bigram model
(:class:`gptlib.inference.BigramDraft`) counted on the first 1,000,000 characters of the Brown
training text with the same tokenizer, so its cost per token is a table lookup. For each
temperature (1: sampling; 0: greedy) and each gamma in 1..4, three prompts are continued by
``--new`` tokens, seeded. Printed and stored: the acceptance rate (drafts kept / drafted), the mean
beta = sum min(p, q) over the drafted positions, target passes, tokens per pass against
(1 - beta^(gamma+1)) / (1 - beta), and the wall-clock ratio plain KV-cache decoding
(:func:`gptlib.sampling.generate`) / speculative decoding, both timed in alternating rounds
(:func:`gptlib.timing.alternating_rounds`), medians, one torch thread. Chapter 13 re-reads the
stored file and recomputes one acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from gptlib.data import load_english
from gptlib.inference import BigramDraft, expected_tokens_per_pass, speculative_generate
from gptlib.model import GPT
from gptlib.runtime import atomic_write
from gptlib.sampling import generate
from gptlib.timing import alternating_rounds
from gptlib.tokenizers import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["The committee said that", "It was a cold morning, and", "In the first place, the"]
DRAFT_CHARS = 1_000_000


def english_pair() -> tuple[GPT, BigramDraft, BPETokenizer]:
    """The English model, its bigram draft (same tokenizer) and the tokenizer."""
    target = GPT.load(ROOT / "models" / "english").eval()
    tok = BPETokenizer.load(ROOT / "models" / "english" / "tokenizer.json")
    train, _ = load_english()
    draft = BigramDraft(torch.tensor(tok.encode(train[:DRAFT_CHARS])), target.config.d_vocab)
    return target, draft, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=60, help="new tokens per prompt")
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternating timing rounds (medians reported)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the figures here as JSON (Chapter 13 prints bench/inference.json)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, draft, tok = english_pair()
    prompts = [torch.tensor(tok.encode(p)) for p in PROMPTS]
    rows = []
    print(
        f"{'T':>3} {'gamma':>5} {'accept':>7} {'beta':>6} {'tok/pass':>8} {'formula':>8} "
        f"{'speed-up':>8}"
    )
    for temperature in (1.0, 0.0):
        for gamma in (1, 2, 3, 4):

            def spec():
                return [
                    speculative_generate(
                        target,
                        draft,
                        ids,
                        args.new,
                        gamma,
                        temperature=temperature,
                        generator=torch.Generator().manual_seed(s),
                    )
                    for s, ids in enumerate(prompts)
                ]

            def plain():
                return [
                    generate(
                        target,
                        ids,
                        args.new,
                        temperature=temperature,
                        generator=torch.Generator().manual_seed(s),
                    )
                    for s, ids in enumerate(prompts)
                ]

            runs = spec()
            if temperature == 0:  # greedy: the same tokens as plain greedy decoding
                assert all(torch.equal(r.ids, ids) for r, ids in zip(runs, plain()))
            times = alternating_rounds({"speculative": spec, "plain": plain}, args.rounds)
            med = {k: statistics.median(v) for k, v in times.items()}
            kept, drafted = sum(r.kept for r in runs), sum(r.drafted for r in runs)
            betas = [b for r in runs for b in r.betas]
            beta = sum(betas) / len(betas)
            passes = sum(r.passes for r in runs)
            row = {
                "temperature": temperature,
                "gamma": gamma,
                "new_tokens": args.new * len(prompts),
                "acceptance_rate": kept / drafted,
                "mean_beta": beta,
                "passes": passes,
                "tokens_per_pass": args.new * len(prompts) / passes,
                "formula_tokens_per_pass": expected_tokens_per_pass(beta, gamma),
                "speed_up": med["plain"] / med["speculative"],
                "seconds_plain": med["plain"],
                "seconds_speculative": med["speculative"],
                "per_prompt": [
                    {"kept": r.kept, "drafted": r.drafted, "passes": r.passes} for r in runs
                ],
            }
            rows.append(row)
            print(
                f"{temperature:>3.0f} {gamma:>5} {row['acceptance_rate']:>7.3f} {beta:>6.3f} "
                f"{row['tokens_per_pass']:>8.3f} {row['formula_tokens_per_pass']:>8.3f} "
                f"{row['speed_up']:>7.2f}x"
            )
    record = {
        "made_by": "bench/bench_inference.py",
        "prompts": PROMPTS,
        "new_tokens_per_prompt": args.new,
        "draft": f"bigram counted on the first {DRAFT_CHARS:,} characters "
        "of the Brown training text",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, 1 torch thread",
        "torch": torch.__version__,
        "timing": f"medians of {args.rounds} alternating rounds",
        "rows": rows,
    }
    if args.out is not None:
        atomic_write(args.out, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
