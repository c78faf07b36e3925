"""Chapter 9: the training loops of SFT, the reward model, PPO and DPO, and what they measure.

Every loop takes what it works on as arguments (the policy, the reference, the prompts or the
ranked pairs, the response length, budgets and a seed) and returns the trained model, in eval mode,
with a log of its losses or statistics. A loop copies the model it starts from; the reference policy
and the reward model are never changed. Every batch is drawn with a ``torch.Generator`` seeded by
``seed``, so a run is repeated exactly on the same machine and thread count.

Sequences are a prompt of ``prompt_len`` tokens followed by a response: ``ids`` of shape
(B, prompt_len + response_len). The loss terms count the response tokens only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..runtime import check_float, check_int
from ..sampling import generate
from ..training import train_step
from .objectives import (
    RewardModel,
    dpo_loss,
    group_advantages,
    kl_penalty,
    leave_one_out_advantages,
    ppo_loss,
    reward_model_loss,
    sequence_logprob,
    token_logprobs,
)

__all__ = [
    "response_mask",
    "sample_responses",
    "sft_loss",
    "sft",
    "train_reward_model",
    "ppo",
    "dpo",
    "reference_logprobs",
    "kl_to",
    "judged_score",
    "Evaluation",
    "evaluate_policy",
    "ADVANTAGES",
]

ADVANTAGES = {"grpo": group_advantages, "rloo": leave_one_out_advantages}  # ppo's ``advantage``


def response_mask(ids: Tensor, prompt_len: int) -> Tensor:
    """(B, T) bool: True on the response tokens, the positions from ``prompt_len`` on.

    >>> response_mask(torch.zeros(1, 4, dtype=torch.long), prompt_len=3)
    tensor([[False, False, False,  True]])
    """
    check_int("prompt_len", prompt_len, lo=1, hi=ids.shape[-1] - 1)
    mask = torch.zeros_like(ids, dtype=torch.bool)  # (B, T)
    mask[:, prompt_len:] = True
    return mask


def sample_responses(
    policy,
    prompts: Tensor,
    response_len: int,
    n_per_prompt: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """004's generator G: each prompt repeated ``n_per_prompt`` times, continued by sampling at
    temperature 1.

    prompts: (n, P). Returns (n * n_per_prompt, P + response_len), the samples of prompt i in rows
    i * n_per_prompt to (i + 1) * n_per_prompt - 1.
    """
    check_int("response_len", response_len, lo=1)
    check_int("n_per_prompt", n_per_prompt, lo=1)
    if prompts.dim() != 2:
        raise ValueError(f"prompts must have shape (n, P), got {tuple(prompts.shape)}")
    x = prompts.repeat_interleave(n_per_prompt, dim=0)  # (n * n_per_prompt, P)
    return generate(policy, x, response_len, temperature=1.0, generator=generator)


def sft_loss(policy, ids: Tensor, prompt_len: int) -> Tensor:
    """The SFT loss: -log pi(Y | X) per response token, averaged over the batch (nats
    per token).

    ids: (B, prompt_len + |Y|), demonstrations. The prompt is given, not demonstrated:
    its tokens are not scored.
    """
    n_response = ids.shape[1] - prompt_len
    mask = response_mask(ids, prompt_len)  # (B, T)
    return -sequence_logprob(policy, ids, mask).mean() / n_response


def _adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW without weight decay: every loop here fine-tunes a few dozen steps from a trained
    model."""
    return torch.optim.AdamW(
        model.parameters(), lr=check_float("lr", lr, 0.0, lo_open=True), weight_decay=0.0
    )


