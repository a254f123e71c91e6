"""One placement for `make run` and every `make up` backend: disaggregated over NCCL (a GPU per trainer rank and
per rollout worker), or colocated with CUDA IPC (rollout workers on trainer rank 0's GPU, the one that publishes).

`make run` and `make up BACKEND=local` launch the same services on the same GPUs and ports, and
`make up DRY_RUN=1 BACKEND=local` prints exactly that placement; GPU counts are faked through the Cluster."""

from __future__ import annotations

import sys

import pytest

from deploy import local, up
from deploy.placement import Cluster, PlacementError, format_placement, place
from deploy.placement.commands import service_env
from deploy.slurm.commands import srun
from services.common.config import load_config
from services.common.ports import free_port, free_range

# Ports free on this machine now (check_ports refuses a local plan whose port is taken): fixed numbers made the
# suite fail whenever anything else on the machine happened to hold one of them.
PORTS = [
    "run.run_id=t",
    "model.create=true",
    f"coordinator.grpc_port={free_port()}",
    f"coordinator.http_port={free_port()}",
    f"trainer.grpc_port={free_port()}",
    f"weightsync.grpc_port={free_port()}",
    f"weightsync.store_port={free_port()}",
    f"redis.port={free_port()}",
    f"rollout.grpc_port={free_range(4)}",
]
IPC = 'weightsync.transport="cuda_ipc"'


def _place(gpus: int, *overrides: str, backend: str = "local", nodes: tuple[str, ...] = ("box",)):
    return place(load_config(None, [*PORTS, *overrides]), Cluster(backend, nodes, gpus))


