"""bench/trl_pairing.py without TRL: what it refuses to pair, how our losses map onto TRL's, and that the README shows
every difference it allows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.common.config import load_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from trl_pairing import KNOWN_DIFFERENCES, SETTINGS, TO_TRL, trl_kwargs  # noqa: E402

ARITHMETIC = REPO / "deploy/configs/vs_trl_arithmetic.toml"


def test_each_trl_field_and_each_setting_is_mapped_once():
    fields = [field for _, field, _ in TO_TRL]
    assert len(fields) == len(set(fields))
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    assert set(KNOWN_DIFFERENCES) <= set(names)


def test_dapo_keeps_its_clip_higher_and_our_grpo_is_trls_token_mean():
    dapo = trl_kwargs(load_config(ARITHMETIC))
    assert (dapo["loss_type"], dapo["epsilon"], dapo["epsilon_high"]) == ("dapo", 0.2, 0.28)
    # Our grpo is a token mean over the batch with a symmetric clip: TRL's "grpo" would average per sequence.
    grpo = trl_kwargs(load_config(ARITHMETIC, ["trainer.loss.name=grpo", "trainer.loss.clip_eps=0.1"]))
    assert (grpo["loss_type"], grpo["epsilon"], grpo["epsilon_high"]) == ("dapo", 0.1, 0.1)
    gspo = trl_kwargs(load_config(ARITHMETIC, ["trainer.loss.name=gspo"]))
    assert (gspo["loss_type"], gspo["importance_sampling_level"]) == ("grpo", "sequence")


@pytest.mark.parametrize(
    "override",
    [
        "coordinator.dynamic_sampling=true",
        "coordinator.overlong_buffer_tokens=4",
        "coordinator.ignore_eos=true",
        'trainer.loss.importance_sampling="token"',
        "trainer.weight_decay=0.1",
        "run.num_steps=10",  # the lr schedule then spans 10 optimizer steps on our side, 100000 on TRL's
    ],
)
def test_a_setting_trl_cannot_run_the_same_way_is_refused(override):
    key = override.split("=")[0]
    overrides = [override] + (["trainer.lr_schedule_steps=100000"] if key == "run.num_steps" else [])
    with pytest.raises(ValueError, match="lr schedule" if key == "run.num_steps" else key):
        trl_kwargs(load_config(ARITHMETIC, overrides))


def test_bench_readme_shows_every_allowed_difference():
    readme = (REPO / "bench" / "README.md").read_text()
    assert [name for name in KNOWN_DIFFERENCES if f"| {name} |" not in readme] == []
