"""Chapter 9: the objectives of RLHF and DPO as small pure functions, and the reward model.

Notation (004, after Ouyang et al. 2022): a prompt X, a response Y, the policy being trained
pi_RL (here ``logp``), the frozen supervised policy pi_SFT (``logp_ref``), a reward model r.

    reward model (eq. 14):  loss = -mean over ranked pairs of log sigma(r(X, Y_w) - r(X, Y_l))
    RL objective (eq. 15):  E[r(X, Y) - beta log(pi_RL(Y|X) / pi_SFT(Y|X))] + gamma E[log
    pi_RL(X_pre)]
    PPO:                    maximise E[min(rho A, clip(rho, 1-eps, 1+eps) A)],  rho = pi_new /
    pi_old
    DPO:                    loss = -mean log sigma(beta [(log pi - log pi_ref)(Y_w) - (log pi - log
    pi_ref)(Y_l)])
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import check_finite, check_float, check_ids, check_int, check_mask

__all__ = [
    "token_logprobs",
    "sequence_logprob",
    "reward_model_loss",
    "ranking_pairs",
    "preference_pairs",
    "kl_penalty",
    "group_advantages",
    "leave_one_out_advantages",
    "ppo_loss",
    "dpo_loss",
    "RewardModel",
]


def _same_shape(*, nonempty: bool = False, **tensors: Tensor) -> None:
    """Tensors of one shape, each finite (log-probabilities, rewards, advantages); with
    ``nonempty``,
    holding at least one number (a mean over none is undefined)."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shapes must match, got {shapes}")
    name, first = next(iter(tensors.items()))
    if nonempty and first.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(first.shape)}): a mean over nothing is undefined"
        )
    for name, t in tensors.items():
        check_finite(name, t)


def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """log P(ids[:, t+1] | ids[:, :t+1]) for every t: the scorer F of 004 in one pass.

    logits: (B, T, d_vocab) from ``model(ids)``; ids: (B, T). Returns (B, T-1).

    >>> token_logprobs(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]])).exp()
    tensor([[0.2500, 0.2500]])
    """
    if logits.dim() != 3 or ids.dim() != 2 or logits.shape[:2] != ids.shape:
        raise ValueError(
            f"logits (B, T, d_vocab) and ids (B, T) must agree, got {tuple(logits.shape)} and "
            f"{tuple(ids.shape)}"
        )
    check_ids(ids, logits.shape[-1])
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, d_vocab)
    return logp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1)


def sequence_logprob(model, ids: Tensor, response_mask: Tensor) -> Tensor:
    """log pi(Y | X) = sum of the response tokens' log-probabilities, from one forward pass.

    ids: (B, T) prompt followed by response; response_mask: (B, T) bool, True on response tokens
    (position 0 is never a response token: it has no context). Returns (B,).
    """
    response_mask = check_mask("response_mask", response_mask, ids.shape)
    if response_mask.dim() != 2:
        raise ValueError(f"ids and response_mask must have shape (B, T), got {tuple(ids.shape)}")
    if response_mask[:, 0].any():
        raise ValueError(
            "response_mask must be False at position 0 (the first token has no context)"
        )
    lp = token_logprobs(model(ids), ids)  # (B, T-1)
    return (lp * response_mask[:, 1:].to(lp.dtype)).sum(dim=-1)


def reward_model_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Eq. 14: -mean log sigma(r_w - r_l) over the ranked pairs (the 1/C(K,2) is the mean over
    pairs).

    >>> round(float(reward_model_loss(torch.tensor([0.0]), torch.tensor([0.0]))), 4)  # ln 2
    0.6931
    """
    _same_shape(r_chosen=r_chosen, r_rejected=r_rejected, nonempty=True)
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def ranking_pairs(K: int) -> list[tuple[int, int]]:
    """The C(K, 2) (better, worse) index pairs of K responses ranked best first.

    >>> ranking_pairs(3)
    [(0, 1), (0, 2), (1, 2)]
    """
    K = check_int("K", K, lo=2)
    return [(i, j) for i in range(K) for j in range(i + 1, K)]


def preference_pairs(samples: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
    """The ranked pairs (Y_w, Y_l) of K samples per prompt, ties dropped.

    samples: (n * K, T), the K samples of prompt i in rows i K .. i K + K - 1; scores: (n, K), the
    labeller's scores. Every pair of :func:`ranking_pairs` whose scores differ gives one row of each
    output, the better-scored sample in ``Y_w``. Returns two (n_pairs, T) tensors.

    >>> samples = torch.tensor([[10], [11], [12], [20], [21], [22]])  # 2 prompts, K = 3
    >>> Yw, Yl = preference_pairs(samples, torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    >>> Yw[:, 0].tolist(), Yl[:, 0].tolist()  # prompt 2's samples tie: no pair
    ([11, 11], [10, 12])
    """
    if scores.dim() != 2 or samples.dim() < 1 or len(samples) != scores.numel():
        raise ValueError(
            f"samples (n * K, T) and scores (n, K) must agree, got {tuple(samples.shape)} "
            f"and {tuple(scores.shape)}"
        )
    if scores.is_floating_point():
        check_finite("scores", scores)  # a NaN score is unequal to every score: it would make pairs
    n, K = scores.shape
    winners, losers = [], []
    for i in range(n):
        for a, b in ranking_pairs(K):
            if scores[i, a] != scores[i, b]:
                w, l = (a, b) if scores[i, a] > scores[i, b] else (b, a)
                winners.append(samples[i * K + w])
                losers.append(samples[i * K + l])
    if not winners:
        raise ValueError("scores has no pair that differs: every comparison is a tie")
    return torch.stack(winners), torch.stack(losers)


def kl_penalty(logp: Tensor, logp_ref: Tensor, beta: float) -> Tensor:
    """Per-token penalty beta * (log pi_RL - log pi_SFT); its sum over a response estimates beta KL.

    >>> kl_penalty(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0]), beta=0.1)
    tensor([0.0500, 0.0000])
    """
    _same_shape(logp=logp, logp_ref=logp_ref)
    beta = check_float("beta", beta, 0.0)
    return beta * (logp - logp_ref)


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Advantages against the group-mean baseline: (r - mean) / (std + eps) within each row.

    rewards: (n_prompts, group_size), several responses sampled per prompt.

    >>> group_advantages(torch.tensor([[1.0, 3.0]]))
    tensor([[-0.7071,  0.7071]])
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(
            "rewards must have shape (n_prompts, group_size >= 2), got "
            f"{tuple(getattr(rewards, 'shape', ()))}"
        )
    check_finite("rewards", rewards)
    eps = check_float("eps", eps, 0.0, lo_open=True)  # > 0: a group of equal rewards has std 0
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def leave_one_out_advantages(rewards: Tensor) -> Tensor:
    """Advantages against the leave-one-out baseline of RLOO: r_i minus the mean of the other K - 1.

    rewards: (n_prompts, K), several responses sampled per prompt. The baseline of sample i does not
    depend on sample i, so the policy gradient stays unbiased; A_i = K / (K - 1) (r_i - mean).

    >>> leave_one_out_advantages(torch.tensor([[1.0, 3.0, 5.0]]))
    tensor([[-3.,  0.,  3.]])
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(
            "rewards must have shape (n_prompts, K >= 2), got "
            f"{tuple(getattr(rewards, 'shape', ()))}"
        )
    check_finite("rewards", rewards)
    K = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (K - 1)  # (n_prompts, K)
    return rewards - others


