"""A multi-node Slurm cluster on one machine, to try `make up` across nodes (and for the tests that do): slurmctld
and N slurmd, each in a network, UTS and mount namespace of its own, on a bridge that lives in a namespace of its
own. Every node has its own address and hostname (`node1`..`nodeN`, the controller `ctl`, which plays the login
node) and resolves the others' names from a hosts file bind-mounted on its /etc/hosts; the machine's own network,
/etc/hosts and /etc/slurm are left as they are. The filesystem is shared, as on a cluster with a shared home.

    python -m deploy.slurm.testcluster up --dir /tmp/cluster     # prints how to run a command on its login node
    /tmp/cluster/in <tag>-ctl ctl env SLURM_CONF=/tmp/cluster/slurm.conf make up ARGS='placement.num_nodes=3 ...'
    python -m deploy.slurm.testcluster down --dir /tmp/cluster

Needs root, iproute2, util-linux (nsenter, unshare) and slurm-wlm + munge (`.ci/run` installs them). Why
`nsenter --net` and not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup, and slurmd then fails to
start its cgroup plugin. No cgroup limits per job (proctrack/linuxproc, task/none); each node declares the
machine's CPUs (config_overrides), which all of them share."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CONF = """\
ClusterName=grpotest
SlurmctldHost=ctl({net}.10)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
"""

# `in NS HOST CMD...`: CMD in NS's network, with HOST as its hostname and the cluster's hosts file.
IN = """#!/bin/sh
ns=$1; host=$2; shift 2
exec nsenter --net=/run/netns/$ns unshare --uts --mount sh -c \
  'mount --bind "$0" /etc/hosts && hostname "$1" && shift 2 && exec "$@"' {hosts} "$host" sh "$@"
"""


class ClusterError(RuntimeError):
    """The test cluster could not start (what is missing or which daemon failed, with its log)."""


@dataclass(frozen=True)
class TestCluster:
    dir: Path
    nodes: tuple[str, ...]
    tag: str
    """Prefix of the cluster's namespace names (several clusters can run at once)."""

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment with this cluster's slurm.conf and no variables of another Slurm job."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        return {**keep, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def command(self, host: str, *cmd: str) -> list[str]:
        """cmd as run on host (a node's name, or `ctl`, the login node)."""
        return [str(self.dir / "in"), self.netns(host), host, *cmd]

    def run(self, host: str, *cmd: str, timeout_s: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, *cmd), env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, **kw)  # fmt: skip

    def netns(self, host: str) -> str:
        return f"{self.tag}-{host}"


def up(folder: Path, num_nodes: int = 3, wait_s: float = 60) -> TestCluster:
    """Start the cluster in folder (made here; its daemons' PIDs, logs and state stay there) and wait until every
    node is idle. The daemons run in sessions of their own: `down(folder)` stops them, from any process."""
    for tool in ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sinfo"):
        if not shutil.which(tool):
            raise ClusterError(f"{tool} is not installed: apt-get install iproute2 util-linux slurm-wlm munge")
    if os.geteuid() != 0:
        raise ClusterError("a test cluster needs root (network namespaces, bind mounts)")
    folder = Path(folder).resolve()
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    tag = "gs" + secrets.token_hex(3)
    net = f"10.{100 + secrets.randbelow(100)}.{secrets.randbelow(256)}"
    cluster = TestCluster(folder, tuple(f"node{i}" for i in range(1, num_nodes + 1)), tag)
    (folder / "tag").write_text(f"{tag} {num_nodes}\n")
    try:
        _network(cluster, net)
        _configure(cluster, net)
        _start_daemons(cluster)
        _wait_idle(cluster, wait_s)
    except BaseException:
        down(folder)
        raise
    return cluster


