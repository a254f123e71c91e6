import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.common.config import ConfigError, RunConfig, dump_toml, load_config

REPO = Path(__file__).resolve().parents[2]


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


def test_the_episode_rewards_need_an_episode_to_score():
    with pytest.raises(ConfigError, match="tool_use scores tool calls: it needs task.episode.tools"):
        load_config(None, ["task.rewards={exact = 1.0, tool_use = 0.5}"])
    with pytest.raises(ConfigError, match="env is the environment's reward"):
        load_config(None, ["task.rewards={env = 1.0}"])
    calculator = load_config(REPO / "deploy" / "configs" / "smollm2_calculator.toml", [])
    assert calculator.task.reward_weights() == {"reasoning_gym": 1.0, "tool_use": 0.5}


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


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("trainer.clip_eps=0.1", "trainer.loss.clip_eps"),
        ("trainer.kl_beta=0.1", "trainer.loss.kl_beta"),
        ("trainer.activation_checkpointing=layer", "trainer.memory.activation_checkpointing"),
        ("trainer.cpu_offload=true", "trainer.fsdp2.cpu_offload"),
        ("trainer.attn_implementation=sdpa_varlen", "trainer.fsdp2.attn_implementation"),
        ("trainer.tensor_parallel=2", "trainer.megatron.tensor_parallel"),
    ],
)
def test_a_flat_trainer_key_of_before_the_nesting_fails_naming_its_new_key(old, new):
    key = old.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} moved to {new}"):
        load_config(None, [old])


def test_a_flat_trainer_key_in_a_toml_fails_naming_its_new_key(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('[trainer]\nloss = "dapo"\nkl_beta = 0.1\n')
    with pytest.raises(ConfigError, match=r"trainer.kl_beta moved to trainer.loss.kl_beta"):
        load_config(path)


def test_trainer_loss_as_a_string_is_the_loss_name_with_or_without_a_loss_table(tmp_path):
    assert load_config(None, ["trainer.loss=dapo"]).trainer.loss.name == "dapo"
    flat = tmp_path / "flat.toml"
    flat.write_text('[trainer]\nloss = "gspo"\n')
    assert load_config(flat).trainer.loss.name == "gspo"
    assert load_config(flat, ["trainer.loss=dapo"]).trainer.loss.name == "dapo"
    # A subkey over the shorthand keeps the shorthand's name.
    loss = load_config(flat, ["trainer.loss.clip_eps_high=0.3"]).trainer.loss
    assert (loss.name, loss.clip_eps_high) == ("gspo", 0.3)
    table = tmp_path / "table.toml"
    table.write_text('[trainer.loss]\nname = "gspo"\nkl_beta = 0.05\n')
    loss = load_config(table, ['trainer.loss="dapo"']).trainer.loss
    assert (loss.name, loss.kl_beta) == ("dapo", 0.05)  # the table's other keys are kept


def test_an_option_of_the_other_backend_fails_naming_it():
    megatron = ["trainer.backend=megatron", "trainer.dtype=bfloat16"]
    assert load_config(None, [*megatron, "trainer.megatron.tensor_parallel=2"]).trainer.megatron.tensor_parallel == 2
    for option in ("trainer.fsdp2.cpu_offload=true", "trainer.fsdp2.attn_implementation=sdpa"):
        with pytest.raises(ConfigError, match=rf"{option.split('=')[0]} is an FSDP2 option"):
            load_config(None, [*megatron, option])
    with pytest.raises(ConfigError, match=r"trainer.megatron.pipeline_parallel is a Megatron option"):
        load_config(None, ["trainer.megatron.pipeline_parallel=2"])
    # Their defaults, written out, are no option set: a dumped fsdp2 config names every one of them.
    assert load_config(None, [*megatron, "trainer.fsdp2.cpu_offload=false"]).trainer.backend == "megatron"


def test_nested_trainer_sections_round_trip_through_toml_as_their_own_tables(tmp_path):
    cfg = load_config(
        None,
        [
            "trainer.loss=dapo",
            "trainer.loss.kl_beta=0.05",
            "trainer.memory.logprob_chunk_tokens=512",
            "trainer.fsdp2.attn_implementation=sdpa_varlen",
            "trainer.lr=1e-5",
        ],
    )
    text = dump_toml(cfg)
    for table in ("[trainer]", "[trainer.loss]", "[trainer.memory]", "[trainer.fsdp2]", "[trainer.megatron]"):
        assert f"\n{table}\n" in f"\n{text}"
    assert tomllib.loads(text)["trainer"]["loss"]["name"] == "dapo"
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert load_config(path) == cfg
    parallel = ["trainer.num_ranks=4", "trainer.megatron.tensor_parallel=2", "trainer.megatron.pipeline_parallel=2"]
    megatron = load_config(None, ["trainer.backend=megatron", "trainer.dtype=bfloat16", *parallel])
    path.write_text(dump_toml(megatron))
    assert load_config(path) == megatron


def test_refit_buckets_follow_the_transport_device_unless_set():
    ws = load_config(None, []).weightsync
    assert ws.bucket_bytes == 0
    assert (ws.bucket_bytes_for("cpu"), ws.bucket_bytes_for("cuda")) == (32 * 2**20, 256 * 2**20)
    assert load_config(None, ["weightsync.bucket_bytes=4096"]).weightsync.bucket_bytes_for("cuda") == 4096
    with pytest.raises(ConfigError, match="weightsync.bucket_bytes"):
        load_config(None, ["weightsync.bucket_bytes=512"])


def test_resume_reads_the_run_folders_config_with_the_overrides_on_top(tmp_path):
    run = tmp_path / "runs" / "r7"
    run.mkdir(parents=True)
    (run / "asked.toml").write_text(dump_toml(load_config(None, ["run.num_steps=9", "trainer.lr=0.5"])))
    cfg = load_config(None, [f'run.resume="{run}"', "run.num_steps=12"])
    assert (cfg.run.num_steps, cfg.trainer.lr, cfg.run.run_id) == (12, 0.5, "r7")
    assert cfg.run.output_dir == str(run.parent.resolve())
    with pytest.raises(ConfigError, match="is not a run folder with a readable config.toml"):
        load_config(None, [f'run.resume="{tmp_path / "nothing"}"'])
