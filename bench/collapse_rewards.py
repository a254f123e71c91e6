"""reasoning-gym's verifier without its partial credit, for the collapse study (bench/README.md): task.rewards =
{ "bench.collapse_rewards:reasoning_gym_full_marks" = 1.0 }."""

from __future__ import annotations

from services.common.rewards import full_marks, reasoning_gym_reward


def reasoning_gym_full_marks(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 where reasoning-gym gives full marks, else 0.0. Its default score_answer gives len(answer) / len(given)
    when the answer is a substring of the extracted one, so "10" scores 0.5 against "1" (letter_counting)."""
    return float(full_marks(reasoning_gym_reward(prompt, completion, answer, metadata)))