def _network(c: TestCluster, net: str) -> None:
    sw = f"{c.tag}-sw"
    _ip("netns", "add", sw)
    _ip("-n", sw, "link", "add", "br0", "type", "bridge")
    _ip("-n", sw, "link", "set", "br0", "up")
    for octet, host in enumerate(("ctl", *c.nodes), start=10):
        ns, veth = c.netns(host), f"v{c.tag[2:]}{octet}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "netns", sw)
        _ip("-n", sw, "link", "set", veth, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{net}.{octet}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _configure(c: TestCluster, net: str) -> None:
    nodes = [
        f"NodeName={n} NodeAddr={net}.{i} CPUs={os.cpu_count()} RealMemory=4000 State=UNKNOWN"
        for i, n in enumerate(c.nodes, start=11)
    ]
    partition = "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    (c.dir / "slurm.conf").write_text(CONF.format(net=net, dir=c.dir) + "\n".join([*nodes, partition]) + "\n")
    names = [f"{net}.10 ctl", *(f"{net}.{i} {n}" for i, n in enumerate(c.nodes, start=11))]
    hosts = [line for line in Path("/etc/hosts").read_text().splitlines() if "127.0.0.1" in line or "::1" in line]
    (c.dir / "hosts").write_text("\n".join([*hosts, *names]) + "\n")
    helper = c.dir / "in"
    helper.write_text(IN.replace("{hosts}", str(c.dir / "hosts")))
    helper.chmod(0o755)
    key = c.dir / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    for n in c.nodes:
        (c.dir / "spool" / n).mkdir(parents=True, exist_ok=True)


def _start_daemons(c: TestCluster) -> None:
    d = c.dir
    munge = ["munged", "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={d}/munge.key"]
    munge += [f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"]
    _daemon(c, "munged", munge)
    deadline = time.monotonic() + 10
    while not (d / "munge.sock").exists():
        if time.monotonic() > deadline:
            raise ClusterError(f"munged made no socket: {_tail(d / 'munged.out')}")
        time.sleep(0.05)
    _daemon(c, "slurmctld", c.command("ctl", "slurmctld", "-D", "-i"))
    for n in c.nodes:
        _daemon(c, f"slurmd-{n}", c.command(n, "slurmd", "-D", "-N", n))


def _daemon(c: TestCluster, name: str, cmd: list[str]) -> None:
    """Foreground daemon in a session of its own, its PID in <name>.bgpid (down() stops it by that)."""
    with open(c.dir / f"{name}.out", "ab") as out:
        proc = subprocess.Popen(cmd, env=c.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    (c.dir / f"{name}.bgpid").write_text(f"{proc.pid}\n")


def _wait_idle(c: TestCluster, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        out = c.run("ctl", "sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        if all(states.get(n) == "idle" for n in c.nodes):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"nodes not idle within {wait_s:.0f}s ({states}): {_tail(c.dir / 'slurmctld.log')}")
        time.sleep(0.3)


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else f"no {log}"


def down(folder: Path) -> list[str]:
    """Stop the daemons of the cluster in folder (by the PIDs up recorded) and remove its namespaces; returns what
    it stopped. Safe to call twice, or on a cluster that failed to start."""
    folder = Path(folder).resolve()
    stopped = []
    for pidfile in [*sorted(folder.glob("slurmd-*.bgpid")), folder / "slurmctld.bgpid", folder / "munged.bgpid"]:
        if not pidfile.exists():
            continue
        pid = int(pidfile.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
            stopped.append(pidfile.stem)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        pidfile.unlink()
    if (folder / "tag").exists():
        tag, n = (folder / "tag").read_text().split()
        names = [f"{tag}-{host}" for host in ("ctl", *(f"node{i}" for i in range(1, int(n) + 1)), "sw")]
        stopped += _kill_inside(names)
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        (folder / "tag").unlink()
    return stopped


def _kill_inside(names: list[str]) -> list[str]:
    """SIGKILL every process still in one of the named network namespaces: a job's steps (slurmstepd and what it
    runs) outlive the slurmd that started them, and a deleted namespace's processes would run on unseen."""
    inodes = {}
    for name in names:
        try:
            inodes[os.stat(f"/run/netns/{name}").st_ino] = name
        except OSError:
            continue
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            inside = inodes.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
            if inside and _alive(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
                killed.append(f"{pid} in {inside}")
        except (OSError, ValueError):
            continue
    return killed


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it where it is our child
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, required=True, help="the cluster's folder (state, logs, slurm.conf)")
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    try:
        if args.action == "down":
            print("stopped: " + (", ".join(down(args.dir)) or "nothing"))
            return 0
        c = up(args.dir, args.nodes)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"cluster up: {', '.join(c.nodes)} idle; run commands on its login node with\n"
          f"  {c.dir / 'in'} {c.netns('ctl')} ctl env SLURM_CONF={c.dir / 'slurm.conf'} sinfo\n"
          f"stop it with: python -m deploy.slurm.testcluster down --dir {c.dir}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