def _visible(placement) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES each local service process gets (absent: CUDA's view left as it is)."""
    envs = {a.service: service_env(a, {}) for a in placement.services}
    return {name: env["CUDA_VISIBLE_DEVICES"] for name, env in envs.items() if "CUDA_VISIBLE_DEVICES" in env}


def test_disaggregated_gives_every_rank_and_worker_its_own_gpu():
    placement = _place(4, "trainer.num_ranks=2", "rollout.num_workers=2")
    assert _visible(placement) == {"trainer": "0,1", "rollout-0": "2", "rollout-1": "3"}
    with pytest.raises(PlacementError, match="node box needs 4 GPUs .2 trainer ranks . 2 rollout workers. but"):
        _place(3, "trainer.num_ranks=2", "rollout.num_workers=2")


def test_cuda_ipc_puts_the_rollout_workers_on_the_publishers_gpu():
    placement = _place(1, "trainer.num_ranks=1", "rollout.num_workers=2", IPC)
    assert _visible(placement) == {"trainer": "0", "rollout-0": "0", "rollout-1": "0"}
    assert "rollout-1    box                      127.0.0.1            0 " in format_placement(placement)
    with pytest.raises(PlacementError, match="node box needs 2 GPUs .2 trainer ranks; the rollout workers share"):
        _place(1, "trainer.num_ranks=2", IPC)


def test_no_gpu_hides_the_gpus_from_every_service():
    assert set(_visible(_place(0)).values()) == {""}


def test_gpu_indices_are_positions_in_what_the_launcher_sees():
    trainer = _place(2, "trainer.num_ranks=1").get("trainer")
    assert service_env(trainer, {"CUDA_VISIBLE_DEVICES": "6,7"})["CUDA_VISIBLE_DEVICES"] == "6"


def test_threads_per_service_as_configured():
    placement = _place(0, "trainer.num_threads=3", "rollout.num_threads=2", "rollout.num_workers=2")
    assert {a.service: a.threads for a in placement.services} == {
        "weightsync": 1,
        "trainer": 3,
        "rollout-0": 2,
        "rollout-1": 2,
        "coordinator": 1,
    }


def test_colocated_on_slurm_puts_the_workers_on_trainer_rank_0s_node(tmp_path):
    placement = _place(2, "trainer.num_ranks=4", "rollout.num_workers=2", IPC, backend="slurm", nodes=("n0", "n1"))
    assert placement.get("trainer").nodes == ("n0", "n1") and placement.get("trainer").gpus == (0, 1)
    assert [placement.get(f"rollout-{i}").nodes for i in range(2)] == [("n0",), ("n0",)]
    assert "--gpus=0" in srun(placement, placement.get("rollout-1"), tmp_path / "c.toml", python="py")
    with pytest.raises(PlacementError, match="cuda_ipc.*set it to \\['n0'\\]"):
        _place(2, "trainer.num_ranks=2", IPC, "placement.rollout_nodes=[1]", backend="slurm", nodes=("n0", "n1"))


# What `make run` accepts (or refuses, and why) on a machine with that many GPUs: CPU default, GPU counts 0/1/2/4,
# colocated cuda_ipc, several rollout workers, several trainer ranks, Megatron tensor parallelism.
MEGATRON_TP2 = ["trainer.backend=megatron", "trainer.dtype=bfloat16", "trainer.megatron.tensor_parallel=2"]
CASES = {
    "cpu-default": (0, [], None),
    "cpu-ranks-and-workers": (0, ["trainer.num_ranks=4", "rollout.num_workers=3", "rollout.num_threads=2"], None),
    "cpu-asks-cuda": (0, ["placement.device=cuda"], "the local allocation has no GPUs"),
    "1-gpu-disaggregated": (1, [], "node box needs 3 GPUs"),
    "1-gpu-colocated": (1, ["trainer.num_ranks=1", "rollout.num_workers=2", IPC], None),
    "2-gpu-disaggregated": (2, ["trainer.num_ranks=1"], None),
    "2-gpu-colocated-2-ranks": (2, ["trainer.num_ranks=2", IPC], None),
    "4-gpu-2-ranks-2-workers": (4, ["trainer.num_ranks=2", "rollout.num_workers=2"], None),
    "4-gpu-megatron-tp2": (4, [*MEGATRON_TP2, "rollout.num_workers=2"], None),
    "4-gpu-colocated-4-ranks-3-workers": (4, ["trainer.num_ranks=4", "rollout.num_workers=3", IPC], None),
    "4-gpu-forced-cpu": (4, ["placement.device=cpu", "trainer.num_ranks=4"], None),
}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """Run a launcher's main() on a faked machine: what it would launch is captured, nothing starts."""
    launched = []
    monkeypatch.setattr("deploy.preflight.preflight", lambda cfg: None)
    monkeypatch.setattr("deploy.supervise.stop_on_sigterm", lambda: None)
    monkeypatch.setattr(local, "run_local", lambda placement, run_dir: launched.append(placement) or 0)

    def run(main, gpus: int, argv: list[str]) -> tuple[int, list]:
        launched.clear()
        monkeypatch.setattr(local, "this_machine", lambda: Cluster("local", ("box",), gpus))
        monkeypatch.setattr(sys, "argv", ["prog", *argv, f"run.output_dir={tmp_path}"])
        return main(), list(launched)

    return run


@pytest.mark.parametrize("gpus, overrides, refusal", CASES.values(), ids=CASES.keys())
def test_make_run_and_make_up_local_place_every_config_alike(machine, capsys, tmp_path, gpus, overrides, refusal):
    args = [*PORTS, *overrides]
    run_rc, by_run = machine(local.main, gpus, args)
    run_err = capsys.readouterr().err
    up_rc, by_up = machine(up.main, gpus, ["--backend", "local", *args])
    up_err = capsys.readouterr().err
    dry_rc, _ = machine(up.main, gpus, ["--backend", "local", "--dry-run", *args])
    dry = capsys.readouterr()
    if refusal:
        # Refused by both, with the same one line, before anything is placed.
        assert run_rc == up_rc == dry_rc == 2 and not by_run and not by_up
        assert run_err.splitlines() == up_err.splitlines() == dry.err.splitlines()
        assert run_err.startswith("error: ") and refusal in run_err and "plan of run" not in dry.out
        return
    assert run_rc == up_rc == dry_rc == 0, run_err + up_err + dry.err
    assert len(by_run) == 1 and by_up == by_run
    assert format_placement(by_run[0]) in dry.out
    # The GPUs column is what each launched process sees.
    rows = {row[0]: row[3] for row in (line.split() for line in dry.out.splitlines() if line.startswith("  "))}
    for name, _, env in local.launches(by_run[0], tmp_path / "config.toml"):
        assert rows[name] == (env.get("CUDA_VISIBLE_DEVICES") or "-"), name
