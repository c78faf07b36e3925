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
    per_sample = rlhf.kl_penalty(p.log()[x], q.log()[x], beta=1.0)
    est, se = float(per_sample.mean()), float(per_sample.std()) / math.sqrt(len(x))
    exact = float((p * (p / q).log()).sum())
    assert abs(est - exact) < 4 * se  # an unbiased estimate: within 4 standard errors


def test_group_advantages_are_centred_and_scaled():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]])
    a = rlhf.group_advantages(r)
    torch.testing.assert_close(a.mean(dim=1), torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(a.std(dim=1), torch.ones(2), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rewards"):
        rlhf.group_advantages(torch.ones(3))


def test_leave_one_out_advantages_hand_values_and_unbiased_baseline():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]])
    a = rlhf.leave_one_out_advantages(r)
    # r_i minus the mean of the three others, by hand
    torch.testing.assert_close(
        a,
        torch.tensor(
            [[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0], [-2 / 3, -2 / 3, 1 - 1 / 3, 1 - 1 / 3]]
        ),
    )
    torch.testing.assert_close(
        a, 4 / 3 * (r - r.mean(dim=1, keepdim=True))
    )  # K / (K - 1) times the centred r
    # the baseline of sample i does not move when r_i does
    bumped = r.clone()
    bumped[0, 2] += 5.0
    base, base_bumped = r - a, bumped - rlhf.leave_one_out_advantages(bumped)
    assert base_bumped[0, 2] == base[0, 2] and not torch.equal(base_bumped[0], base[0])
    with pytest.raises(ValueError, match="rewards"):
        rlhf.leave_one_out_advantages(torch.ones(3, 1))


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
    assert float(rlhf.dpo_loss(*args, beta=beta)) == pytest.approx(
        -math.log(sigmoid(beta * margin)), rel=1e-6
    )
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


# --- the reward model ---------------------------------------------------------------------------


