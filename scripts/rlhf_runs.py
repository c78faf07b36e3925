"""Chapter 9's runs, trained in full and stored (``models/rlhf``).

    nice -n 10 python scripts/rlhf_runs.py [--out models/rlhf]

The recipe is :func:`gptlib.recipes.train_rlhf_runs`: from the English model without dropout, on
the chapter's task, SFT (20 steps), the ranked pairs and the reward model (16 steps), PPO with
GRPO's advantage at beta = 0.1 and seed 5 (12 steps) and DPO at beta = 0.1 and seed 6 (20 steps).
The chapter reruns the first steps of each run, compares them with the stored curves and then
loads the stored models. One thread, every random source seeded: a rerun on the same kernels
writes the same files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gptlib.data import load_english
from gptlib.recipes import english_without_dropout, save_rlhf_runs, train_rlhf_runs
from gptlib.rlhf.toy_task import SentenceLabeller, sentence_task
from gptlib.tokenizers import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = ROOT / "models" / "english"


def chapter_base_and_task():
    """The English model without dropout (eval mode) and the chapter's task, made as
    chapters/09_rlhf.ipynb makes them."""
    base = english_without_dropout(ENGLISH)
    tok = BPETokenizer.load(ENGLISH / "tokenizer.json")
    train_text, val_text = load_english()
    judge = SentenceLabeller.from_text(train_text)
    task = sentence_task(tok, train_text, val_text, judge, 16, 16, n_train=500, n_eval=100, seed=0)
    return base, task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "rlhf")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    base, task = chapter_base_and_task()
    runs = train_rlhf_runs(base, task)
    save_rlhf_runs(args.out, runs)
    c = runs.curves
    print(
        f"SFT {c['sft'][0]:.3f} -> {c['sft'][-1]:.3f}, reward model {c['reward_model'][0]:.3f} "
        f"-> {c['reward_model'][-1]:.3f}, PPO KL {c['ppo']['kl'][-1]:.2f}, DPO "
        f"{c['dpo'][0]:.3f} -> {c['dpo'][-1]:.3f}; {time.perf_counter() - t0:.1f} s -> {args.out}"
    )


if __name__ == "__main__":
    main()
