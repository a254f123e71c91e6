"""A node's trainer ranks, started as torchrun starts them (`--standalone`, or one node of `--nnodes` with a static
master), but with their rendezvous store listening on one address: torchrun's listens on every interface, whatever
address it is given, so on a shared host anyone who reaches the node could join or poison the ranks' store.

    python -m deploy.ranks --nproc-per-node N --host 127.0.0.1 -- -m services.trainer.main --config ...
    python -m deploy.ranks --nproc-per-node N --nnodes M --node-rank K --host n0 --port P -- ...   # each node K

The process of node 0 hosts the store (torch's TCPStore on a socket bound to --host, the master's address; --port,
or a free one on a single node); every process starts N python processes with torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT; TORCHELASTIC_USE_AGENT_STORE, so every rank connects to that store instead
of rank 0 hosting one of its own). As torchrun without restarts: the first rank that exits with an error stops the
others of its node (SIGTERM, then SIGKILL after 30 s) and this process exits with its code (the other nodes' ranks
then fail their next collective); SIGTERM and SIGINT are passed on to every rank."""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time


def launches_ranks(cmdline: str) -> bool:
    """Whether a process's command line is a launcher of trainer ranks (this module, or torchrun), not a rank."""
    return "deploy.ranks" in cmdline or "torch.distributed.run" in cmdline


KILL_AFTER_S = 30.0
"""As torchrun: ranks that do not exit this long after SIGTERM are killed."""


def rank_env(local_rank: int, nproc: int, host: str, port: int, nnodes: int = 1, node_rank: int = 0) -> dict[str, str]:
    rank, world = node_rank * nproc + local_rank, nnodes * nproc
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(node_rank),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="node 0's address, the one its ranks' store listens on")
    parser.add_argument("--port", type=int, default=0, help="the store's port (needed with --nnodes > 1)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the python arguments of every rank")
    args = parser.parse_args()
    python_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    if args.nproc_per_node < 1 or not python_args:
        parser.error("need --nproc-per-node >= 1 and, after --, what each rank runs")
    if not 0 <= args.node_rank < args.nnodes or (args.nnodes > 1 and not args.port):
        parser.error("need 0 <= --node-rank < --nnodes, and --port (node 0's store) with several nodes")

    store, port = None, args.port
    if args.node_rank == 0:
        import torch.distributed as dist

        from services.common.ports import listening_socket

        listener = listening_socket(args.host, args.port)
        port = listener.getsockname()[1]
        store = dist.TCPStore(  # noqa: F841 (serves while this process lives)
            args.host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(),
            timeout=datetime.timedelta(minutes=30),
        )  # fmt: skip
    nproc, where = args.nproc_per_node, (args.host, port, args.nnodes, args.node_rank)
    ranks = [
        subprocess.Popen([sys.executable, *python_args], env={**os.environ, **rank_env(r, nproc, *where)})
        for r in range(nproc)
    ]

    def pass_on(signum, _frame):
        for p in ranks:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    while True:
        codes = [p.poll() for p in ranks]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None or all(c == 0 for c in codes):
            break
        time.sleep(0.2)
    if failed is not None:
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        print(
            f"deploy.ranks: rank {args.node_rank * nproc + bad[0]} exited with {failed}; stopping the other ranks",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        _stop(ranks)
        return failed if failed > 0 else 128 - failed
    return 0


def _stop(ranks: list[subprocess.Popen]) -> None:
    for p in ranks:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + KILL_AFTER_S
    for p in ranks:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
