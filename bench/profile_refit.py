"""Where one CUDA IPC refit's time goes, stage by stage, in one process on one GPU (no second process, no
store): each stage's GPU time and the host time it took to enqueue it, against a plain copy of the
same bytes. The numbers behind the fixed-cost analysis in bench/README.md's weightsync section.

    python bench/profile_refit.py                       # Qwen2-0.5B and Llama-8B shapes, 2 GiB buckets
    python bench/profile_refit.py --shapes llama-8b --bucket-bytes 1073741824
    python bench/profile_refit.py --shapes qwen2-1.5b --bucket-bytes 268435456 --fp32  # a trainer's fp32 masters
"""

from __future__ import annotations

import argparse
import time

import torch
import weightsync as bw  # bench/: the state-dict shapes

from services.weightsync.kernels import checksum as cs
from services.weightsync.transfer.pack import pack_into, pack_sum64, pack_version, unpack
from services.weightsync.transfer.plan import ReceiverLayout, layout_of, make_plan


def timed(fn, reps: int) -> tuple[float, float]:
    """(best GPU-inclusive seconds, host seconds of that repetition) after one warm-up call."""
    fn()
    best = (float("inf"), 0.0)
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start, host))
    return best


def stages(shape: str, bucket_bytes: int, num_buffers: int, fp32: bool) -> tuple[dict, dict]:
    """The refit's stages as callables by name, and the payload's size, bucket and tensor counts. With fp32
    the trainer's tensors are fp32 and go out as bf16 (cast while packing)."""
    device = torch.device("cuda", 0)
    named = [(n, t.float() if fp32 else t) for n, t in bw.random_state(shape, device)]
    lookup = dict(named)
    plan = make_plan(layout_of(named), ReceiverLayout("bfloat16"), bucket_bytes)
    ring = [torch.empty(max(plan.bucket_nbytes), dtype=torch.uint8, device=device) for _ in range(num_buffers)]
    whole = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.bucket_nbytes]
    every = list(range(plan.num_buckets))
    received = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.bucket_nbytes]
    engine = {n: torch.empty_like(t, dtype=torch.bfloat16) for n, t in named}
    views = unpack(received, plan)
    flat = torch.empty(sum(plan.bucket_nbytes), dtype=torch.uint8, device=device)
    flat_out = torch.empty_like(flat)

    def each_bucket(fn):
        return lambda: [fn(i, ring[i % num_buffers][: plan.bucket_nbytes[i]]) for i in range(plan.num_buckets)]

    rows = {
        "pack with checksum (sender)": each_bucket(lambda i, buf: pack_sum64(buf, plan, i, lookup)),
        "pack without checksum": each_bucket(lambda i, buf: pack_into(buf, plan, i, lookup)),
        "pack whole version, one launch": lambda: pack_version(whole, plan, lookup, every),
        "bucket sums, one launch + sync": lambda: cs.tensor_digests(
            [(str(i), b) for i, b in enumerate(whole)], "sum64"
        ),
        "read-back sums, every tensor + sync": lambda: cs.tensor_digests(views, "sum64"),
        "copy out with checksum (receiver)": each_bucket(lambda i, buf: cs.copy_sum64(buf, received[i])),
        "engine copy, per tensor": lambda: [engine[n].copy_(v) for n, v in views],
        "plain copy of the bytes": lambda: flat_out.copy_(flat),
    }
    return rows, {"GB": sum(plan.bucket_nbytes) / 1e9, "buckets": plan.num_buckets, "tensors": len(named)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["qwen2-0.5b", "llama-8b"], choices=sorted(bw.SHAPES))
    p.add_argument("--bucket-bytes", type=int, default=2**31)
    p.add_argument("--num-buffers", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fp32", action="store_true", help="fp32 trainer tensors, cast to bf16 while packing")
    args = p.parse_args()
    for shape in args.shapes:
        rows, meta = stages(shape, args.bucket_bytes, args.num_buffers, args.fp32)
        print(f"{shape}: {meta['GB']:.2f} GB in {meta['buckets']} buckets, {meta['tensors']} tensors")
        for name, fn in rows.items():
            seconds, host = timed(fn, args.reps)
            per_gb = seconds * 1e3 / meta["GB"]
            print(f"  {name:36s} {seconds * 1e3:8.2f} ms  {per_gb:6.3f} ms/GB  host {host * 1e3:7.2f} ms")
        del rows
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