def _rows(n: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """``batch_size`` row indices drawn uniformly, with replacement, from range(n)."""
    return torch.randint(0, n, (batch_size,), generator=generator)


def sft(
    model,
    demos: Tensor,
    prompt_len: int,
    steps: int,
    lr: float,
    seed: int,
    batch_size: int = 16,
) -> tuple[torch.nn.Module, list[float]]:
    """Supervised fine-tuning: ``steps`` AdamW steps on :func:`sft_loss` over batches of
    ``demos``.

    demos: (n, prompt_len + |Y|). Returns a trained copy of ``model`` and the loss of
    every step.
    """
    check_int("steps", steps, lo=0)
    check_int("batch_size", batch_size, lo=1)
    policy = copy.deepcopy(model).train()
    opt = _adamw(policy, lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        batch = demos[_rows(len(demos), batch_size, g)]  # (batch_size, T)
        losses.append(train_step(policy, sft_loss(policy, batch, prompt_len), opt))
    return policy.eval(), losses


def train_reward_model(
    backbone,
    chosen: Tensor,
    rejected: Tensor,
    steps: int,
    lr: float,
    seed: int,
    batch_size: int = 32,
) -> tuple[RewardModel, list[float]]:
    """Fit a :class:`RewardModel` on ``backbone`` to ranked pairs by the Bradley-Terry
    loss (eq. 14).

    chosen, rejected: (n_pairs, T), row i of ``chosen`` preferred to row i of
    ``rejected``. The scalar head starts at zero, so the first loss is exactly ln 2.
    Returns the reward model and the losses.
    """
    if chosen.shape != rejected.shape or chosen.dim() != 2:
        raise ValueError(
            "chosen and rejected must both have shape (n_pairs, T), got "
            f"{tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    check_int("steps", steps, lo=0)
    check_int("batch_size", batch_size, lo=1)
    rm = RewardModel(backbone).train()
    opt = _adamw(rm, lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        i = _rows(len(chosen), batch_size, g)
        loss = reward_model_loss(rm(chosen[i]), rm(rejected[i]))
        losses.append(train_step(rm, loss, opt))
    return rm.eval(), losses


def ppo(
    sft_policy,
    reward_model,
    prompts: Tensor,
    response_len: int,
    beta: float,
    steps: int,
    seed: int,
    judge: Callable[[Tensor], Tensor] | None = None,
    n_prompts: int = 4,
    group_size: int = 4,
    epochs: int = 2,
    lr: float = 3e-4,
    clip_eps: float = 0.2,
    grad_clip: float = 1.0,
    advantage: str = "grpo",
) -> tuple[torch.nn.Module, dict[str, list[float]]]:
    """PPO on eq. 15 (gamma = 0) with a group baseline, from a copy of ``sft_policy``.

    Each step draws ``n_prompts`` of ``prompts`` (n, P), samples ``group_size``
    responses of ``response_len`` tokens to each, scores them r - beta * KL (the
    log-ratio to ``sft_policy`` summed over the response), turns the scores into
    advantages within each group and takes ``epochs`` clipped-surrogate steps on the
    same samples. ``advantage`` names the baseline (``ADVANTAGES``): ``"grpo"``, GRPO's
    group-normalised scores (:func:`group_advantages`), or ``"rloo"``, the leave-one-out
    baseline of RLOO (:func:`leave_one_out_advantages`). Returns the policy and, per
    step, the batch's mean reward-model score, its mean KL to ``sft_policy`` and, if
    ``judge`` maps sequences (B, P + response_len) to scores (B,), their mean score
    ``"judged"``.
    """
    check_float("beta", beta, 0.0)
    check_int("steps", steps, lo=0)
    check_int("n_prompts", n_prompts, lo=1)
    check_int("group_size", group_size, lo=2)
    check_int("epochs", epochs, lo=1)
    if advantage not in ADVANTAGES:
        raise ValueError(
            f"advantage must be one of {sorted(ADVANTAGES)}, got {advantage!r}",
        )
    advantages_of = ADVANTAGES[advantage]
    policy, ref = copy.deepcopy(sft_policy), sft_policy
    opt = _adamw(policy, lr)
    g = torch.Generator().manual_seed(seed)
    prompt_len = prompts.shape[1]
    history: dict[str, list[float]] = {"judged": []} if judge is not None else {}
    history.update(reward=[], kl=[])
    for _ in range(steps):
        batch = prompts[_rows(len(prompts), n_prompts, g)]  # (n_prompts, P)
        policy.eval()
        ids = sample_responses(
            policy, batch, response_len, group_size, g
        )  # (n_prompts * G, P + |Y|)
        # the scored positions: (n_prompts * G, T - 1)
        m = response_mask(ids, prompt_len)[:, 1:]
        with torch.no_grad():
            r = reward_model(ids)  # (n_prompts * G,)
            lp_old = token_logprobs(policy(ids), ids)  # (n_prompts * G, T - 1)
            lp_ref = token_logprobs(ref(ids), ids)
        kl = (kl_penalty(lp_old, lp_ref, beta=1.0) * m).sum(
            dim=-1
        )  # (n_prompts * G,): per response
        total = r - beta * kl  # eq. 15, the penalty summed over the response
        adv = advantages_of(total.view(n_prompts, group_size))  # (n_prompts, G)
        adv = adv.view(-1, 1).expand_as(lp_old)  # (n_prompts * G, T - 1)
        policy.train()
        for _ in range(epochs):  # the scorer F, with gradient
            loss = ppo_loss(token_logprobs(policy(ids), ids), lp_old, adv, m, clip_eps)
            train_step(policy, loss, opt, grad_clip=grad_clip)
        if judge is not None:
            history["judged"].append(float(judge(ids).mean()))
        history["reward"].append(float(r.mean()))
        history["kl"].append(float(kl.mean()))
    return policy.eval(), history


def dpo(
    sft_policy,
    chosen: Tensor,
    rejected: Tensor,
    prompt_len: int,
    beta: float,
    steps: int,
    seed: int,
    lr: float = 2e-4,
    batch_size: int = 16,
    ref_logprobs: tuple[Tensor, Tensor] | None = None,
) -> tuple[torch.nn.Module, list[float]]:
    """Direct preference optimisation of a copy of ``sft_policy`` on ranked pairs,
    ``sft_policy`` the reference.

    chosen, rejected: (n_pairs, prompt_len + |Y|). The reference's log-probabilities
    log pi_ref(Y_w | X) and log pi_ref(Y_l | X), (n_pairs,) each, are computed once, or
    passed as ``ref_logprobs`` by a caller that has them already (one scoring pass of
    the pairs serves several runs); the first loss is ln 2 because the policy starts
    equal to the reference. Returns the policy and the losses.
    """
    if chosen.shape != rejected.shape or chosen.dim() != 2:
        raise ValueError(
            "chosen and rejected must both have shape (n_pairs, T), got "
            f"{tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    check_float("beta", beta, 0.0)
    check_int("steps", steps, lo=0)
    check_int("batch_size", batch_size, lo=1)
    policy, ref = copy.deepcopy(sft_policy).train(), sft_policy
    opt = _adamw(policy, lr)
    g = torch.Generator().manual_seed(seed)
    mw, ml = response_mask(chosen, prompt_len), response_mask(rejected, prompt_len)
    if ref_logprobs is None:
        ref_logprobs = reference_logprobs(ref, chosen, rejected, prompt_len)
    ref_w, ref_l = ref_logprobs  # (n_pairs,) each
    for name, lp in (("ref_logprobs[0]", ref_w), ("ref_logprobs[1]", ref_l)):
        if lp.shape != (len(chosen),) or not bool(torch.isfinite(lp).all()):
            raise ValueError(
                f"{name} must be {len(chosen)} finite log-probabilities, one per pair, "
                f"got shape {tuple(lp.shape)}"
            )
    losses = []
    for _ in range(steps):
        i = _rows(len(chosen), batch_size, g)
        loss = dpo_loss(
            sequence_logprob(policy, chosen[i], mw[i]),
            sequence_logprob(policy, rejected[i], ml[i]),
            ref_w[i],
            ref_l[i],
            beta=beta,
        )
        losses.append(train_step(policy, loss, opt))
    return policy.eval(), losses


@torch.no_grad()
def reference_logprobs(
    ref, chosen: Tensor, rejected: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor]:
    """log ref(Y_w | X) and log ref(Y_l | X) of every pair, (n_pairs,) each: what
    :func:`dpo` needs of its reference, from one scoring pass of the pairs."""
    mw, ml = response_mask(chosen, prompt_len), response_mask(rejected, prompt_len)
    return sequence_logprob(ref, chosen, mw), sequence_logprob(ref, rejected, ml)


def kl_to(policy, ref, prompts: Tensor, response_len: int, seed: int = 1) -> float:
    """Monte Carlo KL(policy || ref) per response: the mean over one sampled response per prompt
    (seeded) of log policy(Y|X) - log ref(Y|X), Y drawn from ``policy`` (the estimator k1);
    0 for ``ref = policy``. ``evaluate_policy(...).kl``, without the judge."""
    return evaluate_policy(policy, ref, prompts, response_len, _no_judge, seed).kl


def judged_score(
    policy, prompts: Tensor, response_len: int, judge: Callable[[Tensor], Tensor], seed: int = 1
) -> float:
    """The mean of ``judge`` over one sampled response per prompt (seeded): the samples of
    :func:`kl_to` for the same ``seed``. ``evaluate_policy(...).score``, without a reference."""
    return evaluate_policy(policy, None, prompts, response_len, judge, seed).score


def _no_judge(ids: Tensor) -> Tensor:
    """A judge that scores nothing (every response 0), for :func:`kl_to`."""
    return torch.zeros(len(ids))


@dataclass(frozen=True, eq=False)
class Evaluation:
    """A policy measured on one sampled response per prompt, every statistic from the same
    samples (:func:`evaluate_policy`).

    ``log_ratio`` and ``exact_kl`` are ``None`` when no reference was given.
    """

    ids: Tensor  # (n, P + |Y|): the prompts and their sampled responses
    judged: Tensor  # (n,): the judge's score of each response
    log_ratio: Tensor | None  # (n, |Y|) float64: log policy(y_j | h_j) - log ref(y_j | h_j)
    exact_kl: Tensor | None  # (n, |Y|) float64: KL(policy(. | h_j) || ref(. | h_j))

    @property
    def score(self) -> float:
        """The mean judged score (:func:`judged_score`)."""
        return float(self.judged.mean())

    @property
    def kl(self) -> float:
        """The Monte Carlo KL(policy || ref) per response, the mean of the summed log-ratios
        (the estimator k1, :func:`kl_to`)."""
        if self.log_ratio is None:
            raise ValueError("this evaluation has no reference: pass ref to evaluate_policy")
        return float(self.log_ratio.sum(dim=1).mean())


@torch.no_grad()
def evaluate_policy(
    policy,
    ref,
    prompts: Tensor,
    response_len: int,
    judge: Callable[[Tensor], Tensor],
    seed: int = 1,
) -> Evaluation:
    """Draw one response per prompt from ``policy`` once (seeded with ``seed``) and measure
    everything on them: the judged scores
    and, if ``ref`` is not ``None``, one scoring pass of each model giving the log-ratio of
    every sampled response token and the exact KL between the two next-token distributions at
    every response prefix (float64, from the two softmaxes).

    prompts: (n, P). :func:`judged_score` and :func:`kl_to` are ``Evaluation.score`` and
    ``Evaluation.kl`` of this function.
    """
    ids = sample_responses(
        policy, prompts, response_len, 1, torch.Generator().manual_seed(seed)
    )  # (n, P + |Y|)
    judged = judge(ids)  # (n,)
    if ref is None:
        return Evaluation(ids, judged, None, None)
    P = prompts.shape[1]
    # the distributions of the response tokens y_1 .. y_|Y|: (n, |Y|, d_vocab) each
    logp = torch.log_softmax(policy(ids)[:, P - 1 : -1].double(), dim=-1)
    logp_ref = torch.log_softmax(ref(ids)[:, P - 1 : -1].double(), dim=-1)
    y = ids[:, P:, None]  # (n, |Y|, 1): the sampled tokens
    log_ratio = (logp.gather(-1, y) - logp_ref.gather(-1, y))[..., 0]  # (n, |Y|)
    exact_kl = (logp.exp() * (logp - logp_ref)).sum(dim=-1)  # (n, |Y|)
    return Evaluation(ids, judged, log_ratio, exact_kl)
