"""`make up` on Docker resumes a run after a stateful container died, as `make run` does (deploy/resuming.py): the next
start of the compose project reads a config with run.resume set, in the containers' paths."""

from __future__ import annotations

import dataclasses
import json
import tomllib

from deploy.docker.launch import container_config
from deploy.placement import Cluster, place
from deploy.procs import ServiceDied
from deploy.resuming import run_resuming
from services.common.config import load_config
from services.coordinator.run_record import RUN_STATE, CoordinatorState


def test_a_dead_container_restarts_the_project_on_the_newest_checkpoint_in_the_containers_paths(tmp_path, capsys):
    cfg = load_config(None, ["run.run_id=dock", f"run.output_dir={tmp_path}", "model.create=true", "run.locked=false"])
    placement = place(cfg, Cluster("docker", ("localhost",), 0))
    run_dir = tmp_path / "dock"
    placement.write_configs(run_dir, container_config(placement))
    checkpoint = run_dir / "resume" / "step_2"
    checkpoint.mkdir(parents=True)
    state = CoordinatorState(step=2, policy_version=2, data_cursor=4, train_s=1.0, wall_s=2.0)
    (checkpoint / RUN_STATE).write_text(json.dumps(dataclasses.asdict(state)))

    seen = []

    def run_once(p) -> int:
        seen.append(tomllib.loads((run_dir / "config.toml").read_text())["run"])
        if len(seen) == 1:
            raise ServiceDied("trainer", "container(s) exited: trainer")
        return 0

    assert run_resuming(placement, run_dir, run_once, "make up", container_config) == 0
    first, second = seen
    assert first["resume"] == "" and first["output_dir"] == "/runs"
    # What the coordinator container reads: its own run folder, as mounted, so it continues from step 2.
    assert second["resume"] == "/runs/dock" and second["output_dir"] == "/runs" and second["run_id"] == "dock"
    assert "trainer died: resuming the run from step 2" in capsys.readouterr().err
