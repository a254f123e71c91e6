"""gRPC over mutual TLS for a run that crosses machines (run.tls): what the run secret cannot hide on a shared
network is the traffic itself (the secret in each call's metadata, the trajectories, the weights' manifests).

The launcher makes one CA per run and one certificate signed by it (`ensure`: `<run>/tls/`, keys mode 0600, kept
across resumes), then throws the CA's key away: no other certificate can ever chain to the run's CA. Every server
of the run serves with that certificate and asks the same of its callers (mutual TLS), so a process without the
run's key cannot even finish a handshake; every client checks the server against the run's CA under one name
(SERVER_NAME, whatever address it dialled: a node's hostname, 127.0.0.1, a container's service name).

The run's own Redis serves TLS with the same certificate and asks it of its clients (services/common/redis_server.py).

A service finds the files from its config like the secret (`load_for_run`, called by `config_from_cli`); a run
without them speaks plaintext, as on one machine, where every listener is on 127.0.0.1. Certificates come from
`cryptography` (its X.509 builder), not hand-rolled ASN.1.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

DIR_NAME = "tls"
CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"
SERVER_NAME = "grpo-run"
"""The one name in the certificate, and the name clients check it for (grpc.ssl_target_name_override)."""
VALID_DAYS = 365


@dataclass(frozen=True)
class Credentials:
    ca: bytes
    cert: bytes
    key: bytes
    folder: Path | None = None
    """Where the three files are (load's; None for credentials made in memory): Redis' clients read files only."""


_current: Credentials | None = None


class TLSError(ValueError):
    """The run's TLS files are incomplete, readable by others, or do not chain to the run's CA."""


def ensure(run_dir: str | Path) -> Path:
    """The run's tls/ folder, made once (a resumed run keeps its own): a CA, a certificate for SERVER_NAME that it
    signed, and that certificate's key; the CA's key is not kept."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(run_dir) / DIR_NAME
    if (folder / KEY).exists():
        load(run_dir)  # complete and private, or an error naming what is wrong
        return folder
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"grpo run CA {Path(run_dir).name}")])

    def builder(subject: x509.Name, public_key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        )

    ca = (
        builder(ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]), key.public_key())
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for name, data in ((CA, ca.public_bytes(serialization.Encoding.PEM)),
                       (CERT, cert.public_bytes(serialization.Encoding.PEM)), (KEY, key_pem)):  # fmt: skip
        _write_private(folder / name, data)
    return folder


def _write_private(path: Path, data: bytes) -> None:
    """Written whole under a temporary name with mode 0600, then renamed: never seen half-written or open."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def load(run_dir: str | Path) -> Credentials | None:
    """The run's credentials, None where its folder has no tls/; TLSError where it is incomplete, its key readable
    by others, or its certificate not the CA's."""
    from cryptography import x509

    folder = Path(run_dir) / DIR_NAME
    if not folder.exists():
        return None
    missing = [n for n in (CA, CERT, KEY) if not (folder / n).is_file()]
    if missing:
        raise TLSError(f"{folder} lacks {', '.join(missing)}: remove the folder to make the run's TLS files again")
    mode = (folder / KEY).stat().st_mode & 0o777
    if mode & 0o077:
        raise TLSError(f"the run's TLS key {folder / KEY} is readable by others (mode {mode:o}): chmod 600 it")
    creds = Credentials(*((folder / n).read_bytes() for n in (CA, CERT, KEY)), folder=folder.resolve())
    try:
        x509.load_pem_x509_certificate(creds.cert).verify_directly_issued_by(x509.load_pem_x509_certificate(creds.ca))
    except (ValueError, TypeError) as e:
        raise TLSError(f"{folder / CERT} is not signed by {folder / CA}: {e}") from e
    return creds


def load_for_run(run_dir: str | Path) -> Credentials | None:
    """Make the run's credentials this process's; a service's first step, beside the secret's."""
    global _current
    _current = load(run_dir)
    return _current


def set_current(creds: Credentials | None) -> None:
    """Set this process's credentials by hand (tests, embedding); None speaks plaintext."""
    global _current
    _current = creds


def current() -> Credentials | None:
    return _current
