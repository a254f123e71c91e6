import pytest
import torch

from services.weightsync.kernels import checksum as cs
from services.weightsync.transfer import manifest as mf
from services.weightsync.transfer.pack import expected_tensor, new_ring, packed_buckets, unpack
from services.weightsync.transfer.plan import ALIGN_BYTES, ReceiverLayout, bucket_senders, layout_of, make_plan


def _named():
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 5, generator=g)),
        ("b", torch.randn(100, generator=g).to(torch.bfloat16)),
        ("c", torch.randint(0, 9, (7,), generator=g)),
        ("big", torch.randn(64, 64, generator=g)),
    ]


def _send(named, receiver=None, bucket_bytes=512, num_buffers=2):
    receiver = receiver or ReceiverLayout()
    plan = make_plan(layout_of(named), receiver, bucket_bytes)
    sums: list = []
    ring = new_ring(plan, torch.device("cpu"), num_buffers)
    buckets = [b.clone() for _, b in packed_buckets(plan, dict(named), ring, sums)]
    return plan, buckets, sums


@pytest.mark.parametrize("num_buffers", [1, 2, 3])
def test_pack_unpack_round_trip_is_bit_exact_through_the_wire_form(num_buffers):
    named = _named()
    plan, buckets, sums = _send(named, num_buffers=num_buffers)
    tensor_bytes = sum(t.numel() * t.element_size() for _, t in named)
    assert tensor_bytes <= plan.payload_bytes < tensor_bytes + ALIGN_BYTES * (len(named) + plan.num_buckets)
    assert plan.num_buckets >= 2  # "big" (16 KiB) exceeds a bucket: a bucket of its own
    assert sums == [cs.bucket_checksum(b, "xxh3") for b in buckets]
    received = mf.plan_of(mf.to_manifest(plan, 3, "xxh3"))
    out = dict(unpack(buckets, received))
    for name, t in named:
        assert out[name].dtype == t.dtype and torch.equal(out[name], t)


def test_plan_is_computed_once_per_layout_pair():
    named = _named()
    first = make_plan(layout_of(named), ReceiverLayout(), 512)
    assert make_plan(layout_of(named), ReceiverLayout(), 512) is first
    assert make_plan(layout_of(named), ReceiverLayout(cast_dtype="bfloat16"), 512) is not first


def test_sender_casts_and_fuses_for_the_receiver():
    g = torch.Generator().manual_seed(1)
    p = "model.layers.0"
    named = [
        (f"{p}.self_attn.q_proj.weight", torch.randn(8, 4, generator=g)),
        (f"{p}.self_attn.k_proj.weight", torch.randn(4, 4, generator=g)),
        (f"{p}.self_attn.v_proj.weight", torch.randn(4, 4, generator=g)),
        (f"{p}.mlp.gate_proj.weight", torch.randn(6, 4, generator=g)),
        (f"{p}.mlp.up_proj.weight", torch.randn(6, 4, generator=g)),
        ("steps", torch.arange(3)),
    ]
    plan, buckets, _ = _send(named, ReceiverLayout("bfloat16", ("qkv", "gate_up")))
    out = dict(unpack(buckets, plan))
    assert set(out) == {f"{p}.self_attn.qkv_proj.weight", f"{p}.mlp.gate_up_proj.weight", "steps"}
    qkv = out[f"{p}.self_attn.qkv_proj.weight"]
    assert qkv.dtype == torch.bfloat16 and qkv.shape == (16, 4)
    assert torch.equal(qkv[8:12], named[1][1].to(torch.bfloat16))
    assert out["steps"].dtype == torch.int64  # integers are never cast
    for s in plan.slots:
        assert torch.equal(out[s.name], expected_tensor(s, dict(named)))


def test_bad_layouts_are_value_errors_naming_the_choices():
    with pytest.raises(ValueError, match="bfloat16"):
        ReceiverLayout(cast_dtype="fp8")
    with pytest.raises(ValueError, match="gate_up"):
        ReceiverLayout(fuse=("qkvo",))


@pytest.mark.parametrize("algo", ["sum64", "xxh3"])
def test_checksums_change_with_any_byte_and_any_swap(algo):
    named = _named()
    _, buckets, sums = _send(named)
    named[1][1][7] += 1
    _, _, sums2 = _send(named)
    assert sums != sums2
    buf = buckets[0]
    base = cs.bucket_checksum(buf, algo)
    words = buf.view(torch.int64)
    for i, j in [(0, 1), (0, 8), (3, 17)]:  # same line, same column, neither
        swapped = words.clone()
        swapped[[i, j]] = swapped[[j, i]]
        assert torch.equal(swapped, words) or cs.bucket_checksum(swapped.view(torch.uint8), algo) != base
    flipped = buf.clone()
    flipped[5] ^= 1
    assert cs.bucket_checksum(flipped, algo) != base


def test_manifest_outside_its_bucket_is_rejected():
    plan, _, _ = _send(_named())
    m = mf.to_manifest(plan, 1, "blake2b")
    m.tensors[0].offset = m.buckets[0].nbytes
    with pytest.raises(ValueError, match="outside its bucket"):
        mf.plan_of(m)


@pytest.mark.parametrize("num_senders", [1, 2, 3, 5])
def test_bucket_senders_give_each_rank_one_contiguous_run_of_about_equal_bytes(num_senders):

    sizes = tuple([64 * k for k in (5, 1, 9, 3, 3, 7, 2, 8, 4, 6)])
    senders = bucket_senders(sizes, num_senders)
    assert list(senders) == sorted(senders) and set(senders) <= set(range(num_senders))
    share = [sum(n for n, r in zip(sizes, senders) if r == k) for k in range(num_senders)]
    # No rank is more than one bucket away from an equal share.
    assert max(share) - sum(sizes) / num_senders <= max(sizes)
    if num_senders <= len(sizes) // 2:
        assert all(share), share  # with enough buckets every rank sends some


def test_one_sender_sends_every_bucket():

    assert bucket_senders((64, 128, 64), 1) == (0, 0, 0)
    with pytest.raises(ValueError, match="num_senders"):
        bucket_senders((64,), 0)


def test_a_senders_share_packs_exactly_those_buckets_as_the_whole_plan_does():
    named = _named()
    plan = make_plan(layout_of(named), ReceiverLayout(), 256)
    assert plan.num_buckets >= 3
    whole_sums: list = []
    whole = {
        i: buf.clone()
        for i, buf in packed_buckets(plan, dict(named), new_ring(plan, torch.device("cpu"), 2), whole_sums)
    }
    share, share_sums = [0, plan.num_buckets - 1], []
    got = {
        i: buf.clone()
        for i, buf in packed_buckets(
            plan, dict(named), new_ring(plan, torch.device("cpu"), 2), share_sums, indices=share
        )
    }
    assert list(got) == share
    assert all(torch.equal(got[i], whole[i]) for i in share)
    assert share_sums == [whole_sums[i] for i in share]


def test_the_commit_orders_every_senders_checksums_by_bucket_and_round_trips_as_bytes():
    from services.weightsync.transfer.commit import Commit

    commit = Commit.of_shares([([0, 1], ["a", "b"], ""), ([2], ["c"], "")], 3)
    assert commit.bucket_checksums == ("a", "b", "c") and commit.checksum == cs.combine(["a", "b", "c"])
    assert Commit.decode(commit.encode()) == commit
    failed = Commit.of_shares([([0], ["a"], ""), ([1], [], "sender rank 1: boom")], 2)
    assert failed.error == "sender rank 1: boom" and not failed.bucket_checksums and not failed.checksum
