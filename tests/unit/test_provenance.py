"""bench/provenance.py: every result file says the command, the machine and the commit that made it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from provenance import commit, stamp, write_result  # noqa: E402


def test_a_result_names_its_command_machine_and_commit(tmp_path):
    s = stamp(["/anywhere/bench/vs_trl.py", "--args", "trainer.lr=3e-5 run.seed=1"])
    assert s["command"] == "python bench/vs_trl.py --args 'trainer.lr=3e-5 run.seed=1'"  # pasteable as it ran
    assert re.fullmatch(r".+, \d+ cores, Python 3\.\d+\.\d+, .+", s["machine"])
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", commit())  # this checkout's HEAD
    out = write_result(tmp_path / "script" / "r.json", {"figure": 1.5, "command": "make run CONFIG=x"})
    written = json.loads(out.read_text())
    # The result's own command (e.g. the `make run` a summary describes) wins over the stamp's.
    assert written["figure"] == 1.5 and written["command"] == "make run CONFIG=x" and written["commit"] == commit()