def tiny_gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig.preset("tiny", dropout=0.0, **overrides)).eval()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is as fast, and the sums do not depend on the core count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_reward_model_reads_the_last_real_token_and_copies_its_backbone():
    backbone = tiny_gpt()
    rm = rlhf.RewardModel(backbone)
    assert rm.backbone is not backbone and all(
        p is not q for p, q in zip(rm.parameters(), backbone.parameters())
    )
    ids = torch.randint(0, 512, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(
            rm(ids), torch.zeros(3)
        )  # the head starts at zero: every reward is 0, eq. 14 gives ln 2
        assert float(rlhf.reward_model_loss(rm(ids[:1]), rm(ids[1:2]))) == pytest.approx(
            math.log(2)
        )
        rm.w_r.normal_(generator=torch.Generator().manual_seed(2))
        rm.b_r.fill_(0.5)
        h = backbone.hidden_states(ids)  # (3, 10, d_model): the copy has the same weights
        torch.testing.assert_close(rm(ids), h[:, -1] @ rm.w_r + 0.5)
        lengths = torch.tensor(
            [10, 4, 1]
        )  # right padding: the reward of row i reads position lengths[i] - 1
        padded = rm(ids, lengths)
        for i, n in enumerate(
            lengths.tolist()
        ):  # causal: the padding after a row's end changes nothing
            torch.testing.assert_close(padded[i], rm(ids[i : i + 1, :n])[0], atol=1e-5, rtol=1e-5)
    for bad in (torch.tensor([10, 4]), torch.tensor([10, 0, 3]), torch.tensor([11, 4, 3])):
        with pytest.raises(ValueError, match="lengths"):
            rm(ids, bad)
    assert "w_r" not in dict(backbone.named_parameters())  # the head is the reward model's own


def test_preference_pairs_keep_the_order_and_drop_ties():
    samples = torch.arange(8)[:, None].expand(8, 3)  # 2 prompts x K = 4, row r holds r
    scores = torch.tensor([[0.5, 1.0, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]])
    Yw, Yl = rlhf.preference_pairs(samples, scores)
    # prompt 0: pairs (0,1) (0,3) (1,2) (1,3) (2,3) differ; (0,2) ties; prompt 1: all tie
    assert list(zip(Yw[:, 0].tolist(), Yl[:, 0].tolist())) == [
        (1, 0),
        (0, 3),
        (1, 2),
        (1, 3),
        (2, 3),
    ]
    assert Yw.shape == (5, 3)
    with pytest.raises(ValueError, match="tie"):
        rlhf.preference_pairs(samples[4:], scores[1:])
    with pytest.raises(ValueError, match="samples"):
        rlhf.preference_pairs(samples[:7], scores)


# --- the loops ----------------------------------------------------------------------------------

P, Y = 4, 6  # prompt and response lengths of the loop tests


def prompts(n, seed=0):
    return torch.randint(0, 512, (n, P), generator=torch.Generator().manual_seed(seed))


def test_response_mask_and_sample_responses():
    assert (
        rlhf.response_mask(torch.zeros(2, 5, dtype=torch.long), 3).tolist()
        == [[False] * 3 + [True] * 2] * 2
    )
    for bad in (0, 5):
        with pytest.raises(ValueError, match="prompt_len"):
            rlhf.response_mask(torch.zeros(2, 5, dtype=torch.long), bad)
    model, x = tiny_gpt(), prompts(3)
    a = rlhf.sample_responses(model, x, Y, 2, torch.Generator().manual_seed(0))
    b = rlhf.sample_responses(model, x, Y, 2, torch.Generator().manual_seed(0))
    assert a.shape == (6, P + Y) and torch.equal(a, b)
    assert torch.equal(a[:, :P], x.repeat_interleave(2, dim=0))  # prompt i in rows 2i and 2i + 1
    with pytest.raises(ValueError, match="n_per_prompt"):
        rlhf.sample_responses(model, x, Y, 0)
    with pytest.raises(ValueError, match="prompts"):
        rlhf.sample_responses(model, x[0], Y)


def test_sft_lowers_the_loss_and_leaves_the_model_alone():
    model = tiny_gpt()
    demos = torch.cat(
        [prompts(8), torch.arange(10, 10 + Y).expand(8, Y)], dim=1
    )  # (8, P + Y): one response
    before = {k: v.clone() for k, v in model.state_dict().items()}
    policy, losses = rlhf.sft(model, demos, P, steps=15, lr=3e-3, seed=0, batch_size=4)
    assert len(losses) == 15 and policy.training is False
    with torch.no_grad():
        start, end = float(rlhf.sft_loss(model, demos, P)), float(rlhf.sft_loss(policy, demos, P))
    assert start == pytest.approx(losses[0], rel=0.2) and end < start - 1.0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # trained a copy
    with pytest.raises(ValueError, match="lr"):
        rlhf.sft(model, demos, P, steps=1, lr=float("nan"), seed=0)


def test_sft_loss_is_nats_per_response_token():
    model, ids = tiny_gpt(), torch.cat([prompts(2), prompts(2, seed=1)[:, :3]], dim=1)  # (2, P + 3)
    with torch.no_grad():
        lp = torch.log_softmax(model(ids), dim=-1)[:, P - 1 : -1].gather(-1, ids[:, P:, None])[
            ..., 0
        ]  # (2, 3)
        torch.testing.assert_close(rlhf.sft_loss(model, ids, P), -lp.mean())


def test_train_reward_model_starts_at_ln2_and_learns_a_separable_preference():
    backbone = tiny_gpt()
    x = prompts(16)
    chosen = torch.cat(
        [x, torch.full((16, Y), 7)], dim=1
    )  # the preferred response: token 7 repeated
    rejected = torch.cat(
        [x, torch.randint(100, 512, (16, Y), generator=torch.Generator().manual_seed(3))], dim=1
    )
    rm, losses = rlhf.train_reward_model(
        backbone, chosen, rejected, steps=30, lr=3e-3, seed=0, batch_size=8
    )
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6) and losses[-1] < 0.2
    with torch.no_grad():
        assert bool((rm(chosen) > rm(rejected)).all())
    with pytest.raises(ValueError, match="chosen and rejected"):
        rlhf.train_reward_model(backbone, chosen, rejected[:, 1:], steps=1, lr=1e-3, seed=0)


