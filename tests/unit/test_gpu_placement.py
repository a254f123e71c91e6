"""GPU placement of `make run`: disaggregated over NCCL (a GPU per trainer rank and per rollout worker), or
colocated with CUDA IPC (rollout workers on trainer rank 0's GPU, the one that publishes)."""

import pytest

from deploy.placement import gpu_env
from services.common.config import load_config


def test_disaggregated_gives_every_rank_and_worker_its_own_gpu():
    cfg = load_config(None, ["trainer.num_ranks=2", "rollout.num_workers=2"])
    assert gpu_env(cfg, 4) == {
        "trainer": {"CUDA_VISIBLE_DEVICES": "0,1"},
        "rollout-0": {"CUDA_VISIBLE_DEVICES": "2"},
        "rollout-1": {"CUDA_VISIBLE_DEVICES": "3"},
    }
    with pytest.raises(ValueError, match="4 GPUs asked, 3 present"):
        gpu_env(cfg, 3)


def test_cuda_ipc_puts_the_rollout_workers_on_the_publishers_gpu():
    cfg = load_config(None, ["trainer.num_ranks=1", "rollout.num_workers=2", 'weightsync.transport="cuda_ipc"'])
    assert gpu_env(cfg, 1) == {
        "trainer": {"CUDA_VISIBLE_DEVICES": "0"},
        "rollout-0": {"CUDA_VISIBLE_DEVICES": "0"},
        "rollout-1": {"CUDA_VISIBLE_DEVICES": "0"},
    }
    with pytest.raises(ValueError, match="2.*GPUs asked, 1 present"):
        gpu_env(load_config(None, ["trainer.num_ranks=2", 'weightsync.transport="cuda_ipc"']), 1)


def test_no_gpu_no_placement():
    assert gpu_env(load_config(None, []), 0) == {}
