"""gptlib.rlhf: each loss against values computed by hand, plus its error cases."""

import math

import pytest
import torch

from gptlib import rlhf
from gptlib.model import GPT, GPTConfig


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_reward_model_loss_hand_values():
    rw, rl = torch.tensor([2.0, 0.5, -1.0]), torch.tensor([1.0, 1.5, -1.0])
    expected = -(math.log(sigmoid(1.0)) + math.log(sigmoid(-1.0)) + math.log(0.5)) / 3
    assert float(rlhf.reward_model_loss(rw, rl)) == pytest.approx(expected, rel=1e-6)


def test_reward_model_loss_prefers_the_right_order_and_its_gradient():
    r = torch.tensor([0.3, -0.2], requires_grad=True)
    loss = rlhf.reward_model_loss(r[:1], r[1:])
    loss.backward()
    # d/dr_w [-log sigma(r_w - r_l)] = -(1 - sigma(margin))
    assert float(r.grad[0]) == pytest.approx(-(1 - sigmoid(0.5)), rel=1e-6)
    assert float(r.grad[1]) == pytest.approx(1 - sigmoid(0.5), rel=1e-6)


def test_ranking_pairs_counts_C_K_2():
    for K in range(2, 7):
        pairs = rlhf.ranking_pairs(K)
        assert len(pairs) == math.comb(K, 2) and all(i < j for i, j in pairs)
    with pytest.raises(ValueError, match="K"):
        rlhf.ranking_pairs(1)


def test_kl_penalty_values_and_beta_check():
    out = rlhf.kl_penalty(torch.tensor([-0.5, -3.0]), torch.tensor([-1.0, -1.0]), beta=0.2)
    torch.testing.assert_close(out, torch.tensor([0.1, -0.4]))
    with pytest.raises(ValueError, match="beta"):
        rlhf.kl_penalty(torch.zeros(2), torch.zeros(2), beta=-0.1)
    with pytest.raises(ValueError, match="beta"):
        rlhf.kl_penalty(torch.zeros(2), torch.zeros(2), beta=float("nan"))
    with pytest.raises(ValueError, match="shapes"):
        rlhf.kl_penalty(torch.zeros(2), torch.zeros(3), beta=0.1)


def test_kl_penalty_sums_to_a_kl_estimate():
    # Sampling from p and averaging log p - log q estimates KL(p || q).
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = rlhf.kl_penalty(p.log()[x], q.log()[x], beta=1.0).mean()
    exact = float((p * (p / q).log()).sum())
    assert float(est) == pytest.approx(exact, abs=5e-3)


def test_group_advantages_are_centred_and_scaled():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]])
    a = rlhf.group_advantages(r)
    torch.testing.assert_close(a.mean(dim=1), torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(a.std(dim=1), torch.ones(2), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rewards"):
        rlhf.group_advantages(torch.ones(3))


def test_ppo_loss_clips_only_in_the_profitable_direction():
    lp_old = torch.zeros(4)
    lp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))  # ratios
    A = torch.tensor([1.0, 1.0, -1.0, -1.0])
    # per token: min(rho A, clip(rho) A) = 1.2, 0.5, -1.5, -0.8
    expected = -(1.2 + 0.5 - 1.5 - 0.8) / 4
    assert float(rlhf.ppo_loss(lp, lp_old, A)) == pytest.approx(expected, rel=1e-6)
    mask = torch.tensor([True, False, True, False])
    assert float(rlhf.ppo_loss(lp, lp_old, A, mask)) == pytest.approx(-(1.2 - 1.5) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="clip_eps"):
        rlhf.ppo_loss(lp, lp_old, A, clip_eps=0)
    with pytest.raises(ValueError, match="mask"):
        rlhf.ppo_loss(lp, lp_old, A, torch.zeros(4, dtype=torch.bool))


def test_ppo_gradient_at_rho_one_is_the_policy_gradient():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    A = torch.tensor([0.5, -2.0])
    rlhf.ppo_loss(lp, lp.detach(), A).backward()
    torch.testing.assert_close(lp.grad, -A / 2)


def test_dpo_loss_hand_value_and_reduction_to_reward_loss():
    beta = 0.5
    args = torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0])
    margin = (-1.0 + 2.0) - (-3.0 + 2.0)
    assert float(rlhf.dpo_loss(*args, beta=beta)) == pytest.approx(-math.log(sigmoid(beta * margin)), rel=1e-6)
    # DPO is the reward-model loss with implicit rewards beta * log(pi / pi_ref).
    r_w, r_l = beta * (args[0] - args[2]), beta * (args[1] - args[3])
    torch.testing.assert_close(rlhf.dpo_loss(*args, beta=beta), rlhf.reward_model_loss(r_w, r_l))
    with pytest.raises(ValueError, match="beta"):
        rlhf.dpo_loss(*args, beta=-1)


def test_sequence_logprob_equals_the_sum_of_stepwise_logprobs():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    ids = torch.randint(0, 512, (2, 9))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[:, 5:] = True  # prompt = 5 tokens, response = 4
    with torch.no_grad():
        one_pass = rlhf.sequence_logprob(model, ids, mask)
        stepwise = torch.zeros(2)
        for t in range(5, 9):  # G: one step at a time, each from its own prefix
            lp = torch.log_softmax(model(ids[:, :t])[:, -1], dim=-1)
            stepwise += lp.gather(-1, ids[:, t : t + 1])[:, 0]
    torch.testing.assert_close(one_pass, stepwise, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="position 0"):
        rlhf.sequence_logprob(model, ids, torch.ones_like(mask))
    with pytest.raises(ValueError, match="response_mask"):
        rlhf.sequence_logprob(model, ids, mask[:, :5])


def test_token_logprobs_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="logits"):
        rlhf.token_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 4, dtype=torch.long))
