"""`make down`: stop everything `make up` or `make run` started (from the records under `<output_dir>/.up/`), and
say what it stopped.

Of the config (`--config` and dotted overrides) only run.output_dir is read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from services.common.config import ConfigError, config_from_cli

from . import records
from .launchers import launcher


def main() -> int:
    try:
        output_dir = config_from_cli(__doc__)[0].run.output_dir
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = records.read_all(output_dir)
    if not found:
        print(f"nothing started by `make up` or `make run` is recorded under {Path(output_dir) / '.up'}")
    for path, record in found:
        print(f"stopping run {record['run_id']} ({record['kind']})", flush=True)
        stopped = launcher(record["kind"]).stop(record)  # read_all knows every kind (launchers.STOP_ORDER)
        for line in stopped or ["nothing of it was running"]:
            print(f"  stopped {line}" if stopped else f"  {line}", flush=True)
        records.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
