"""Asynchronous GRPO's loss (coordinator.max_staleness >= 1) is AReaL's decoupled PPO objective: the ratio clipped
around the proximal policy (the trainer's weights before the update), the behaviour policy (the engine's, some
versions back) entering through a truncated importance weight; with nothing stale it is today's loss exactly."""

import math
import random

import pytest
import torch

from services.common.config import ConfigError, load_config
from services.trainer.objective import TokenInputs, token_objective

EPS_LOW, EPS_HIGH, CAP = 0.2, 0.28, 2.0


def _decoupled_areal(logp: float, prox: float, behav: float, adv: float) -> float:
    """AReaL's ppo_actor_loss_fn with proximal_logprobs, written out per token (its cap as a truncation)."""
    ratio = math.exp(logp - prox)
    clipped = min(max(ratio, 1 - EPS_LOW), 1 + EPS_HIGH)
    surrogate = min(ratio * adv, clipped * adv)
    behav_weight = min(math.exp(prox - behav), CAP)
    return -behav_weight * surrogate


def _inputs(logp, prox, behav, adv) -> TokenInputs:
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    n = len(logp)
    return TokenInputs(t(logp), t(prox), t(adv), t(behav), None, None, torch.zeros(n, dtype=torch.long), 1)


def _tokens(n: int, seed: int):
    rng = random.Random(seed)
    prox = [rng.uniform(-3, -0.1) for _ in range(n)]
    # The current policy near the proximal one (both sides of the clip range); behaviour up to a few versions off.
    logp = [p + rng.uniform(-0.5, 0.5) for p in prox]
    behav = [p + rng.uniform(-1.5, 1.5) for p in prox]
    adv = [rng.gauss(0, 1) for _ in range(n)]
    return logp, prox, behav, adv


def test_asynchronous_loss_is_areals_decoupled_objective():
    cfg = load_config(None, ["coordinator.max_staleness=2", 'trainer.loss="dapo"']).trainer.loss
    assert (cfg.importance_sampling, cfg.is_truncation) == ("token", CAP)
    logp, prox, behav, adv = _tokens(64, seed=1)
    got = token_objective(cfg, _inputs(logp, prox, behav, adv)).loss_R.tolist()
    want = [_decoupled_areal(*x) for x in zip(logp, prox, behav, adv)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert any(math.exp(p - b) > CAP for p, b in zip(prox, behav)), "no token reached the cap: truncation untested"


def test_with_nothing_stale_it_is_the_synchronous_loss_exactly():
    sync = load_config(None, ['trainer.loss="dapo"']).trainer.loss
    asynchronous = load_config(None, ["coordinator.max_staleness=1", 'trainer.loss="dapo"']).trainer.loss
    assert sync.importance_sampling == "off"
    logp, prox, _, adv = _tokens(64, seed=2)
    fresh = _inputs(logp, prox, prox, adv)  # sampled by the version it trains: behaviour = proximal
    assert torch.equal(token_objective(asynchronous, fresh).loss_R, token_objective(sync, fresh).loss_R)


def test_the_gradient_is_the_behaviour_weighted_policy_gradient_inside_the_clip_range():
    cfg = load_config(None, ["coordinator.max_staleness=1", 'trainer.loss="dapo"']).trainer.loss
    _, prox, behav, adv = _tokens(32, seed=3)
    logp = torch.tensor(prox, dtype=torch.float64, requires_grad=True)  # one optimizer step: logp = prox at first
    x = _inputs(prox, prox, behav, adv)
    x = TokenInputs(logp, *[getattr(x, f) for f in TokenInputs.__slots__[1:]])
    token_objective(cfg, x).loss_R.sum().backward()
    want = [-min(math.exp(p - b), CAP) * a for p, b, a in zip(prox, behav, adv)]
    assert logp.grad.tolist() == pytest.approx(want, rel=1e-12)


def test_an_unweighted_asynchronous_loss_is_refused_and_an_explicit_weighting_kept():
    with pytest.raises(ConfigError, match="importance_sampling = 'off' would leave that unweighted"):
        load_config(None, ["coordinator.max_staleness=1", "trainer.loss.importance_sampling=off"])
    cfg = load_config(None, ["coordinator.max_staleness=1", "trainer.loss.importance_sampling=sequence"])
    assert cfg.trainer.loss.importance_sampling == "sequence"
    assert load_config(None, []).trainer.loss.importance_sampling == "off"