def low_tokens(ids):
    """The share of response tokens in the lower half of the vocabulary: a reward and a judge."""
    return (ids[:, P:] < 256).float().mean(dim=1)


def test_ppo_ratio_is_one_at_the_first_epoch_and_kl_starts_at_zero(monkeypatch):
    from gptlib.rlhf import loops

    ratios = []

    def recording_ppo_loss(logp, logp_old, *args, **kwargs):
        ratios.append(torch.exp(logp - logp_old).detach())
        return rlhf.ppo_loss(logp, logp_old, *args, **kwargs)

    monkeypatch.setattr(loops, "ppo_loss", recording_ppo_loss)
    sft = tiny_gpt()
    policy, hist = rlhf.ppo(
        sft, low_tokens, prompts(6), Y, beta=0.1, steps=3, seed=0, epochs=2, lr=1e-2
    )
    assert len(ratios) == 3 * 2
    for step in range(
        3
    ):  # each batch: the first epoch scores the samples with the policy that drew them
        torch.testing.assert_close(ratios[2 * step], torch.ones_like(ratios[0]))
    assert (
        max(float((r - 1).abs().max()) for r in ratios[1::2]) > 1e-4
    )  # the second epoch has moved
    assert set(hist) == {"reward", "kl"} and all(len(v) == 3 for v in hist.values())
    assert hist["kl"][0] == 0.0  # the first batch is drawn before any update: policy = reference
    assert hist["kl"][-1] != 0.0 and policy.training is False


def low_token_shares(policy, x, seed=3):
    """Per sample: the share of low tokens in one response to each of 64 prompts; mean and SE."""
    ids = rlhf.sample_responses(policy, x.repeat(8, 1), Y, 1, torch.Generator().manual_seed(seed))
    s = low_tokens(ids)  # (64,)
    return float(s.mean()), float(s.std()) / math.sqrt(len(s))


@pytest.mark.slow
def test_ppo_is_seeded_and_raises_the_reward():
    sft, rm, x = tiny_gpt(), low_tokens, prompts(8)
    a, ha = rlhf.ppo(sft, rm, x, Y, beta=0.0, steps=12, seed=1, judge=low_tokens, lr=1e-2)
    _b, hb = rlhf.ppo(sft, rm, x, Y, beta=0.0, steps=12, seed=1, judge=low_tokens, lr=1e-2)
    assert ha == hb and list(ha) == ["judged", "reward", "kl"] and ha["judged"] == ha["reward"]
    before, se_b = low_token_shares(sft, x)  # 64 samples
    assert before == rlhf.judged_score(sft, x.repeat(8, 1), Y, low_tokens, seed=3)
    # an untrained model is close to uniform: half of its 512 tokens are low
    assert abs(before - 0.5) < 4 * se_b
    after, se_a = low_token_shares(a, x)
    assert after - before > 4 * math.hypot(se_a, se_b)  # a rise beyond sampling noise
    c, hc = rlhf.ppo(sft, rm, x, Y, beta=0.0, steps=12, seed=1, lr=1e-2, advantage="rloo")
    assert hc["kl"][0] == ha["kl"][0] and hc != {
        k: ha[k] for k in hc
    }  # same first batch, other updates
    after_c, se_c = low_token_shares(c, x)
    assert after_c - before > 4 * math.hypot(se_c, se_b)  # RLOO learns too
    for name, kwargs in (
        ("beta", {"beta": -0.1}),
        ("group_size", {"group_size": 1}),
        ("epochs", {"epochs": 0}),
        ("advantage", {"advantage": "ppo"}),
    ):
        with pytest.raises(ValueError, match=name):
            rlhf.ppo(sft, rm, x, Y, **{"beta": 0.1, "steps": 1, "seed": 0, **kwargs})


