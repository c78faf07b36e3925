"""Chapter 9's PPO over several KL weights beta and seeds, precomputed (the chapter reads the JSON).

The sweep runs the chapter's own code: it executes the code cells of chapters/09_rlhf.ipynb up to and
including the one that defines ``ppo`` (set-up, SFT, the reward model, the PPO loop; the cell after it,
which runs PPO, is not executed), then calls that ``ppo`` and the chapter's ``evaluate`` and ``kl_to``
(the latter defined in the DPO cell, executed without its DPO run) for each beta and seed. The
chapter's set-up cell sets two torch threads, so the sweep computes exactly what the page does: the
page runs beta = 0.1 with seed 5 itself and checks that it equals the stored run, and it plots the
stored beta = 0 run of the same seed.

    nice -n 10 python scripts/rlhf_sweep.py            # writes models/rlhf_sweep.json
    python scripts/rlhf_sweep.py --seeds 5 6 --betas 0 0.1 --out /tmp/s.json
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import time
from pathlib import Path

import nbformat
import torch

from gptlib.runtime import atomic_write

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "09_rlhf.ipynb"


def _function_defs(source: str) -> str:
    """Only the imports and function definitions of a cell (drops the statements that run things)."""
    lines = source.splitlines()
    keep = [n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
    first = [min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) for n in keep]
    return "\n\n".join("\n".join(lines[a - 1 : n.end_lineno]) for a, n in zip(first, keep))


def chapter_namespace() -> dict:
    """Run the chapter's cells up to the definition of ``ppo``; add ``kl_to`` from the DPO cell."""
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    ns: dict = {}
    cwd = os.getcwd()
    os.chdir(NOTEBOOK.parent)  # the chapter loads ../models/english
    try:
        for src in cells[1:]:  # cells[0] is the Colab set-up
            exec(compile(src, str(NOTEBOOK), "exec"), ns)
            if src.startswith("def ppo("):
                break
        else:
            raise RuntimeError(f"{NOTEBOOK} has no cell starting with 'def ppo('")
        dpo_cell = next(s for s in cells if "def kl_to(" in s)
        exec(compile(_function_defs(dpo_cell), str(NOTEBOOK), "exec"), ns)
    finally:
        os.chdir(cwd)
    return ns


def _rounded(value):
    """Floats to 4 decimals, inside dicts and lists too (the betas, 0.05 and the like, are unchanged).

    >>> _rounded({"kl": [1.234567, 2.0], "seed": 5})
    {'kl': [1.2346, 2.0], 'seed': 5}
    """
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9])
    ap.add_argument("--steps", type=int, default=18)
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "rlhf_sweep.json")
    args = ap.parse_args()
    if any(b < 0 for b in args.betas):
        raise ValueError(f"betas must be >= 0, got {args.betas}")
    t0 = time.time()
    ns = chapter_namespace()
    runs = []
    for beta in args.betas:
        for seed in args.seeds:
            policy, hist = ns["ppo"](ns["policy_sft"], ns["rm"], beta=beta, steps=args.steps, seed=seed)
            runs.append({
                "beta": beta, "seed": seed,
                "judged": ns["evaluate"](policy),  # held-out prompts, one sample each (the chapter's evaluate)
                "kl_eval": ns["kl_to"](policy, ns["policy_sft"]),  # Monte Carlo KL to SFT on the eval prompts
                "kl_last5": sum(hist["kl"][-5:]) / 5,  # mean KL of the last 5 training batches
                "reward_last5": sum(hist["reward"][-5:]) / 5,
                "history": hist,  # per PPO step: judged score, reward and KL of the batch
            })
            print(f"beta={beta} seed={seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[-1].items()
                                                          if k not in ("beta", "seed", "history")), flush=True)
    result = {
        "what": "chapters/09_rlhf.ipynb's ppo() per beta and seed; made by scripts/rlhf_sweep.py",
        "steps": args.steps, "betas": args.betas, "seeds": args.seeds,
        "score_sft": ns["score_sft"], "n_eval_prompts": len(ns["eval_idx"]),
        "torch": torch.__version__, "seconds": round(time.time() - t0, 1),
        "runs": [_rounded(r) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
