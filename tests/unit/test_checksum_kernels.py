"""The Triton sum64 kernels give exactly torch's values: under Triton's interpreter on CPU (a subprocess,
since the interpreter is chosen when the kernels are defined), and compiled on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.weightsync.kernels import checksum as cs
from services.weightsync.transfer.pack import pack_into, pack_sum64, pack_version, unpack
from services.weightsync.transfer.plan import ReceiverLayout, layout_of, make_plan

ROOT = Path(__file__).resolve().parents[2]
TILE = 256 * 64  # sum64_triton.BLOCK_LINES lines of 64 bytes
SIZES = [64, 640, TILE - 64, TILE, TILE + 64, 3 * TILE + 1984]


def _kernels(device: torch.device):
    kernels = cs.kernels_for(torch.empty(0, device=device))
    assert kernels is not None, "the checks must run the kernels, not the torch reference"
    return kernels


def _random_bytes(nbytes: int, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)  # full-range words: every sum wraps around 2**64
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).to(device)


def check_sum64_and_copy(device: torch.device) -> None:
    kernels = _kernels(device)
    for seed, nbytes in enumerate(SIZES):
        buf = _random_bytes(nbytes, device, seed)
        want = cs.sum64_reference(buf)
        assert torch.equal(kernels.sum64(buf), want), nbytes
        out = torch.full_like(buf, 7)
        assert torch.equal(kernels.copy_sum64(buf, out), want), nbytes
        assert torch.equal(out, buf), nbytes


def check_pieces_add_up_to_the_bucket(device: torch.device) -> None:
    """One launch over pieces at line offsets, some not whole lines, some copied, some summed in place,
    some zeroed over garbage, the rest zero: the bucket's reference value, and the bytes as asked."""
    kernels = _kernels(device)
    bucket = torch.zeros(3 * TILE + 4096, dtype=torch.uint8, device=device)
    spans = [(0, 8), (64, 1992), (2112, TILE + 56), (TILE + 2176, TILE + 1920), (2 * TILE + 4096, TILE)]
    pieces = []
    for i, (offset, nbytes) in enumerate(spans):
        dst = bucket[offset : offset + nbytes].view(torch.int64)
        data = _random_bytes(nbytes, device, 10 + i).view(torch.int64)
        if i == 4:  # padding: garbage the kernel must zero
            dst.copy_(data)
            pieces.append((None, dst, offset // 64, kernels.ZERO))
        elif i % 2:
            pieces.append((data, dst, offset // 64, kernels.COPY))
        else:
            dst.copy_(data)
            pieces.append((None, dst, offset // 64, kernels.SUM))
    got = kernels.sum64_pieces(pieces)
    assert torch.equal(got, cs.sum64_reference(bucket))
    assert torch.equal(pieces[1][1], pieces[1][0]) and torch.equal(pieces[3][1], pieces[3][0])
    assert not pieces[4][1].any()


def check_pack_sum64_matches_pack_then_sum(device: torch.device) -> None:
    """Buckets with fused, cast, partial-line, strided and fallback pieces, packed over garbage."""
    g = torch.Generator().manual_seed(3)
    p = "model.layers"
    named = [
        (f"{p}.0.self_attn.q_proj.weight", torch.randn(32, 16, generator=g)),  # fused at line offsets
        (f"{p}.0.self_attn.k_proj.weight", torch.randn(16, 16, generator=g)),
        (f"{p}.0.self_attn.v_proj.weight", torch.randn(16, 16, generator=g)),
        ("norm", torch.randn(36, generator=g).to(torch.bfloat16)),  # 9 words: not whole lines
        ("steps", torch.arange(5)),  # int64, never cast
        ("strided", torch.randn(40, 20, generator=g).to(torch.bfloat16).t()),  # not contiguous
        ("emb", torch.randn(300, 40, generator=g).to(torch.bfloat16)),  # two tiles
        (f"{p}.1.self_attn.q_proj.weight", torch.randn(3, 4, generator=g)),  # k starts inside a line
        (f"{p}.1.self_attn.k_proj.weight", torch.randn(2, 4, generator=g)),
        (f"{p}.1.self_attn.v_proj.weight", torch.randn(2, 4, generator=g)),
    ]
    lookup = {n: t.to(device) for n, t in named}
    for receiver in (ReceiverLayout(fuse=("qkv",)), ReceiverLayout("bfloat16", ("qkv",))):
        plan = make_plan(layout_of(list(lookup.items())), receiver, 4096)
        assert plan.num_buckets >= 3
        for i, size in enumerate(plan.bucket_nbytes):
            fused = torch.full((size,), 0xA5, dtype=torch.uint8, device=device)
            two_step = torch.full((size,), 0x5A, dtype=torch.uint8, device=device)
            got = pack_sum64(fused, plan, i, lookup)
            pack_into(two_step, plan, i, lookup)
            assert torch.equal(fused, two_step), (receiver, i)
            assert torch.equal(got, cs.sum64_reference(two_step)), (receiver, i)
        # The whole version in one launch: the same bytes and sums, bucket by bucket.
        ring = [
            torch.full((max(plan.bucket_nbytes),), 0xC3, dtype=torch.uint8, device=device) for _ in plan.bucket_nbytes
        ]
        packed = pack_version(ring, plan, lookup, list(range(plan.num_buckets)))
        for i, size in enumerate(plan.bucket_nbytes):
            two_step = torch.empty(size, dtype=torch.uint8, device=device)
            pack_into(two_step, plan, i, lookup)
            assert torch.equal(ring[i][:size], two_step), (receiver, i)
            assert torch.equal(packed.bucket_sums[i], cs.sum64_reference(two_step)), (receiver, i)
        # Each tensor the kernel packed piece by piece carries the checksum its read-back will compute.
        tensors = packed.slot_digests()
        assert tensors or cs.kernels_for(ring[0]) is None
        assert tensors == cs.tensor_digests(unpack(ring, plan, [s for s in plan.slots if s.name in tensors]), "sum64")


def check_cast_to_bf16_rounds_as_torch(device: torch.device) -> None:
    """fp32 sources cast to bf16 inside the kernel: torch's bytes for ties, halfway cases, infinities,
    subnormals, signed zeros and extremes (NaN excepted: torch's own CPU and CUDA casts differ there)."""
    special = torch.tensor(
        [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 3.4e38, -3.4e38, 1e-40, -1e-40, 1e-45, 2.0**-126]
    )
    ties = (torch.arange(1, 21, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)  # exact halves, odd and even
    g = torch.Generator().manual_seed(5)
    values = torch.cat([special, ties, -ties, torch.randn(4096 - 52, generator=g) * 1e3]).reshape(64, 64)
    lookup = {"w": values.to(device)}
    plan = make_plan(layout_of(list(lookup.items())), ReceiverLayout("bfloat16"), 1 << 20)
    buf = torch.zeros(plan.bucket_nbytes[0], dtype=torch.uint8, device=device)
    pack_sum64(buf, plan, 0, lookup)
    assert torch.equal(buf[: values.numel() * 2].view(torch.bfloat16).cpu(), values.to(torch.bfloat16).reshape(-1))


def check_readback_sums_in_one_launch_are_each_tensors_own(device: torch.device) -> None:
    """Read-back checksums of many tensors in one launch: each is the torch reference of that tensor's bytes,
    zero-padded to whole lines, as computed alone; tensors not whole words take the one-by-one path."""
    _kernels(device)
    g = torch.Generator().manual_seed(4)
    named = [
        ("tile", torch.randn(TILE // 4 - 2, generator=g)),  # 8 bytes short of a tile: whole words, not lines
        ("bf16_rows", torch.randn(300, 40, generator=g).to(torch.bfloat16)[1:]),  # a view at an offset, two tiles
        ("odd_bytes", torch.randn(7, generator=g).to(torch.bfloat16)),  # 14 bytes: not whole words
        ("strided", torch.randn(40, 20, generator=g).t()),
        ("steps", torch.arange(5)),
        ("empty", torch.zeros(0)),
    ]
    named = [(n, t.to(device)) for n, t in named]
    got = cs.tensor_digests(named, "sum64")
    for name, t in named:
        b = t.contiguous().reshape(-1).view(torch.uint8).cpu()
        padded = torch.zeros(-(-b.numel() // 64) * 64, dtype=torch.uint8)
        padded[: b.numel()] = b
        assert got[name] == cs.sum64_hex(cs.sum64_reference(padded)), name


CHECKS = [
    check_sum64_and_copy,
    check_pieces_add_up_to_the_bucket,
    check_pack_sum64_matches_pack_then_sum,
    check_cast_to_bf16_rounds_as_torch,
    check_readback_sums_in_one_launch_are_each_tensors_own,
]


def test_kernels_match_torch_under_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout + r.stderr


def test_pack_sum64_without_kernels_is_pack_then_the_torch_reference():
    if cs.kernels_for(torch.empty(0)) is not None:
        pytest.skip("TRITON_INTERPRET=1 is set")
    check_pack_sum64_matches_pack_then_sum(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_kernels_match_torch_on_cuda(check):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    check(torch.device("cuda"))


if __name__ == "__main__":
    for check in CHECKS:
        check(torch.device("cpu"))
        print(check.__name__, "ok", flush=True)
    print("all checks passed")
