"""The trainer's loss / memory options: defaults keep the original behaviour, bad values name the key,
and the engine imports without pydantic or the protos (the GPU bench image has neither)."""

import subprocess
import sys

import pytest

from services.common.config import ConfigError, TrainerSection, load_config


def test_defaults_are_the_original_trainer():
    cfg = TrainerSection()
    assert (cfg.loss, cfg.kl_estimator, cfg.importance_sampling, cfg.entropy_coef) == ("grpo", "k3", "off", 0.0)
    memory = (cfg.dtype, cfg.activation_checkpointing, cfg.cpu_offload, cfg.ref_cpu_offload, cfg.attn_implementation)
    assert memory == ("float32", "off", False, False, "sdpa")


@pytest.mark.parametrize(
    "override, key",
    [
        ('trainer.loss="ppo"', "trainer.loss"),
        ("trainer.clip_eps_low=1.5", "trainer.clip_eps_low"),
        ('trainer.kl_estimator="k2"', "trainer.kl_estimator"),
        ('trainer.importance_sampling="icepop"', "trainer.importance_sampling"),
        ("trainer.is_truncation=0", "trainer.is_truncation"),
        ('trainer.activation_checkpointing="full"', "trainer.activation_checkpointing"),
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
        "import services.trainer.build, services.trainer.engine\n"
    )
    subprocess.run([sys.executable, "-c", blocker], check=True, timeout=120)
