"""The trainer's lr schedule against transformers' schedulers (what TRL's lr_scheduler_type runs), and the config
that sets its length."""

import pytest
import torch
from transformers import get_scheduler

from services.common.config import ConfigError, load_config
from services.trainer.lr_schedule import TRANSFORMERS_NAMES, lr_factor


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_every_step_equals_the_transformers_scheduler(schedule, warmup):
    total, lr = 17, 2e-5
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    hf = get_scheduler(TRANSFORMERS_NAMES[schedule], optimizer, num_warmup_steps=warmup, num_training_steps=total)
    for step in range(total + 3):  # past the end: a decay stays at 0
        expected = optimizer.param_groups[0]["lr"]
        assert lr * lr_factor(step, schedule, warmup, total) == pytest.approx(expected, abs=1e-15)
        optimizer.step()
        hf.step()


def test_a_decay_without_a_length_is_refused():
    with pytest.raises(ValueError, match="trainer.lr_schedule_steps"):
        lr_factor(0, "cosine", 0, 0)


def test_the_schedule_spans_the_runs_optimizer_steps_unless_told():
    cfg = load_config(None, ["run.num_steps=40", "trainer.minibatches=2", 'trainer.lr_schedule="cosine"'])
    assert cfg.trainer.lr_schedule_steps == 80
    assert load_config(None, ["trainer.lr_schedule_steps=7"]).trainer.lr_schedule_steps == 7
    with pytest.raises(ConfigError, match="lr_warmup_steps must be <="):
        load_config(None, ["run.num_steps=5", "trainer.lr_warmup_steps=6"])
    with pytest.raises(ConfigError, match="megatron backend trains at a constant trainer.lr"):
        megatron = ['trainer.backend="megatron"', 'trainer.dtype="bfloat16"', "trainer.num_ranks=1"]
        load_config(None, [*megatron, 'trainer.lr_schedule="linear"'])
