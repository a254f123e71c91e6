"""The run secret: one random key per run that every state-changing call carries and every signature is made with.

The launcher creates it once per run (`ensure_secret`: `<run>/run.secret`, mode 0600, kept across resumes) before
any service starts. A service finds it from its config (`load_for_run`, called by `config_from_cli`, the entry of
every service): `GRPO_RUN_SECRET` in the environment where set, else the file in its run folder. It never travels
on a command line. A process without one (a service started by hand outside a run folder) serves unlocked and says
so in its log.

gRPC: clients put it in the call's metadata (`METADATA_KEY`); servers compare it in constant time
(services/common/grpcio.py). Signatures (trajectory groups, work items, weight manifests, checkpoints) are
HMAC-SHA256 over length-prefixed parts with a purpose label, so a signature of one kind never passes as another.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "GRPO_RUN_SECRET"
FILE_NAME = "run.secret"
METADATA_KEY = "x-grpo-run-secret"

_secret: str | None = None


class SecretError(ValueError):
    """The run secret file is missing, unreadable by its owner alone, or malformed."""


def ensure_secret(run_dir: str | Path) -> Path:
    """The run's secret file, created where it is not there yet (mode 0600): GRPO_RUN_SECRET where the launcher's
    environment has one, else 32 random bytes in hex."""
    path = Path(run_dir) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        read_secret(path)  # a damaged one fails here, at the launcher, not in every service
        return path
    with os.fdopen(fd, "w") as f:
        f.write((os.environ.get(ENV) or secrets.token_hex(32)).strip() + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path


def read_secret(path: str | Path) -> str:
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text().strip()
    except OSError as e:
        raise SecretError(f"cannot read the run secret {path}: {e.strerror}") from None
    if mode & 0o077:
        raise SecretError(f"the run secret {path} is readable by others (mode {mode:o}): chmod 600 {path}")
    if len(text) < 32 or any(c not in "0123456789abcdef" for c in text):
        raise SecretError(f"the run secret {path} is not one (expected 64 hex digits)")
    return text


def env_secret() -> str | None:
    return os.environ.get(ENV, "").strip() or None


def run_secret(run_dir: str | Path) -> str | None:
    """A run's secret: the environment's where set, else the run folder's file; None where neither is."""
    if env_secret():
        return env_secret()
    path = Path(run_dir) / FILE_NAME
    return read_secret(path) if path.exists() else None


def load_for_run(run_dir: str | Path) -> str | None:
    """Make the run's secret this process's (run_secret); a service's first step."""
    global _secret
    _secret = run_secret(run_dir)
    return _secret


def set_secret(secret: str | None) -> None:
    """Set this process's secret by hand (tests, embedding); None unlocks."""
    global _secret
    _secret = secret


def current() -> str | None:
    return _secret


def matches(given: str | None, secret: str | None = None) -> bool:
    """Whether a caller's secret is the run's (constant time)."""
    secret = _secret if secret is None else secret
    return secret is None or (given is not None and hmac.compare_digest(given.encode(), secret.encode()))


def sign(purpose: str, *parts: bytes, secret: str | None = None) -> bytes:
    """HMAC-SHA256 over the purpose and each part, each length-prefixed; b"" where this process has no secret."""
    secret = _secret if secret is None else secret
    if secret is None:
        return b""
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    for part in (purpose.encode(), *parts):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.digest()


def verify(signature: bytes, purpose: str, *parts: bytes, secret: str | None = None) -> bool:
    """Whether signature is this run's over these parts (always True where this process has no secret)."""
    secret = _secret if secret is None else secret
    if secret is None:
        return True
    return hmac.compare_digest(signature, sign(purpose, *parts, secret=secret))
