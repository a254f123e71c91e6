"""deploy/ranks.py, the trainer's launcher in place of torchrun, on one node and across two (here two launchers on one
host, as two nodes' would run): every rank gets torchrun's environment, they form one world, and the rendezvous store
listens on the master's address alone, never on every interface as torchrun's does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.common.ports import free_port

REPO = Path(__file__).resolve().parents[2]
RANK = """
import os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
port, listening = int(os.environ["MASTER_PORT"]), set()
for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # LISTEN
            raw = bytes.fromhex(address)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word little-endian
            listening.add(socket.inet_ntop(family, raw))
row = ["RANK", os.environ["RANK"], os.environ["LOCAL_RANK"], dist.get_world_size(), int(t.item()), sorted(listening)]
os.write(1, (" ".join(map(str, row)) + chr(10)).encode())  # one write: the ranks share the pipe
dist.barrier()
dist.destroy_process_group()
"""


def _ranks(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "deploy.ranks", *args, "--", "-c", RANK]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(proc: subprocess.Popen) -> list[list[str]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    rows = sorted(line.split(" ", 5)[1:] for line in out.splitlines() if line.startswith("RANK"))
    assert len(rows) == out.count("RANK"), (out, err)
    return rows


def test_one_node_ranks_form_a_world_with_their_store_on_one_address():
    rows = _lines(_ranks("--nproc-per-node=2", "--host=127.0.0.1"))
    assert rows == [["0", "0", "2", "3", "['127.0.0.1']"], ["1", "1", "2", "3", "['127.0.0.1']"]]


def test_two_nodes_form_one_world_through_node_0s_store_on_its_address_alone():
    port = free_port()
    nodes = [
        _ranks("--nproc-per-node=1", "--nnodes=2", f"--node-rank={k}", "--host=127.0.0.1", f"--port={port}")
        for k in (1, 0)
    ]  # node 1 first: its rank waits for node 0's store
    node1, node0 = (_lines(p) for p in nodes)
    # Global ranks 0 and 1, each local rank 0, one world of 2: 1 + 2 = 3. One store (node 0's, on 127.0.0.1 only;
    # both "nodes" share this host's sockets table).
    assert node0 == [["0", "0", "2", "3", "['127.0.0.1']"]]
    assert node1 == [["1", "0", "2", "3", "['127.0.0.1']"]]


@pytest.mark.parametrize(
    "args", [["--nnodes=2", "--node-rank=1"], ["--nnodes=2", "--node-rank=2", "--port=1"]], ids=["no port", "rank"]
)
def test_a_node_without_its_place_in_the_world_is_refused(args):
    proc = _ranks("--nproc-per-node=1", *args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--node-rank" in err