def test_dpo_starts_at_ln2_and_widens_the_margin():
    sft = tiny_gpt()
    x = prompts(12)
    chosen = torch.cat([x, torch.full((12, Y), 7)], dim=1)
    rejected = torch.cat([x, torch.full((12, Y), 9)], dim=1)
    policy, losses = rlhf.dpo(
        sft, chosen, rejected, P, beta=0.5, steps=10, seed=0, lr=3e-3, batch_size=6
    )
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6) and losses[-1] < losses[0] - 0.3
    mask = rlhf.response_mask(chosen, P)
    with torch.no_grad():
        margin = (
            rlhf.sequence_logprob(policy, chosen, mask) - rlhf.sequence_logprob(sft, chosen, mask)
        ) - (
            rlhf.sequence_logprob(policy, rejected, mask)
            - rlhf.sequence_logprob(sft, rejected, mask)
        )
    assert bool((margin > 0).all())
    with pytest.raises(ValueError, match="beta"):
        rlhf.dpo(sft, chosen, rejected, P, beta=float("inf"), steps=1, seed=0)


def test_dpo_with_precomputed_reference_logprobs_is_the_same_run():
    sft = tiny_gpt()
    x = prompts(12)
    chosen = torch.cat([x, torch.full((12, Y), 7)], dim=1)
    rejected = torch.cat([x, torch.full((12, Y), 9)], dim=1)
    ref_w, ref_l = rlhf.reference_logprobs(sft, chosen, rejected, P)
    mask = rlhf.response_mask(chosen, P)
    with torch.no_grad():  # the reference's log pi(Y|X) per pair, as sequence_logprob gives it
        torch.testing.assert_close(ref_w, rlhf.sequence_logprob(sft, chosen, mask))
        torch.testing.assert_close(ref_l, rlhf.sequence_logprob(sft, rejected, mask))
    kwargs = {"beta": 0.5, "steps": 4, "seed": 0, "lr": 3e-3, "batch_size": 6}
    a, la = rlhf.dpo(sft, chosen, rejected, P, **kwargs)
    b, lb = rlhf.dpo(sft, chosen, rejected, P, ref_logprobs=(ref_w, ref_l), **kwargs)
    assert la == lb  # the same computation, the reference scored by the caller instead
    assert all(torch.equal(u, v) for u, v in zip(a.parameters(), b.parameters()))
    short, nan = (ref_w[:-1], ref_l), (ref_w, torch.full_like(ref_l, float("nan")))
    for pair, name in ((short, r"ref_logprobs\[0\]"), (nan, r"ref_logprobs\[1\]")):
        with pytest.raises(ValueError, match=name):
            rlhf.dpo(sft, chosen, rejected, P, ref_logprobs=pair, **kwargs)


def test_kl_to_itself_is_zero_and_to_another_model_positive():
    a, b, x = tiny_gpt(0), tiny_gpt(1), prompts(64)
    assert rlhf.kl_to(a, a, x, Y) == 0.0
    # the estimate is the mean log-ratio of the samples that judged_score sees too
    ids = rlhf.sample_responses(a, x, Y, 1, torch.Generator().manual_seed(2))
    with torch.no_grad():
        m = rlhf.response_mask(ids, P)
        per_seq = rlhf.sequence_logprob(a, ids, m) - rlhf.sequence_logprob(b, ids, m)  # (64,)
    assert rlhf.kl_to(a, b, x, Y, seed=2) == pytest.approx(float(per_seq.mean()), rel=1e-5)
    with torch.no_grad():
        la = torch.log_softmax(a(ids)[:, P - 1 : -1].double(), dim=-1)  # (64, Y, d_vocab)
        lb = torch.log_softmax(b(ids)[:, P - 1 : -1].double(), dim=-1)
    exact = (la.exp() * (la - lb)).sum(dim=(1, 2))  # per sequence: the softmax's own KL, summed
    assert bool((exact > 0).all())  # two different models: positive at every prefix
    gap = per_seq.double() - exact  # unbiased: the Monte Carlo estimate minus its expectation
    assert abs(float(gap.mean())) < 4 * float(gap.std()) / math.sqrt(len(gap))
    assert rlhf.judged_score(a, x, Y, lambda s: (s == ids).all(dim=1).float(), seed=2) == 1.0


