"""A Docker host on this machine, to try `make up` on Docker (and for tests/integration/test_docker_host.py): Docker
Engine >= 25 with Compose v2 and BuildKit on a private socket and data root, and local stand-ins for the images that
compose.yaml would pull from Docker Hub (a Python base image from Debian's mirror, Redis from Debian's package).
The machine's default socket stays silent, so `docker info` there (deploy/docker/launch.py: detect()) still fails for
everything else on the machine; only a shell that exports the printed DOCKER_HOST sees this engine.

    python -m deploy.docker.testhost up --dir /tmp/grpo-docker     # prints the variables to export
    eval "$(cat /tmp/grpo-docker/env)"; make up BACKEND=docker ARGS='run.num_steps=3'
    python -m deploy.docker.testhost down --dir /tmp/grpo-docker

Needs root and Debian 12 (bookworm). Installs what is missing: Debian 13's docker.io, docker-compose (v2) and
docker-buildx (Debian 12's engine is 20.10, which refuses compose.yaml's healthcheck.start_interval), fetched with a
private apt state so the system's sources stay as they are, and debootstrap. The daemon adds no iptables rules, no
forwarding and no default bridge: containers talk on the project's user-defined bridge, builds use the host's
network (compose.yaml: GRPO_BUILD_NETWORK=host). Images and build cache stay in the data root between runs."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

DATA_ROOT = Path("/var/lib/grpo-docker")
DEBIAN = "grpo-debian:bookworm"  # debootstrap's minbase, the host's CAs
PYTHON_IMAGE = "grpo-python:3.11-bookworm"  # python:3.11-slim-bookworm's stand-in
REDIS_IMAGE = "grpo-redis:7.0-bookworm"  # redis:7.2's stand-in (Debian 12's redis-server)
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

# As the official image: python and pip first on PATH (a venv: Debian's system pip is PEP 668-locked), and Python's
# headers (the Dockerfile compiles the C extensions that PyPI has no wheel of).
PYTHON_DOCKERFILE = f"""FROM {DEBIAN}
RUN apt-get update && apt-get install -y --no-install-recommends python3-dev && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv && ln -s /opt/venv/bin/python3 /usr/local/bin/python
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
"""
# As the official image: /data is the working folder, redis-server the command.
REDIS_DOCKERFILE = f"""FROM {DEBIAN}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \\
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data
WORKDIR /data
CMD ["redis-server"]
"""


class HostError(RuntimeError):
    """The test host could not start (what is missing or what failed, with its output)."""


def _sh(*cmd: str, env: dict | None = None, input: str | None = None, timeout_s: float = 1800) -> str:
    done = subprocess.run(cmd, env=env, input=input, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise HostError(f"{' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''} exited {done.returncode}:\n{tail}")
    return done.stdout


def _log(message: str) -> None:
    print(f"[testhost] {message}", file=sys.stderr, flush=True)


def mirror() -> str:
    """The Debian mirror apt already uses here."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def _engine_version() -> tuple[int, ...]:
    if not shutil.which("dockerd"):
        return ()
    out = subprocess.run(["dockerd", "--version"], capture_output=True, text=True).stdout
    found = re.search(r"version (\d+)\.(\d+)", out)
    return tuple(map(int, found.groups())) if found else ()


def _plugin(name: str) -> bool:
    dirs = ["/usr/libexec/docker/cli-plugins", "/usr/lib/docker/cli-plugins", "/usr/local/lib/docker/cli-plugins"]
    return any(Path(d, f"docker-{name}").exists() for d in dirs)


