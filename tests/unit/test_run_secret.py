"""The launcher's run secret (deploy/placement/types.py write_configs): written once and kept on resume; none with
run.locked = false, which a run started locked refuses."""

from __future__ import annotations

import pytest

from deploy.placement import Cluster, place
from services.common import auth
from services.common.config import ConfigError, load_config


def _placement(tmp_path, *overrides: str):
    cfg = load_config(None, [f'run.output_dir="{tmp_path}"', 'run.run_id="r"', "model.create=true", *overrides])
    return place(cfg, Cluster("local", ("localhost",), 0))


def test_a_locked_run_keeps_its_secret_across_resumes(tmp_path):
    run_dir = tmp_path / "r"
    _placement(tmp_path).write_configs(run_dir)
    secret = auth.run_secret(run_dir)
    assert secret and (run_dir / "run.secret").stat().st_mode & 0o777 == 0o600
    _placement(tmp_path).write_configs(run_dir)
    assert auth.run_secret(run_dir) == secret


def test_an_unlocked_run_has_no_secret_and_a_locked_one_cannot_be_unlocked(tmp_path, capsys):
    open_dir, locked_dir = tmp_path / "r", tmp_path / "locked" / "r"
    _placement(tmp_path, "run.locked=false").write_configs(open_dir)
    assert auth.run_secret(open_dir) is None and "anyone on this host" in capsys.readouterr().err
    _placement(tmp_path / "locked").write_configs(locked_dir)
    with pytest.raises(ConfigError, match="started locked"):
        _placement(tmp_path / "locked", "run.locked=false").write_configs(locked_dir)
    assert auth.run_secret(locked_dir)
