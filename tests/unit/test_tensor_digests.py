"""Tensor digests (the read-back checks): the same bytes give the same digest whatever their storage, and one changed
element changes it, for both families (sum64 where the buckets use it, blake2b otherwise)."""

from __future__ import annotations

import pytest
import torch

from services.weightsync.kernels import checksum as cs


@pytest.mark.parametrize("algo", ["sum64", "xxh3"])
def test_tensor_digests_see_every_element_and_not_the_storage(algo):
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3, 1000, generator=g).to(torch.bfloat16)  # 6000 bytes: not whole 64-byte lines
    named = [("a", big[1]), ("b", torch.randn(32, generator=g)), ("c", torch.tensor([7], dtype=torch.int64))]
    want = cs.tensor_digests(named, algo)
    assert set(want) == {"a", "b", "c"} and len(set(want.values())) == 3
    # The same values elsewhere (a copy, not a view at an odd offset) give the same digests.
    assert cs.tensor_digests([(n, t.clone()) for n, t in named], algo) == want
    for i in (0, 499, 999):  # first, middle and last element of the unaligned view
        changed = big[1].clone()
        changed[i] += 1
        assert cs.tensor_digests([("a", changed)], algo)["a"] != want["a"], i
