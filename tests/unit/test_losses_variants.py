"""DAPO, GSPO, Dr.GRPO, truncated IS, KL, entropy and the composed objective, each against an independent
plain-Python formula."""

import math
import random

import pytest
import torch

from services.common.config import LossSection
from services.trainer.losses import (
    clip_higher_token_loss,
    constant_length_weights,
    gspo_token_loss,
    k1_kl,
    sequence_is_weights,
    sequence_mean_weights,
    token_is_weights,
    token_logprobs_and_entropy,
    token_mean_weights,
)
from services.trainer.objective import TokenInputs, loss_weights, token_objective


def _rand(n: int, seed: int, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, scale) for _ in range(n)]


def _t(values, **kw) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, **kw)


def _clipped_surrogate(ratio: float, adv: float, low: float, high: float) -> float:
    # The PPO case analysis instead of min(): a positive advantage is capped at 1 + high, a negative one at
    # 1 - low; the other side of the ratio is never clipped.
    return min(ratio, 1 + high) * adv if adv >= 0 else max(ratio, 1 - low) * adv


def test_clip_higher_matches_case_analysis_with_asymmetric_range():
    n, low, high = 80, 0.2, 0.28
    logp, old, adv = _rand(n, 1, 0.4), _rand(n, 2, 0.4), _rand(n, 3)
    got = clip_higher_token_loss(_t(logp), _t(old), _t(adv), low, high)
    for i in range(n):
        expected = -_clipped_surrogate(math.exp(logp[i] - old[i]), adv[i], low, high)
        assert abs(got[i].item() - expected) < 1e-6


def test_clip_higher_lets_ratios_between_the_two_bounds_keep_their_gradient():
    # ratio 1.25 is above 1 + 0.2 but below 1 + 0.28: clipped by GRPO, not by clip-higher.
    logp = torch.tensor([math.log(1.25), math.log(1.35)], requires_grad=True)
    clip_higher_token_loss(logp, torch.zeros(2), torch.ones(2), 0.2, 0.28).sum().backward()
    assert logp.grad.tolist() == pytest.approx([-1.25, 0.0])


def _segments(lens: list[int]) -> torch.Tensor:
    return torch.tensor([s for s, n in enumerate(lens) for _ in range(n)])


def test_gspo_value_and_gradient_match_the_sequence_level_objective():
    lens, low, high = [4, 7, 1, 5], 0.003, 0.004
    n = sum(lens)
    logp, old = _rand(n, 4, 0.004), _rand(n, 5, 0.004)
    adv = [a for a, k in zip([1.0, -0.5, 2.0, -1.5], lens) for _ in range(k)]
    logp_T = _t(logp, requires_grad=True)
    loss_T = gspo_token_loss(logp_T, _t(old), _t(adv), _segments(lens), 4, low, high)
    weights_T = sequence_mean_weights(torch.tensor(lens)).double()
    (loss_T * weights_T).sum().backward()
    start, num_clipped = 0, 0
    for k in lens:
        a = adv[start]
        s = math.exp(sum(logp[start : start + k]) / k - sum(old[start : start + k]) / k)
        clipped = (a >= 0 and s > 1 + high) or (a < 0 and s < 1 - low)
        num_clipped += clipped
        for t in range(start, start + k):
            assert abs(loss_T[t].item() + _clipped_surrogate(s, a, low, high)) < 1e-6
            # d/dlogp_t of -(1/B) * s_i * A_i with s_i = exp(mean_t log ratio) is -(1/B) * A_i * s_i / len_i
            expected_grad = 0.0 if clipped else -a * s / (len(lens) * k)
            assert abs(logp_T.grad[t].item() - expected_grad) < 1e-6
        start += k
    assert 0 < num_clipped < len(lens), "the case should hold clipped and unclipped sequences"


def test_token_is_weights_are_truncated_ratios_without_gradient():
    old, rollout = _rand(60, 6, 1.0), _rand(60, 7, 1.0)
    old_T = _t(old, requires_grad=True)
    got = token_is_weights(old_T, _t(rollout), truncation=2.0)
    assert not got.requires_grad
    for o, r, g in zip(old, rollout, got.tolist()):
        assert abs(g - min(math.exp(o) / math.exp(r), 2.0)) < 1e-6


def test_sequence_is_weights_use_the_product_over_each_sequence():
    lens = [3, 6, 2, 400]
    n = sum(lens)
    old, rollout = _rand(n, 8, 0.3), _rand(n, 9, 0.3)
    old[-400:] = [o + 1.0 for o in old[-400:]]  # log weight ~400: exp overflows fp32, the weight is still 2
    got = sequence_is_weights(_t(old).float(), _t(rollout).float(), _segments(lens), 4, 1.5)
    start = 0
    for k in lens:
        product = 1.0
        for t in range(start, start + k):
            product *= math.exp(old[t]) / math.exp(rollout[t])
        for t in range(start, start + k):
            assert abs(got[t].item() - min(product, 1.5)) < 1e-6
        start += k


