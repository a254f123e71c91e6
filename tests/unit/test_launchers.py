"""The launcher registry (deploy/launchers.py): every backend keeps the one contract, detection falls through to this
machine, and `make down` stops each record through the launcher of its kind, leaving what is not a record alone."""

from __future__ import annotations

import inspect
import json
import sys

import pytest

from deploy import down, records, up
from deploy.launchers import LAUNCHERS, STOP_ORDER, detect, launcher


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_launcher_keeps_the_contract(name):
    module = launcher(name)
    for function, arity in (("detect", 0), ("up", 3), ("stop", 1)):
        params = [p for p in inspect.signature(getattr(module, function)).parameters.values() if p.default is p.empty]
        assert len(params) == arity, (name, function, params)
    assert name in STOP_ORDER  # make down knows the order to stop it in


def test_an_unknown_launcher_is_named_in_the_error():
    with pytest.raises(ValueError, match="no launcher 'ray'; there are slurm, sbatch, docker, local"):
        launcher("ray")


def test_detection_takes_the_first_that_answers_and_falls_back_to_this_machine(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(launcher("sbatch"), "detect", lambda: False)
    monkeypatch.setattr(launcher("docker"), "detect", lambda: False)
    assert detect() == "local"
    monkeypatch.setattr(launcher("docker"), "detect", lambda: True)
    assert detect() == "docker"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert detect() == "slurm"


def test_make_down_stops_each_record_through_its_kind_and_leaves_foreign_files(tmp_path, monkeypatch, capsys):
    stopped = []
    for name in LAUNCHERS:
        monkeypatch.setattr(launcher(name), "stop", lambda record, name=name: stopped.append(name) or [name])
    for kind in ("sbatch", "local", "docker", "slurm"):
        records.write(tmp_path, kind, f"run-{kind}")
    (tmp_path / ".up" / "planted.json").write_text(json.dumps({"kind": "ray", "run_id": "x"}))
    (tmp_path / ".up" / "broken.json").write_text("{not json")
    monkeypatch.setattr(sys, "argv", ["down", f"run.output_dir={tmp_path}"])
    assert down.main() == 0
    assert stopped == list(STOP_ORDER)  # launchers before the batch job that holds one
    assert sorted(p.name for p in (tmp_path / ".up").iterdir()) == ["broken.json", "planted.json"]
    err = capsys.readouterr().err
    assert "planted.json: not a record of `make up` (kind 'ray' is none of" in err and "broken.json" in err


def test_up_and_down_name_no_backend():
    """A new launcher is its folder and its line in deploy/launchers.py: up.py and down.py need no edit."""
    for module in (up, down):
        assert not [name for name in LAUNCHERS if f'"{name}"' in inspect.getsource(module)], module.__name__
