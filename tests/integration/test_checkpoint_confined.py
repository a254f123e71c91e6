"""Trainer.Save and Load on a real trainer (torchrun, 2 gloo ranks, a run secret): paths confined to the run's
folder, and a checkpoint proven the run's before torch reads a byte of it, so a planted DCP .metadata (a pickle)
never runs."""

import json
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch

from deploy.procs import check_alive
from protos.grpo.v1 import trainer_pb2, trainer_pb2_grpc
from services.common import auth
from services.common.grpcio import channel, wait_healthy
from services.common.ports import free_port
from services.trainer.manifest import MANIFEST, write_manifest

SECRET, OTHER = "ab" * 32, "cd" * 32


class _Plant:
    """Unpickled, it creates the marker file: what an attacker's .metadata would do with os.system."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _start(services, tiny_model: Path, run_dir: Path) -> str:
    port = free_port()
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "services.trainer.main"]
    overrides = [f"model.path={tiny_model}", f"trainer.grpc_port={port}", "trainer.num_ranks=2", "trainer.lr=1e-3"]
    overrides += [f'run.output_dir="{run_dir.parent}"', f'run.run_id="{run_dir.name}"']
    service = services.start("trainer", [*cmd, *overrides], env={auth.ENV: SECRET})
    address = f"127.0.0.1:{port}"
    for _ in range(60):
        check_alive([service])
        try:
            wait_healthy(address, 2)
            return address
        except (TimeoutError, grpc.RpcError):
            pass
    raise TimeoutError(f"the trainer is not serving at {address}")


def _train(stub, step: int) -> None:
    rng = random.Random(step)
    seqs = [
        trainer_pb2.Sequence(
            prompt_ids=[rng.randrange(78) for _ in range(4)],
            response_ids=[rng.randrange(78) for _ in range(6)],
            rollout_logprobs=[-4.3] * 6,
            advantage=a,
        )
        for a in (1.0, -1.0)
    ]
    assert stub.Train(trainer_pb2.TrainRequest(step=step, sequences=seqs), timeout=120).policy_version == step + 1


def _refused(call, request, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert all(w in err.value.details() for w in words), err.value.details()


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _planted(good: Path, folder: Path, marker: Path) -> Path:
    """A copy of a real checkpoint whose .metadata is a pickle that creates marker when read."""
    shutil.copytree(good, folder)
    (folder / "train_state" / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    return folder


def _dcp_reads(folder: Path) -> None:
    """What torch's reader does with a checkpoint's .metadata, in a process of its own: proof the plant bites."""
    code = "import sys; from torch.distributed.checkpoint import FileSystemReader; FileSystemReader(sys.argv[1])"
    code += ".read_metadata()"
    subprocess.run([sys.executable, "-c", code, str(folder / "train_state")], capture_output=True, timeout=120)


def test_save_and_load_stay_in_the_run_folder_and_load_only_what_the_run_signed(services, tiny_model, tmp_path):
    tmp_path = tmp_path.resolve()  # the trainer names its root resolved
    run_dir, elsewhere, marker = tmp_path / "runs" / "r1", tmp_path / "elsewhere", tmp_path / "planted-code-ran"
    run_dir.mkdir(parents=True)
    elsewhere.mkdir()
    (run_dir / "link").symlink_to(elsewhere)
    with channel(_start(services, tiny_model, run_dir), secret=SECRET) as ch:
        stub = trainer_pb2_grpc.TrainerStub(ch)
        _train(stub, 0)

        # Nowhere outside the run folder, by any route; nothing written there.
        for path in (elsewhere / "ckpt", run_dir / ".." / ".." / "elsewhere" / "ckpt", run_dir / "link" / "ckpt"):
            _refused(stub.Save, trainer_pb2.SaveRequest(path=str(path)), str(path), f"outside {run_dir}")
        assert not any(elsewhere.iterdir())

        good = run_dir / "resume" / "step_1"
        stub.Save(trainer_pb2.SaveRequest(path=str(good)), timeout=60)
        assert json.loads((good / MANIFEST).read_text())["signature"]
        shutil.copytree(good, elsewhere / "copy")
        _refused(stub.Load, trainer_pb2.LoadRequest(path=str(elsewhere / "copy")), f"outside {run_dir}")

        # Planted code inside the run folder: refused unsigned, or signed with another secret, and never run.
        _dcp_reads(_planted(good, tmp_path / "probe", marker))
        assert marker.exists(), "the planted .metadata did not run code when torch read it: this test proves nothing"
        marker.unlink()
        bare = _planted(good, run_dir / "planted", marker)
        (bare / MANIFEST).unlink()
        _refused(stub.Load, trainer_pb2.LoadRequest(path=str(bare)), "has no manifest.json", "not written by this run")
        forged = _planted(good, run_dir / "forged", marker)
        ours = auth.current()
        auth.set_secret(OTHER)
        try:
            write_manifest(forged)  # every hash right, the signature another run's
        finally:
            auth.set_secret(ours)
        _refused(stub.Load, trainer_pb2.LoadRequest(path=str(forged)), "signature", "not written by this run")
        assert not marker.exists()

        altered = run_dir / "altered"
        shutil.copytree(good, altered)
        shard = sorted((altered / "train_state").glob("*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        _refused(stub.Load, trainer_pb2.LoadRequest(path=str(altered)), f"sha256 of train_state/{shard.name}")

        # The trainer still serves: a Load restores the saved weights, and a new Save / Load round trip works.
        _train(stub, 1)
        assert stub.Load(trainer_pb2.LoadRequest(path=str(good)), timeout=60).policy_version == 1
        stub.Save(trainer_pb2.SaveRequest(path=str(run_dir / "restored"), weights_only=True), timeout=60)
        saved, restored = _weights(good), _weights(run_dir / "restored")
        assert set(saved) == set(restored) and all(torch.equal(saved[k], restored[k]) for k in saved)
        _train(stub, 1)
        stub.Save(trainer_pb2.SaveRequest(path=str(run_dir / "resume" / "step_2")), timeout=60)
        assert (
            stub.Load(trainer_pb2.LoadRequest(path=str(run_dir / "resume" / "step_2")), timeout=60).policy_version == 2
        )
    assert not marker.exists()
