"""Chapter 9's PPO and DPO over several KL weights beta and seeds, precomputed (the chapter reads
the JSON).

The sweep starts from the chapter's set-up (the English model without dropout, the toy task of
``gptlib.rlhf.toy_task``) and from the SFT policy, the ranked pairs and the reward model that the
chapter loads (``models/rlhf``, written by ``scripts/rlhf_runs.py``). For each seed it then runs
``gptlib.rlhf.ppo`` with GRPO's group-normalised advantage for each beta of ``--betas``, with
RLOO's leave-one-out baseline for each of ``--rloo-betas``, and ``gptlib.rlhf.dpo`` on the ranked
pairs for each of ``--dpo-betas``, measuring each policy as the chapter does
(``gptlib.rlhf.evaluate_policy``: the judged score and the KL to SFT on one set of samples of the
evaluation prompts; for DPO also the mean log-ratios to SFT of the training pairs, which the
chapter reads). The reference's log-probabilities of the pairs are computed once and shared by
every DPO run. It sets one torch thread, as the chapter does. The page's PPO run (GRPO's baseline,
beta = 0.1, seed 5) and DPO run (beta = 0.1, seed 6) are stored in full in ``models/rlhf``; the
page checks that each is this sweep's run (the same judged scores, every step's statistics within
1e-3: not the bits, which depend on the order in which the CPU's kernels add), and plots the
sweep's beta = 0 run of seed 5.

    nice -n 10 python scripts/rlhf_sweep.py            # writes models/rlhf_sweep.json
    python scripts/rlhf_sweep.py --seeds 5 6 --betas 0 0.1 --rloo-betas 0.1 --dpo-betas 0.1 --out
    /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from gptlib import rlhf
from gptlib.recipes import load_rlhf_runs
from gptlib.runtime import atomic_write

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from rlhf_runs import chapter_base_and_task  # noqa: E402  (the chapter's base model and task)


def chapter_setup() -> dict:
    """The task as chapters/09_rlhf.ipynb makes it, and the SFT policy, the reward model and the
    training pairs it loads (:func:`gptlib.recipes.load_rlhf_runs`)."""
    torch.set_num_threads(1)
    base, task = chapter_base_and_task()
    runs = load_rlhf_runs(ROOT / "models" / "rlhf", base.config)
    samples = runs.samples
    Yw, Yl = rlhf.preference_pairs(samples, task.judged(samples).view(-1, 4))
    n_train = int(0.8 * len(Yw))
    return {
        "task": task,
        "policy_sft": runs.sft,
        "rm": runs.reward_model,
        "chosen": Yw[:n_train],
        "rejected": Yl[:n_train],
    }


@torch.no_grad()
def log_ratios(policy, ref_logprobs: torch.Tensor, ids: torch.Tensor, prompt_len: int) -> float:
    """The mean over the rows of ids of log policy(Y|X) - log ref(Y|X), given the reference's
    log ref(Y|X), (n,)."""
    m = rlhf.response_mask(ids, prompt_len)
    return float((rlhf.sequence_logprob(policy, ids, m) - ref_logprobs).mean())


def _rounded(value):
    """Floats to 4 decimals, inside dicts and lists too (the betas, 0.05 and the like, are
    unchanged).

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
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.5])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9])
    ap.add_argument(
        "--rloo-betas",
        type=float,
        nargs="+",
        default=[0.1],
        help="the betas of the PPO runs with RLOO's baseline (--betas: with GRPO's)",
    )
    ap.add_argument("--steps", type=int, default=12, help="PPO steps")
    ap.add_argument("--dpo-betas", type=float, nargs="+", default=[0.1])
    ap.add_argument("--dpo-steps", type=int, default=20)
    ap.add_argument("--dpo-batch", type=int, default=8, help="ranked pairs per DPO step")
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "rlhf_sweep.json")
    args = ap.parse_args()
    if any(b < 0 for b in args.betas + args.rloo_betas):
        raise ValueError(f"betas and rloo-betas must be >= 0, got {args.betas}, {args.rloo_betas}")
    if any(b <= 0 for b in args.dpo_betas):  # at beta = 0 DPO's loss is ln 2 with zero gradient
        raise ValueError(f"dpo-betas must be > 0, got {args.dpo_betas}")
    if args.dpo_batch < 1:
        raise ValueError(f"dpo-batch must be >= 1, got {args.dpo_batch}")
    t0 = time.time()
    s = chapter_setup()
    task, policy_sft = s["task"], s["policy_sft"]
    Y_len = task.response_len

    def measured(policy) -> dict:  # the chapter's evaluate: one sample per held-out prompt
        ev = rlhf.evaluate_policy(policy, policy_sft, task.eval_prompts, Y_len, task.judged, seed=1)
        return {"judged": ev.score, "kl_eval": ev.kl}  # Monte Carlo KL to SFT, same samples

    def report(run: dict) -> None:
        print(
            f"{run['method']} beta={run['beta']} seed={run['seed']}: "
            + ", ".join(
                f"{k} {v:.3f}" for k, v in run.items() if isinstance(v, float) and k != "beta"
            ),
            flush=True,
        )

    runs = []  # DPO first: its runs are the quickest
    chosen, rejected, P = s["chosen"], s["rejected"], task.prompt_len
    # the reference's log-probabilities of the pairs, one scoring pass for every DPO run
    ref_w, ref_l = rlhf.reference_logprobs(policy_sft, chosen, rejected, P)
    for beta in args.dpo_betas:
        for seed in args.seeds:
            policy, losses = rlhf.dpo(
                policy_sft,
                chosen,
                rejected,
                P,
                beta=beta,
                steps=args.dpo_steps,
                seed=seed,
                batch_size=args.dpo_batch,
                ref_logprobs=(ref_w, ref_l),
            )
            runs.append(
                {
                    "method": "dpo",
                    "beta": beta,
                    "seed": seed,
                    **measured(policy),
                    "logratio_chosen": log_ratios(
                        policy, ref_w, chosen, P
                    ),  # means over the training pairs
                    "logratio_rejected": log_ratios(policy, ref_l, rejected, P),
                    "history": {"loss": losses},  # per DPO step
                }
            )
            report(runs[-1])
    for method, betas in (("grpo", args.betas), ("rloo", args.rloo_betas)):
        for beta in betas:
            for seed in args.seeds:
                policy, hist = rlhf.ppo(
                    policy_sft,
                    s["rm"],
                    task.train_prompts,
                    Y_len,
                    beta=beta,
                    steps=args.steps,
                    seed=seed,
                    judge=task.judged,
                    advantage=method,
                )
                runs.append(
                    {
                        "method": method,
                        "beta": beta,
                        "seed": seed,
                        **measured(policy),
                        "kl_last5": sum(hist["kl"][-5:])
                        / 5,  # mean KL of the last 5 training batches
                        "reward_last5": sum(hist["reward"][-5:]) / 5,
                        "history": hist,  # per PPO step: judged score, reward and KL of the batch
                    }
                )
                report(runs[-1])
    result = {
        "what": "chapters/09_rlhf.ipynb's ppo() per baseline, beta and seed, "
        "and its dpo() per beta and seed; "
        "made by scripts/rlhf_sweep.py",
        "steps": args.steps,
        "betas": args.betas,
        "rloo_betas": args.rloo_betas,
        "seeds": args.seeds,
        "dpo_steps": args.dpo_steps,
        "dpo_betas": args.dpo_betas,
        "dpo_batch": args.dpo_batch,
        "n_pairs": len(chosen),
        "score_sft": rlhf.evaluate_policy(
            policy_sft, None, task.eval_prompts, Y_len, task.judged, seed=1
        ).score,
        "n_eval_prompts": len(task.eval_prompts),
        "torch": torch.__version__,
        "seconds": round(time.time() - t0, 1),
        "runs": [_rounded(r) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
