"""One service task on a Slurm node: pick its GPUs among the step's, then exec the service or Redis."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", default=None, help="placement GPU indices, '' = none; absent = leave CUDA's view")
    parser.add_argument("--redis", action="store_true", help="exec redis-server instead of python")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the service's arguments")
    args = parser.parse_args()
    if args.gpus is not None:
        # Positions in the GPUs Slurm gave the step.
        from ..placement.gpus import visible_devices

        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(args.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    # A trainer spanning nodes is one step with a task per node; each learns its node rank here.
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    argv = [a.replace("{node_rank}", os.environ.get("SLURM_PROCID", "0")) for a in rest]
    if args.redis:
        from services.common.redis_server import redis_binary

        exe = redis_binary()
        os.execv(exe, [exe, *argv])
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
