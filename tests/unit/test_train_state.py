"""The training state a resumable checkpoint holds: written by several threads of one rank, read back exactly."""

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from services.common.config import ModelSection
from services.common.tinymodel import create_tiny_model
from services.trainer import checkpoint


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _step(model, optimizer, seed):
    torch.manual_seed(seed)
    model(torch.randint(0, 50, (2, 6))).logits.float().square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_state_written_by_several_threads_loads_back_bit_for_bit(tmp_path, group):
    path = create_tiny_model(ModelSection(path=str(tmp_path / "tiny")), seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, optimizer, 0)
    folder = tmp_path / "state"
    checkpoint.save_train_state(folder, model, optimizer, policy_version=7, rank=0, threads=3)
    assert len(list(folder.glob("*.distcp"))) == 3  # one file a thread: the writer's threads took their share
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]

    _step(model, optimizer, 1)  # the state moves on after the save
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert checkpoint.load_train_state(folder, model, optimizer, rank=0) == 7
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(m, optimizer.state[p]["exp_avg"]) for m, p in zip(saved_moments, model.parameters()))


def test_writer_threads_take_a_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(checkpoint.os, "sched_getaffinity", lambda _: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert checkpoint.writer_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert checkpoint.writer_threads() == 8  # at most 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert checkpoint.writer_threads() == 2  # at least 2: one serializes while another writes
