"""One profiled training step on one GPU, same model and batch as bench/megatron_vs_fsdp2.py, either
backend: the step's wall time, the summed kernel time (well below it: the host keeps the GPU waiting)
and the kernel table behind the step-time breakdowns in bench/README.md, sorted by GPU time.

    python bench/profile_trainer.py --models 1p5b --backend fsdp2
    python bench/profile_trainer.py --models 1p5b --backend megatron
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import megatron_vs_fsdp2 as mvf  # bench/: its arguments, weights and engines
import torch
import trainer as bt
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    p = mvf.parser(__doc__)
    p.add_argument("--backend", choices=("fsdp2", "megatron"), default="megatron")
    args = p.parse_args()
    device = bt.pick_device()
    bt.init_distributed(device)
    shape = args.models.split(",")[0]
    seqs, advantages, rollout = bt.rl_batch(args, bt.QWEN2["vocab_size"])
    if args.backend == "fsdp2":
        options = {**bt.VARIANTS[args.fsdp2_variant], "max_tokens_per_microbatch": args.max_tokens}
        engine, _ = bt.build_engine(shape, device, {**options, "dtype": args.dtype})
    else:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            mvf.save_hf(shape, Path(tmp), device)
            engine = mvf.megatron_engine(Path(tmp), args, device, mvf.MEGATRON_VARIANTS["megatron"])
    for _ in range(args.warmup + 1):  # compiled kernels and the allocator settle first
        engine.train(seqs, advantages, rollout)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.train(seqs, advantages, rollout)
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    table = prof.key_averages()
    # Kernels on several streams overlap, so their sum can exceed the wall time: near 100 % or above, the
    # GPU never waited on the host.
    kernels = sum(e.self_device_time_total for e in table if e.device_type == DeviceType.CUDA) / 1e6
    share = f"{kernels:.3f} s ({kernels / wall:.0%})"
    print(f"{args.backend} {shape}: step {wall:.3f} s under the profiler, kernel time {share}")
    print(table.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
