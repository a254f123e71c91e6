"""The commit of one version: the sender's bucket checksums, which follow the bytes over the data plane, signed
(signing.py), or why it stopped. Imports no protos: transports carry it as bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..kernels.checksum import combine


@dataclass(frozen=True, slots=True)
class Commit:
    """The sender's checksums of the buckets it sent, in bucket order, or why it stopped (receivers must
    then apply nothing)."""

    bucket_checksums: tuple[str, ...] = ()
    error: str = ""
    signature: bytes = b""
    """The run secret's HMAC over the checksums and the manifest's signature (signing.sign_commit)."""

    @property
    def checksum(self) -> str:
        """The version's checksum: blake2b-128 over the bucket checksums, in order."""
        return combine(list(self.bucket_checksums)) if not self.error else ""

    def encode(self) -> bytes:
        d = {"bucket_checksums": list(self.bucket_checksums), "error": self.error, "signature": self.signature.hex()}
        return json.dumps(d).encode()

    @classmethod
    def decode(cls, data: bytes) -> Commit:
        d = json.loads(data)
        return cls(tuple(d["bucket_checksums"]), d["error"], bytes.fromhex(d["signature"]))

    @classmethod
    def of_shares(cls, shares: list[tuple[list[int], list[str], str]], num_buckets: int) -> Commit:
        """The commit of every sending rank's (bucket indices, their checksums, error)."""
        errors = [e for _, _, e in shares if e]
        if errors:
            return cls(error="; ".join(errors))
        by_bucket = [""] * num_buckets
        for indices, digests, _ in shares:
            for i, digest in zip(indices, digests, strict=True):
                by_bucket[i] = digest
        return cls(tuple(by_bucket))
