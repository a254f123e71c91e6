"""How the coordinator turns scored groups into a training batch (no services needed)."""

import pytest

from protos.grpo.v1 import queue_pb2
from services.common.config import load_config
from services.coordinator.loop import GrpoLoop
from services.coordinator.state import RunState


def _loop(tmp_path, *overrides):
    cfg = load_config(None, ["coordinator.max_tokens=4", *overrides])
    return GrpoLoop(cfg, None, None, None, tmp_path, RunState(run_id="r", num_steps=1))


def _group(index, rewards, lengths=None):
    lengths = lengths or [4] * len(rewards)
    trajectories = [
        queue_pb2.Trajectory(trajectory_id=f"r/1/{index}/{i}", response_ids=[5] * n, logprobs=[-1.0] * n, reward=r)
        for i, (r, n) in enumerate(zip(rewards, lengths))
    ]
    return queue_pb2.TrajectoryGroup(step=1, prompt_index=index, prompt_ids=[2, 3], trajectories=trajectories)


def test_every_trajectory_in_batch_with_std_normalised_advantages(tmp_path):
    seqs = _loop(tmp_path).advantages([_group(0, [1.0, 0.0]), _group(1, [0.5, 0.5])])
    assert [s.trajectory_id for s in seqs] == ["r/1/0/0", "r/1/0/1", "r/1/1/0", "r/1/1/1"]
    assert [round(s.advantage, 4) for s in seqs] == [0.7071, -0.7071, 0.0, 0.0]


def test_dynamic_sampling_drops_groups_without_signal(tmp_path):
    seqs = _loop(tmp_path, "coordinator.dynamic_sampling=true").advantages(
        [_group(0, [1.0, 0.0]), _group(1, [1.0, 1.0])]
    )
    assert {s.trajectory_id.split("/")[2] for s in seqs} == {"0"}


def test_dr_grpo_centres_without_dividing(tmp_path):
    seqs = _loop(tmp_path, 'trainer.loss="dr_grpo"').advantages([_group(0, [1.0, 0.0, 0.0, 0.0])])
    assert [s.advantage for s in seqs] == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_overlong_shaping_penalises_responses_near_max_tokens(tmp_path):
    loop = _loop(tmp_path, "coordinator.overlong_buffer_tokens=2", 'trainer.loss="dr_grpo"')
    seqs = loop.advantages([_group(0, [1.0, 1.0], lengths=[2, 4])])
    # shaped rewards 1.0 and 0.0 -> centred 0.5 and -0.5
    assert [s.advantage for s in seqs] == pytest.approx([0.5, -0.5])