def install(folder: Path) -> None:
    """Engine >= 25, compose v2 and buildx (Debian 13's .debs), debootstrap: each only where missing."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    missing = [p for p in ("containerd", "runc", "tini", "iptables", "debootstrap") if not shutil.which(p)]
    if missing:
        _log(f"apt-get install {' '.join(missing)}")
        _sh("apt-get", "update", "-qq", env=env)
        _sh("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env)
    if _engine_version() >= (25,) and _plugin("compose") and _plugin("buildx"):
        return
    _log("Debian 13's docker.io, docker-compose and docker-buildx (private apt state)")
    apt = folder / "apt"
    for sub in ("lists/partial", "archives/partial"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(f"deb [signed-by={KEYRING}] {mirror()} trixie main\n")
    opts = [f"-oDir::Etc::SourceList={apt / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache::Archives={apt / 'archives'}"]  # fmt: skip
    _sh("apt-get", *opts, "update", "-qq", env=env)
    for old in apt.glob("*.deb"):
        old.unlink()
    subprocess.run(["apt-get", *opts, "download", "docker.io", "docker-compose", "docker-buildx"], cwd=apt,
                   env=env, capture_output=True, check=True)  # fmt: skip
    _sh("apt-get", "install", "-y", "-qq", "--no-install-recommends", *map(str, sorted(apt.glob("*.deb"))), env=env)


class Host:
    def __init__(self, folder: Path, data_root: Path = DATA_ROOT):
        self.dir, self.data_root = Path(folder).resolve(), Path(data_root).resolve()

    @property
    def socket(self) -> Path:
        return self.dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def exports(self) -> dict[str, str]:
        """What a shell exports to run `make up` on this host (compose.yaml reads the GRPO_* ones)."""
        env = {
            "DOCKER_HOST": self.docker_host,
            "GRPO_PYTHON_IMAGE": PYTHON_IMAGE,
            "GRPO_REDIS_IMAGE": REDIS_IMAGE,
            # No default bridge here: build steps reach the package registries on the host's network.
            "GRPO_BUILD_NETWORK": "host",
        }
        wheels = local_wheels()
        if wheels:
            # PyTorch's index is out of reach here: torch +cpu from the machine's wheel folder, the rest from PyPI.
            env["GRPO_WHEELS_DIR"] = str(wheels)
            env["GRPO_TORCH_INDEX_URL"] = "https://pypi.org/simple"
        return env

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.exports}

    def docker(self, *args: str, input: str | None = None, timeout_s: float = 1800) -> str:
        return _sh("docker", *args, env=self.env, input=input, timeout_s=timeout_s)

    def answers(self) -> bool:
        return subprocess.run(["docker", "info"], env=self.env, capture_output=True).returncode == 0

    def has_image(self, image: str) -> bool:
        return subprocess.run(["docker", "image", "inspect", image], env=self.env, capture_output=True).returncode == 0


def local_wheels() -> Path | None:
    """The folder of pip's find-links here holding a torch wheel (the machine's pip config), if any."""
    links = os.environ.get("PIP_FIND_LINKS", "")
    for conf in ("/etc/pip.conf", os.path.expanduser("~/.config/pip/pip.conf")):
        if Path(conf).exists():
            found = re.search(r"^find-links\s*=\s*(\S+)", Path(conf).read_text(), re.M)
            links += " " + (found.group(1) if found else "")
    for link in links.split():
        path = Path(link.removeprefix("file://"))
        if path.is_dir() and any(path.glob("torch-*.whl")):
            return path
    return None


def up(folder: Path, data_root: Path = DATA_ROOT, wait_s: float = 60) -> Host:
    """Install what is missing, start dockerd on folder/docker.sock (its PID in folder/dockerd.bgpid, its log in
    folder/dockerd.log) and make the stand-in images (kept in data_root: later starts skip them). The daemon runs in
    a session of its own: `down(folder)` stops it, from any process."""
    if os.geteuid() != 0:
        raise HostError("a test host needs root (dockerd, debootstrap)")
    host = Host(folder, data_root)
    host.dir.mkdir(parents=True, exist_ok=True)
    if len(str(host.socket)) > 90:
        raise HostError(f"{host.socket}: too long for a unix socket; pick a shorter --dir")
    t = time.monotonic()
    install(host.dir)
    _log(f"packages ready in {time.monotonic() - t:.0f}s")
    try:
        if not host.answers():
            _start(host, wait_s)
        _images(host)
    except BaseException:
        down(host.dir)
        raise
    (host.dir / "env").write_text("".join(f"export {k}={v}\n" for k, v in host.exports.items()))
    return host


def _start(host: Host, wait_s: float) -> None:
    t = time.monotonic()
    cmd = ["dockerd", "-H", host.docker_host, "--data-root", str(host.data_root),
           "--exec-root", str(host.dir / "exec"), "--pidfile", str(host.dir / "docker.pid"),
           "--iptables=false", "--ip-forward=false", "--bridge=none", "--storage-driver=overlay2"]  # fmt: skip
    with open(host.dir / "dockerd.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    (host.dir / "dockerd.bgpid").write_text(f"{proc.pid}\n")
    (host.dir / "data-root").write_text(f"{host.data_root}\n")  # down() checks for mounts left there too
    deadline = time.monotonic() + wait_s
    while not host.answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise HostError(f"dockerd did not answer on {host.socket}: {_tail(host.dir / 'dockerd.log')}")
        time.sleep(0.3)
    _log(f"dockerd up in {time.monotonic() - t:.1f}s on {host.socket}")


def _images(host: Host) -> None:
    if not host.has_image(DEBIAN):
        t = time.monotonic()
        rootfs = host.dir / "rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        # libnuma1 is the one package the Dockerfile adds (vLLM's CPU kernels); here it comes with the rootfs.
        _sh("debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates,libnuma1",
            "bookworm", str(rootfs), mirror())  # fmt: skip
        # HTTPS to the package registries may go through a proxy whose CA only this machine trusts.
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy(crt, rootfs / "usr/local/share/ca-certificates")
        _sh("chroot", str(rootfs), "update-ca-certificates")
        for junk in [*(rootfs / "var/cache/apt/archives").glob("*.deb"), *(rootfs / "var/lib/apt/lists").glob("*_*")]:
            junk.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["bash"]', "-", DEBIAN],
                       stdin=tar.stdout, env=host.env, capture_output=True, check=True)  # fmt: skip
        tar.wait()
        shutil.rmtree(rootfs)
        _log(f"{DEBIAN} in {time.monotonic() - t:.0f}s (debootstrap from {mirror()})")
    for image, dockerfile in ((PYTHON_IMAGE, PYTHON_DOCKERFILE), (REDIS_IMAGE, REDIS_DOCKERFILE)):
        if not host.has_image(image):
            t = time.monotonic()
            host.docker("build", "--network", "host", "--tag", image, "-", input=dockerfile)
            _log(f"{image} in {time.monotonic() - t:.0f}s")


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else f"no {log}"


def down(folder: Path, wait_s: float = 60) -> list[str]:
    """Stop the daemon of the host in folder by the PID up recorded (dockerd stops its containers and its
    containerd first), then unmount anything of its exec root left behind. Safe to call twice."""
    folder = Path(folder).resolve()
    pidfile, stopped = folder / "dockerd.bgpid", []
    if pidfile.exists():
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            stopped.append(f"dockerd ({pid})")
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        pidfile.unlink()
    roots = [f"{folder}/"]
    if (folder / "data-root").exists():
        roots.append(f"{(folder / 'data-root').read_text().strip()}/")
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(tuple(roots))), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)
        stopped.append(f"mount {mount}")
    return stopped


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
    parser.add_argument("--dir", type=Path, required=True, help="the host's folder (socket, PIDs, logs, env)")
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT, help="images, containers, build cache")
    args = parser.parse_args()
    try:
        if args.action == "down":
            print("stopped: " + (", ".join(down(args.dir)) or "nothing"))
            return 0
        host = up(args.dir, args.data_root)
    except (HostError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("".join(f"export {k}={v}\n" for k, v in host.exports.items()), end="")
    print(f"# the same lines are in {host.dir / 'env'}: eval \"$(cat {host.dir / 'env'})\"\n"
          f"# stop it with: python -m deploy.docker.testhost down --dir {host.dir}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
