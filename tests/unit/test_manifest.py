import torch

from services.weightsync import manifest as mf


def _named():
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 5, generator=g)),
        ("b", torch.randn(100, generator=g).to(torch.bfloat16)),
        ("c", torch.randint(0, 9, (7,), generator=g)),
        ("big", torch.randn(64, 64, generator=g)),
    ]


def test_pack_unpack_round_trip_is_bit_exact_with_dtypes_and_shapes():
    named = _named()
    manifest, buckets = mf.build(named, policy_version=3, bucket_bytes=512)
    tensor_bytes = sum(t.numel() * t.element_size() for _, t in named)
    assert tensor_bytes <= manifest.payload_bytes < tensor_bytes + mf.ALIGN_BYTES * len(named)
    assert len(buckets) == len(manifest.buckets) >= 2  # "big" (16 KiB) exceeds a bucket: a bucket of its own
    out = dict(nt for i, b in enumerate(buckets) for nt in mf.unpack_bucket(b, list(manifest.tensors), i))
    for name, t in named:
        assert out[name].dtype == t.dtype and torch.equal(out[name], t)


def test_checksum_changes_with_any_byte():
    named = _named()
    m1, _ = mf.build(named, 1, 512)
    named[1][1][7] += 1
    m2, _ = mf.build(named, 1, 512)
    assert m1.checksum != m2.checksum
    assert [b.checksum for b in m1.buckets] != [b.checksum for b in m2.buckets]
