"""Reward-side parts of DAPO and Dr.GRPO in the coordinator: dynamic sampling, overlong shaping, advantages."""

import numpy as np
import pytest

from services.coordinator.advantages import dr_grpo_advantages, groups_with_signal, overlong_penalty


def test_dr_grpo_advantages_are_centred_but_not_scaled():
    rng = np.random.default_rng(1)
    for _ in range(10):
        rewards = (rng.random(6) * 5).tolist()
        np.testing.assert_allclose(dr_grpo_advantages(rewards), np.subtract(rewards, np.mean(rewards)), atol=1e-6)
    with pytest.raises(ValueError, match=">= 2"):
        dr_grpo_advantages([1.0])


def test_dynamic_sampling_drops_exactly_the_zero_variance_groups():
    groups = [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.25, 0.5], [0.3] * 4]
    kept = groups_with_signal(groups)
    assert kept == [i for i, g in enumerate(groups) if np.var(g) > 0] == [1, 3]


def test_overlong_penalty_is_dapo_piecewise_linear():
    max_tokens, buffer = 100, 20

    def expected(length: int) -> float:
        # DAPO eq. 13: 0 below L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache inside the buffer, -1 beyond.
        if length <= max_tokens - buffer:
            return 0.0
        if length <= max_tokens:
            return ((max_tokens - buffer) - length) / buffer
        return -1.0

    for length in (0, 50, 80, 81, 90, 99, 100, 101, 500):
        assert overlong_penalty(length, max_tokens, buffer) == pytest.approx(expected(length), abs=1e-9)
        assert overlong_penalty(length, max_tokens, buffer, penalty=0.5) == pytest.approx(0.5 * expected(length))
    with pytest.raises(ValueError, match="buffer_tokens"):
        overlong_penalty(10, 100, 0)
