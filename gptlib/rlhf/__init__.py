"""Chapter 9: fine-tuning from preferences: SFT, a reward model, PPO and DPO.

``objectives``: the sequence log-probability, the losses (eq. 14, the KL penalty of eq. 15, PPO's
clipped surrogate, DPO), the group advantage and the reward model, as small pure functions.
``loops``: the training loops that use them, with every input passed explicitly,
and ``evaluate_policy``: a policy's judged score and KL measured on one set of samples.
``toy_task``: the chapter's prompts and its stand-in labeller (imported by name, not re-exported
here).
"""

from .loops import (
    Evaluation,
    dpo,
    evaluate_policy,
    judged_score,
    kl_to,
    ppo,
    reference_logprobs,
    response_mask,
    sample_responses,
    sft,
    sft_loss,
    train_reward_model,
)
from .objectives import (
    RewardModel,
    dpo_loss,
    group_advantages,
    kl_penalty,
    leave_one_out_advantages,
    ppo_loss,
    preference_pairs,
    ranking_pairs,
    reward_model_loss,
    sequence_logprob,
    token_logprobs,
)

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
    "response_mask",
    "sample_responses",
    "sft_loss",
    "sft",
    "train_reward_model",
    "ppo",
    "dpo",
    "kl_to",
    "reference_logprobs",
    "judged_score",
    "Evaluation",
    "evaluate_policy",
]
