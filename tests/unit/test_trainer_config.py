"""The trainer's loss / memory options: defaults keep the original behaviour, bad values name the key,
and the engine imports without pydantic or the protos (the GPU bench image has neither)."""

import subprocess
import sys

import pytest

from services.common.config import ConfigError, TrainerSection, load_config


def test_defaults_are_the_original_trainer():
    cfg = TrainerSection()
    loss = cfg.loss
    assert (loss.name, loss.kl_estimator, loss.importance_sampling, loss.entropy_coef) == ("grpo", "k3", "off", 0.0)
    fsdp2 = cfg.fsdp2
    memory = (cfg.dtype, cfg.memory.activation_checkpointing, fsdp2.cpu_offload, fsdp2.ref_cpu_offload)
    assert (*memory, fsdp2.attn_implementation) == ("float32", "off", False, False, "sdpa_varlen")


@pytest.mark.parametrize(
    "override, key",
    [
        ('trainer.loss="ppo"', "trainer.loss.name"),
        ('trainer.loss.name="ppo"', "trainer.loss.name"),
        ("trainer.loss.clip_eps_low=1.5", "trainer.loss.clip_eps_low"),
        ('trainer.loss.kl_estimator="k2"', "trainer.loss.kl_estimator"),
        ('trainer.loss.importance_sampling="icepop"', "trainer.loss.importance_sampling"),
        ("trainer.loss.is_truncation=0", "trainer.loss.is_truncation"),
        ('trainer.memory.activation_checkpointing="full"', "trainer.memory.activation_checkpointing"),
        ('trainer.fsdp2.attn_implementation="flash"', "trainer.fsdp2.attn_implementation"),
        ("trainer.megatron.tensor_parallel=0", "trainer.megatron.tensor_parallel"),
        ('trainer.dtype="float16"', "trainer.dtype"),
        ("trainer.minibatches=0", "trainer.minibatches"),
        ("trainer.minibatches=129", "trainer.minibatches"),  # more steps than 16 prompts x 8 samples
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])


def test_engine_imports_without_pydantic_grpc_or_protos():
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pydantic', 'grpc', 'protos', 'redis'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import services.trainer.fsdp2.build, services.trainer.engine\n"
    )
    subprocess.run([sys.executable, "-c", blocker], check=True, timeout=120)