def test_k1_is_the_log_probability_ratio():
    rng = random.Random(10)
    p, q = [rng.uniform(0.01, 1) for _ in range(30)], [rng.uniform(0.01, 1) for _ in range(30)]
    got = k1_kl(_t([math.log(x) for x in p]), _t([math.log(x) for x in q]))
    for a, b, g in zip(p, q, got.tolist()):
        assert abs(g - math.log(a / b)) < 1e-6


def test_entropy_matches_softmax_loop():
    rows = [_rand(9, 20 + r, 2.0) for r in range(6)]
    targets = [1, 8, 0, 4, 4, 2]
    logp, entropy = token_logprobs_and_entropy(_t(rows), torch.tensor(targets))
    for row, target, lp, h in zip(rows, targets, logp.tolist(), entropy.tolist()):
        z = sum(math.exp(x) for x in row)
        probs = [math.exp(x) / z for x in row]
        assert abs(h + sum(p * math.log(p) for p in probs)) < 1e-6
        assert abs(lp - math.log(probs[target])) < 1e-6


def test_aggregation_weights():
    lens = [3, 1, 6]
    expected = {
        "token": [1 / 10] * 10,
        "sequence": [1 / (3 * 3)] * 3 + [1 / (3 * 1)] + [1 / (3 * 6)] * 6,
        "constant": [1 / (3 * 8)] * 10,
    }
    got = {
        "token": token_mean_weights(torch.tensor(lens)),
        "sequence": sequence_mean_weights(torch.tensor(lens)),
        "constant": constant_length_weights(torch.tensor(lens), max_tokens=8),
    }
    for key, values in expected.items():
        assert got[key].tolist() == pytest.approx(values, abs=1e-7), key
    with pytest.raises(ValueError, match=">= 1 token"):
        constant_length_weights(torch.tensor(lens), max_tokens=0)


def _inputs(seed: int, lens: list[int]) -> dict[str, list[float]]:
    n = sum(lens)
    return {
        "logp": _rand(n, seed, 0.5),
        "old": _rand(n, seed + 1, 0.5),
        "adv": _rand(n, seed + 2),
        "rollout": _rand(n, seed + 3, 0.5),
        "ref": _rand(n, seed + 4, 0.5),
        "entropy": [abs(x) for x in _rand(n, seed + 5)],
    }


@pytest.mark.parametrize("importance_sampling", ["off", "token"])
@pytest.mark.parametrize("kl_estimator", ["k1", "k3"])
def test_objective_composes_weighted_policy_loss_kl_and_entropy(importance_sampling, kl_estimator):
    cfg = LossSection(
        name="dapo",
        kl_beta=0.05,
        kl_estimator=kl_estimator,
        entropy_coef=0.01,
        importance_sampling=importance_sampling,
        is_truncation=1.3,
    )
    lens = [5, 2, 9]
    x = _inputs(30, lens)
    inputs = TokenInputs(
        logp_R=_t(x["logp"]),
        old_logp_R=_t(x["old"]),
        advantages_R=_t(x["adv"]),
        rollout_logp_R=_t(x["rollout"]),
        ref_logp_R=_t(x["ref"]),
        entropy_R=_t(x["entropy"]),
        segment_R=_segments(lens),
        num_segments=3,
    )
    got = token_objective(cfg, inputs).loss_R
    for t in range(sum(lens)):
        ratio = math.exp(x["logp"][t] - x["old"][t])
        pg = -_clipped_surrogate(ratio, x["adv"][t], cfg.clip_eps_low, cfg.clip_eps_high)
        w = min(math.exp(x["old"][t] - x["rollout"][t]), 1.3) if importance_sampling == "token" else 1.0
        r = math.exp(x["ref"][t] - x["logp"][t])
        kl = r - math.log(r) - 1 if kl_estimator == "k3" else -math.log(r)
        expected = w * pg + 0.05 * kl - 0.01 * x["entropy"][t]
        assert abs(got[t].item() - expected) < 1e-6


def test_loss_weights_follow_the_configured_loss():
    lens = torch.tensor([2, 6])
    assert loss_weights(LossSection(), lens).tolist() == pytest.approx([1 / 8] * 8)
    assert loss_weights(LossSection(name="gspo"), lens).tolist() == pytest.approx([1 / 4] * 2 + [1 / 12] * 6)
    dr = LossSection(name="dr_grpo", dr_grpo_norm_tokens=10)
    assert loss_weights(dr, lens).tolist() == pytest.approx([1 / 20] * 8)
    # Unset, Dr.GRPO's normaliser is the generation budget that came with the batch; a configured one wins.
    assert loss_weights(LossSection(name="dr_grpo"), lens, 10).tolist() == pytest.approx([1 / 20] * 8)
    assert loss_weights(dr, lens, 99).tolist() == pytest.approx([1 / 20] * 8)
