import subprocess
import sys
import tomllib

import pytest

from services.common.config import ConfigError, RunConfig, dump_toml, load_config


def test_defaults_validate_and_round_trip_through_toml(tmp_path):
    cfg = load_config(
        None, ["run.num_steps=3", 'rollout.engine="hf"', "trainer.lr=1e-4", "coordinator.ignore_eos=false"]
    )
    assert (cfg.run.num_steps, cfg.rollout.engine, cfg.trainer.lr, cfg.coordinator.ignore_eos) == (3, "hf", 1e-4, False)
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(cfg))
    assert load_config(path) == cfg


def test_bare_string_override_is_accepted():
    assert load_config(None, ["rollout.engine=hf"]).rollout.engine == "hf"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.learning_rate=1", "trainer.learning_rate"),
        ("rollout.engine=sglang", "rollout.engine"),
        ("coordinator.num_samples=1", "coordinator.num_samples"),
        ("nosuchsection.x=1", "nosuchsection"),
        ("run.num_steps", "run.num_steps"),
    ],
)
def test_bad_key_or_value_is_one_clear_error_naming_it(override, named):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert named in str(e.value)


def test_cross_field_rule():
    with pytest.raises(ConfigError, match="prompts_path"):
        load_config(None, ["task.name=jsonl"])


def test_bad_config_fails_before_any_process_starts(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "deploy.local", "trainer.no_such_key=1", f'run.output_dir="{tmp_path}"'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "trainer.no_such_key" in out.stderr
    assert not any(tmp_path.iterdir())  # no run folder, so nothing was started


def test_shared_contracts_import_without_torch():
    code = (
        "import sys; import services.common.config, services.common.queue, services.common.tasks, "
        "services.common.tokenizer, services.common.grpcio, services.coordinator.loop, services.coordinator.status; "
        "import protos.grpo.v1.trainer_pb2_grpc; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_advantage_is_the_coordinators_and_follows_a_dr_grpo_loss_unless_set():
    assert load_config(None, []).coordinator.advantage == "grpo"
    assert load_config(None, ['trainer.loss="dr_grpo"']).coordinator.advantage == "dr_grpo"
    assert load_config(None, ['trainer.loss="dr_grpo"', 'coordinator.advantage="grpo"']).coordinator.advantage == "grpo"


def test_top_p_below_one_is_refused_naming_why():
    with pytest.raises(ConfigError, match="top_p < 1 is refused"):
        load_config(None, ["coordinator.top_p=0.9"])


def test_each_source_scores_with_its_own_reward_unless_told():
    assert load_config(None, []).task.reward_weights() == {"class_continuation": 1.0}
    rg = ['task.name="reasoning_gym"', 'task.generator="chain_sum"']
    assert load_config(None, rg).task.reward_weights() == {"reasoning_gym": 1.0}
    data = ['task.name="dataset"', 'task.prompts_path="x.jsonl"', "task.rewards={exact = 1.0, eos = 0.5}"]
    assert load_config(None, data).task.reward_weights() == {"exact": 1.0, "eos": 0.5}
    with pytest.raises(ConfigError, match="task.generator is required"):
        load_config(None, ['task.name="reasoning_gym"'])


def test_a_config_with_tables_and_escapes_survives_the_round_trip_through_toml():
    cfg = load_config(
        None,
        [
            'task.system_prompt="Think.\\nThen \\"answer\\"."',
            'task.generator_config={min_terms = 2, operators = ["+", "-"]}',
            'task.rewards={"my.mod:fn" = 0.5}',
        ],
    )
    assert RunConfig.model_validate(tomllib.loads(dump_toml(cfg))) == cfg
