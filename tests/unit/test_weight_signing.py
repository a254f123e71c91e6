"""A version's manifest and commit signed with the run secret: any change to what a receiver acts on, or a
signature made without the secret, is refused; a process without a secret signs and checks nothing."""

from __future__ import annotations

import pytest
import torch

from services.common import auth
from services.weightsync.transfer import manifest as mf
from services.weightsync.transfer import signing
from services.weightsync.transfer.commit import Commit
from services.weightsync.transfer.plan import ReceiverLayout, layout_of, make_plan

SECRET = "ab" * 32


@pytest.fixture
def secret():
    auth.set_secret(SECRET)
    yield SECRET
    auth.set_secret(None)


def _manifest(version: int = 7):
    named = [("a", torch.zeros(3, 5)), ("b", torch.zeros(100, dtype=torch.bfloat16)), ("c", torch.zeros(64, 64))]
    plan = make_plan(layout_of(named), ReceiverLayout(), 512)
    return signing.sign_manifest(mf.to_manifest(plan, version, "xxh3"))


ALTERATIONS = {
    "policy_version": lambda m: setattr(m, "policy_version", m.policy_version + 1),
    "tensor name": lambda m: setattr(m.tensors[0], "name", "lm_head.weight"),
    "tensor dtype": lambda m: setattr(m.tensors[1], "dtype", "float16"),
    "tensor shape": lambda m: m.tensors[0].shape.__setitem__(0, 5),
    "tensor offset": lambda m: setattr(m.tensors[0], "offset", m.tensors[0].offset + 64),
    "tensor bucket": lambda m: setattr(m.tensors[0], "bucket", 1),
    "bucket size": lambda m: setattr(m.buckets[0], "nbytes", m.buckets[0].nbytes + 64),
    "bucket sender": lambda m: setattr(m.buckets[0], "sender", 1),
    "checksum algo": lambda m: setattr(m, "checksum_algo", "crc32"),
    "a tensor more": lambda m: m.tensors.add(name="x", dtype="float32", shape=[1], bucket=0, offset=0, nbytes=4),
}


@pytest.mark.parametrize("alter", ALTERATIONS.values(), ids=ALTERATIONS)
def test_a_signed_manifest_passes_and_any_change_a_receiver_acts_on_is_refused(secret, alter):
    m = _manifest()
    signing.check_manifest(m)
    alter(m)
    with pytest.raises(signing.SignatureError, match="not the run's"):
        signing.check_manifest(m)


def test_an_unsigned_or_otherwise_signed_manifest_is_refused(secret):
    m = _manifest()
    m.signature = b""
    with pytest.raises(signing.SignatureError, match="version 7 is not signed"):
        signing.check_manifest(m)
    auth.set_secret("cd" * 32)
    other = _manifest()
    auth.set_secret(secret)
    with pytest.raises(signing.SignatureError, match="not the run's"):
        signing.check_manifest(other)


def test_the_commit_signature_covers_its_checksums_and_binds_them_to_their_manifest(secret):
    m = _manifest()
    commit = signing.sign_commit(m, Commit(("11", "22")))
    signing.check_commit(m, Commit.decode(commit.encode()))  # the signature survives the wire
    with pytest.raises(signing.SignatureError, match="checksums of version 7 are not signed"):
        signing.check_commit(m, Commit(("11", "22")))
    with pytest.raises(signing.SignatureError, match="not the run's"):
        signing.check_commit(m, Commit(("11", "23"), signature=commit.signature))
    with pytest.raises(signing.SignatureError, match="not the run's"):
        signing.check_commit(_manifest(version=8), commit)  # genuine checksums, under another genuine manifest


def test_without_a_secret_nothing_is_signed_or_checked():
    assert auth.current() is None
    m = _manifest()
    assert m.signature == b""
    signing.check_manifest(m)
    signing.check_commit(m, signing.sign_commit(m, Commit(("11",))))
