"""Exact resume: 2 Train steps equal 1 step + Save + a new trainer process + Load + 1 step, bit for bit."""

import random
from pathlib import Path

import grpc
import pytest
import torch

from deploy.procs import Service, check_alive, stop_all
from protos.grpo.v1 import trainer_pb2, trainer_pb2_grpc
from services.common.grpcio import channel, wait_healthy
from services.common.ports import free_port

# Every piece of state is exercised: AdamW moments, a reference model (KL), a non-default loss, the lr schedule's
# clock (the resumed step runs at 2/3 of trainer.lr, as the uninterrupted one: a clock restarted at 0 runs at 1).
OVERRIDES = [
    "trainer.num_ranks=2",
    "trainer.lr=1e-3",
    'trainer.lr_schedule="linear"',
    "trainer.lr_schedule_steps=3",
    "trainer.weight_decay=0.01",
    "trainer.loss.kl_beta=0.1",
    'trainer.loss.name="dapo"',
    'trainer.loss.importance_sampling="token"',
    "trainer.max_tokens_per_microbatch=16",
]
EXACT_METRICS = ("loss", "grad_norm", "kl", "mismatch/mult_prob_error", "mismatch/is_weight_mean", "num_tokens")


def _seqs(vocab: int, seed: int) -> list[trainer_pb2.Sequence]:
    rng = random.Random(seed)
    shapes = [(6, 10, 1.0), (3, 5, -0.5), (4, 4, 0.25), (2, 6, -1.0)]
    return [
        trainer_pb2.Sequence(
            prompt_ids=[rng.randrange(vocab) for _ in range(p)],
            response_ids=[rng.randrange(vocab) for _ in range(r)],
            rollout_logprobs=[-rng.uniform(4.0, 4.6) for _ in range(r)],
            advantage=a,
        )
        for p, r, a in shapes
    ]


def _start(services, name: str, model_dir: Path, checkpoint_root: Path) -> tuple[Service, str]:
    port = free_port()
    overrides = [f"model.path={model_dir}", f"trainer.grpc_port={port}", f"trainer.checkpoint_root={checkpoint_root}"]
    overrides += OVERRIDES
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "services.trainer.main"]
    service = services.start(name, [*cmd, *overrides])
    address = f"127.0.0.1:{port}"
    for _ in range(60):
        check_alive([service])
        try:
            wait_healthy(address, 2)
            return service, address
        except (TimeoutError, grpc.RpcError):
            pass
    raise TimeoutError(f"{name} is not serving at {address}")


def _train(stub, step: int) -> dict[str, float]:
    reply = stub.Train(trainer_pb2.TrainRequest(step=step, sequences=_seqs(78, seed=step)), timeout=120)
    assert reply.policy_version == step + 1
    return dict(reply.metrics)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_resume_after_restart_is_bit_identical(services, tiny_model, tmp_path):
    first, address = _start(services, "trainer-a", tiny_model, tmp_path)
    with channel(address) as ch:
        stub = trainer_pb2_grpc.TrainerStub(ch)
        _train(stub, 0)
        stub.Save(trainer_pb2.SaveRequest(path=str(tmp_path / "ckpt")), timeout=60)
        uninterrupted = _train(stub, 1)
        stub.Save(trainer_pb2.SaveRequest(path=str(tmp_path / "a"), weights_only=True), timeout=60)
    stop_all([first])
    assert {"model.safetensors", "config.json", "train_state"} <= {f.name for f in (tmp_path / "ckpt").iterdir()}
    assert not (tmp_path / "a" / "train_state").exists()

    second, address = _start(services, "trainer-b", tiny_model, tmp_path)
    with channel(address) as ch:
        stub = trainer_pb2_grpc.TrainerStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Load(trainer_pb2.LoadRequest(path=str(tmp_path / "a")), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "weights_only" in err.value.details()
        assert stub.Load(trainer_pb2.LoadRequest(path=str(tmp_path / "ckpt")), timeout=60).policy_version == 1
        resumed = _train(stub, 1)
        stub.Save(trainer_pb2.SaveRequest(path=str(tmp_path / "b"), weights_only=True), timeout=60)
    for key in EXACT_METRICS:
        assert resumed[key] == uninterrupted[key], key
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    # And the resumed step did move the weights away from the checkpoint's.
    assert not all(torch.equal(a[k], v) for k, v in _weights(tmp_path / "ckpt").items())
