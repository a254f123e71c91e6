"""The rollout container: `rollout.num_workers` worker processes, one GPU each where the container has GPUs."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    from services.common.config import load_config

    cfg = load_config(args.config)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    procs = []
    for i in range(cfg.rollout.num_workers):
        # compose reserves the plan's GPUs for this container; inside it they are numbered from 0.
        gpu = str(i) if os.environ.get("GRPO_DEVICE") == "cuda" else ""
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        cmd = [sys.executable, "-m", "services.rollout.main", "--worker-index", str(i), "--config", args.config]
        procs.append(subprocess.Popen(cmd, env=env))
    # One worker gone ends the container: compose reports it, `make up` stops the run.
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.5)
    for p in procs:
        p.terminate()
    return max(p.wait() for p in procs) if not stopping else 0


if __name__ == "__main__":
    sys.exit(main())
