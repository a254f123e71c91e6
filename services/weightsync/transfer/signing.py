"""Proof that a version comes from the run's trainer: HMACs with the run secret (services/common/auth.py) over its
manifest, which travels before the bytes, and over its commit's checksums, which follow them.

The checksums prove the bytes arrived as sent; these signatures prove who sent them. Both are cheap (a few KB of
HMAC per refit): the tensors themselves are covered by the signed checksums, never hashed again here.
"""

from __future__ import annotations

import dataclasses

from protos.grpo.v1 import weights_pb2
from services.common import auth
from services.common.grpcio import PreconditionError

from .commit import Commit

MANIFEST_PURPOSE = "weights"
COMMIT_PURPOSE = "weights.commit"


class SignatureError(PreconditionError):
    """A version whose manifest or checksums the run's trainer did not sign: nothing of it is applied."""


def _manifest_parts(m: weights_pb2.WeightManifest) -> list[bytes]:
    """Everything a receiver acts on: the version, each tensor's name, dtype, shape and place in its bucket, the
    buckets' sizes and senders, the checksum family. One length-prefixed part per field (auth.sign), each list's
    length first, so no two manifests read alike."""
    parts = [str(m.policy_version), m.checksum_algo, str(m.payload_bytes), str(len(m.tensors))]
    for t in m.tensors:
        parts += [t.name, t.dtype, ",".join(map(str, t.shape)), str(t.bucket), str(t.offset), str(t.nbytes)]
    parts.append(str(len(m.buckets)))
    for b in m.buckets:
        parts += [str(b.index), str(b.nbytes), str(b.sender)]
    return [p.encode() for p in parts]


def sign_manifest(m: weights_pb2.WeightManifest) -> weights_pb2.WeightManifest:
    """The manifest, signed in place (b"" where this process has no secret)."""
    m.signature = auth.sign(MANIFEST_PURPOSE, *_manifest_parts(m))
    return m


def check_manifest(m: weights_pb2.WeightManifest) -> None:
    """Raise SignatureError unless the run's trainer signed this manifest (passes where this process has no secret)."""
    if not auth.verify(m.signature, MANIFEST_PURPOSE, *_manifest_parts(m)):
        why = "is not signed" if not m.signature else "has a signature that is not the run's"
        raise SignatureError(f"version {m.policy_version} {why}: not from this run's trainer, refused")


def _commit_parts(m: weights_pb2.WeightManifest, commit: Commit) -> list[bytes]:
    # The manifest's signature binds the checksums to that one manifest: no genuine checksums under another layout.
    return [m.signature, *(c.encode() for c in commit.bucket_checksums)]


def sign_commit(m: weights_pb2.WeightManifest, commit: Commit) -> Commit:
    """The commit with the run secret's signature over its checksums and the (signed) manifest it follows."""
    return dataclasses.replace(commit, signature=auth.sign(COMMIT_PURPOSE, *_commit_parts(m, commit)))


def check_commit(m: weights_pb2.WeightManifest, commit: Commit) -> None:
    """Raise SignatureError unless the checksums the bytes are verified against are the run's trainer's."""
    if not auth.verify(commit.signature, COMMIT_PURPOSE, *_commit_parts(m, commit)):
        why = "are not signed" if not commit.signature else "have a signature that is not the run's"
        raise SignatureError(f"the checksums of version {m.policy_version} {why}: refused")