def ppo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    clip_eps: float = 0.2,
) -> Tensor:
    """The clipped surrogate of PPO, as a loss to minimise: -mean min(rho A, clip(rho, 1-eps, 1+eps)
    A).

    rho = exp(logp - logp_old) per token; mask selects the tokens that count.

    >>> float(ppo_loss(torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([2.0])))  # rho = 1
    -2.0
    """
    _same_shape(logp=logp, logp_old=logp_old, advantages=advantages, nonempty=True)
    clip_eps = check_float("clip_eps", clip_eps, 0.0, 1.0, lo_open=True, hi_open=True)
    if mask is not None:
        mask = check_mask("mask", mask, logp.shape)
        if not bool(mask.any()):
            raise ValueError("mask selects no token")
    rho = torch.exp(logp - logp_old)
    surrogate = torch.minimum(
        rho * advantages, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * advantages
    )
    if mask is None:
        return -surrogate.mean()
    m = mask.to(surrogate.dtype)
    return -(surrogate * m).sum() / m.sum()


def dpo_loss(
    logp_chosen: Tensor,
    logp_rejected: Tensor,
    logp_ref_chosen: Tensor,
    logp_ref_rejected: Tensor,
    beta: float,
) -> Tensor:
    """Direct preference optimisation: the reward-model loss with r = beta log(pi / pi_ref).

    The maximiser of eq. 15 (gamma = 0) is pi* ∝ pi_ref exp(r / beta), so
    r = beta log(pi*/pi_ref) + const; putting that r into eq. 14 gives this loss on the sequence
    log-probabilities (B,).

    >>> round(float(dpo_loss(*(torch.zeros(1),) * 4, beta=0.1)), 4)  # pi = pi_ref: ln 2
    0.6931
    """
    _same_shape(
        logp_chosen=logp_chosen,
        logp_rejected=logp_rejected,
        logp_ref_chosen=logp_ref_chosen,
        logp_ref_rejected=logp_ref_rejected,
        nonempty=True,
    )
    beta = check_float("beta", beta, 0.0)
    margin = (logp_chosen - logp_ref_chosen) - (logp_rejected - logp_ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


class RewardModel(torch.nn.Module):
    """r(X, Y): a GPT backbone with its unembedding replaced by a scalar head on the last token.

    ``backbone`` is a :class:`gptlib.model.GPT` (copied, so the policy is not shared); the reward of
    a
    sequence is ``w_r . h_T + b_r`` with ``h_T`` the final (normalised) residual vector of the last
    real token. ``lengths`` (B,) gives the number of real tokens of each row (right padding).
    """

    def __init__(self, backbone):
        super().__init__()
        self.backbone = copy.deepcopy(backbone)
        d_model = self.backbone.config.d_model
        self.w_r = torch.nn.Parameter(torch.zeros(d_model))
        self.b_r = torch.nn.Parameter(torch.zeros(()))

    def forward(self, ids: Tensor, lengths: Tensor | None = None) -> Tensor:
        h = self.backbone.hidden_states(ids)  # (B, T, d_model); the backbone checks ids
        B, T = ids.shape
        if lengths is None:
            last = torch.full((B,), T - 1, device=ids.device)
        else:
            if not isinstance(lengths, Tensor) or lengths.shape != (B,):
                raise ValueError(
                    f"lengths must be a tensor of shape ({B},), got "
                    f"{getattr(lengths, 'shape', lengths)!r}"
                )
            if lengths.dtype not in (
                torch.int64,
                torch.int32,
                torch.int16,
                torch.int8,
                torch.uint8,
            ):
                raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
            if int(lengths.min()) < 1 or int(lengths.max()) > T:
                raise ValueError(f"lengths must lie in [1, {T}], got {lengths.tolist()}")
            last = lengths.long() - 1
        h_last = h[torch.arange(B, device=ids.device), last]  # (B, d_model)
        return h_last @ self.w_r + self.b_r  # (B,)
