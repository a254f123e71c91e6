"""The rollout container: `rollout.num_workers` worker processes, on the GPUs the placement gave each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def worker_gpu(index: int, env: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES of worker `index`: its GPU as this container numbers them ("" on CPU).

    GRPO_ROLLOUT_GPUS comes from `make up` (colocated workers share one); without it, one GPU each in order."""
    if env.get("GRPO_DEVICE") != "cuda":
        return ""
    listed = env.get("GRPO_ROLLOUT_GPUS")
    return listed.split(",")[index] if listed else str(index)


def main() -> int:
    from services.common.config import config_from_cli

    cfg, args = config_from_cli(__doc__)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    procs = []
    for i in range(cfg.rollout.num_workers):
        # compose reserves the placement's GPUs for this container; inside it they are numbered from 0.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": worker_gpu(i, dict(os.environ))}
        cmd = [sys.executable, "-m", "services.rollout.main", "--worker-index", str(i)]
        cmd += ["--config", args.config] if args.config else []
        procs.append(subprocess.Popen([*cmd, *args.overrides], env=env))
    # One worker gone ends the container with a failure, whatever the worker's status (the others' SIGTERM exit
    # is 0): compose's restart policy starts it again, and past its limit `make up` stops the run.
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.5)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