def test_evaluate_policy_is_judged_score_and_kl_to_on_one_set_of_samples():
    a, b, x = tiny_gpt(0), tiny_gpt(1), prompts(64)

    def judge(s):  # any function of the sequences: here the share of low tokens
        return (s[:, P:] < 256).float().mean(dim=1)

    ev = rlhf.evaluate_policy(a, b, x, Y, judge, seed=2)
    # the samples of judged_score and kl_to for the same seed, drawn once
    assert torch.equal(ev.ids, rlhf.sample_responses(a, x, Y, 1, torch.Generator().manual_seed(2)))
    assert ev.score == rlhf.judged_score(a, x, Y, judge, seed=2)
    assert ev.kl == rlhf.kl_to(a, b, x, Y, seed=2)  # kl_to is this evaluation's k1
    assert ev.log_ratio.shape == ev.exact_kl.shape == (64, Y)
    assert bool((ev.exact_kl > 0).all())  # two different models: positive at every prefix
    gap = ev.log_ratio.sum(dim=1) - ev.exact_kl.sum(dim=1)  # k1 is unbiased for the exact sum
    assert abs(float(gap.mean())) < 4 * float(gap.std()) / math.sqrt(len(gap))
    same = rlhf.evaluate_policy(a, a, x, Y, judge, seed=2)  # KL to itself: 0 exactly
    assert same.kl == 0.0 and bool((same.exact_kl.abs() < 1e-12).all())
    alone = rlhf.evaluate_policy(a, None, x, Y, judge, seed=2)  # no reference: no scoring pass
    assert alone.score == ev.score and alone.log_ratio is None and alone.exact_kl is None
    with pytest.raises(ValueError, match="ref"):
        _ = alone.kl
    with pytest.raises(ValueError, match="response_len"):
        rlhf.evaluate_policy(a, b, x, 0, judge)


# --- chapter 9's toy task ----------------------------------------------------------------------


def test_sentence_task_prompts_open_sentences_of_their_own_split():
    from gptlib.rlhf.toy_task import SentenceLabeller, sentence_starts, sentence_task
    from gptlib.tokenizers import BPETokenizer

    train = (
        " ".join(
            f"The cat {w} the mat. A dog ran home today and slept."
            for w in ("sat on", "ran to", "saw")
        )
        * 4
    )
    val = "He said so. She said no and went out of the room to sleep. " * 3
    tok = BPETokenizer.train(train + val, 300)
    ids = torch.tensor(tok.encode(train))
    starts = sentence_starts(ids, tok, 3, 2)
    assert len(starts) > 0
    for o in starts.tolist():  # a sentence ended just before; prompt and response start words
        assert tok.decode([int(ids[o - 1])]).rstrip(" ").endswith((".", "?", "!", "\n"))
        assert tok.decode([int(ids[o])])[:1] == " " and tok.decode([int(ids[o + 3])])[:1] in (
            " ",
            "\n",
        )
    judge = SentenceLabeller.from_text(train)
    task = sentence_task(
        tok, train, val, judge, prompt_len=3, response_len=2, n_train=4, n_eval=2, seed=0
    )
    assert task.train_prompts.shape == (4, 3) and task.eval_prompts.shape == (2, 3)
    assert all(tok.decode(p.tolist()) in train for p in task.train_prompts)
    assert all(tok.decode(p.tolist()) in val for p in task.eval_prompts)
    assert torch.equal(task.openings[:, :3], ids[starts[:, None] + torch.arange(3)])
    scores = task.judged(task.openings)
    assert scores.dtype == torch.float32 and scores.shape == (len(starts),)
    parts = task.judged_parts(task.openings)  # (n, 2): finishes a sentence, known words only
    assert parts.dtype == torch.bool and torch.equal(scores, 0.5 * parts.sum(dim=1).float())
    assert scores.tolist() == [judge(tok.decode(w[3:].tolist())) for w in task.openings]
    with pytest.raises(ValueError, match="val_text"):
        sentence_task(tok, train, val, judge, prompt_len=3, response_len=2, n_train=4, n_eval=1000)
