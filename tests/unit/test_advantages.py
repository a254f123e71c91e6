import numpy as np
import pytest

from services.coordinator.advantages import group_advantages


def test_group_advantages_match_numpy_formula():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rewards = rng.random(8).tolist()
        expected = (np.array(rewards) - np.mean(rewards)) / (np.std(rewards, ddof=1) + 1e-6)
        np.testing.assert_allclose(group_advantages(rewards), expected, atol=1e-6)


def test_equal_rewards_give_zero_advantage():
    assert group_advantages([0.5] * 4) == [0.0] * 4


def test_group_of_one_is_rejected():
    with pytest.raises(ValueError, match=">= 2"):
        group_advantages([1.0])
