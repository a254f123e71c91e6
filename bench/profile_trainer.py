"""One profiled Megatron training step on one GPU, same model and batch as bench/megatron_vs_fsdp2.py: the
kernel table behind the step-time breakdown in bench/README.md (printed, sorted by GPU time).

    python bench/profile_megatron.py --models 1p5b
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import megatron_vs_fsdp2 as mvf  # bench/: its arguments, weights and engine
import torch
import trainer as bt
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    args = mvf.parse_args()
    device = bt.pick_device()
    bt.init_distributed(device)
    shape = args.models.split(",")[0]
    seqs, advantages, rollout = bt.rl_batch(args, bt.QWEN2["vocab_size"])
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        mvf.save_hf(shape, Path(tmp), device)
        engine = mvf.megatron_engine(Path(tmp), args, device, mvf.MEGATRON_VARIANTS["megatron"])
    for _ in range(args.warmup + 1):  # compiled kernels and the allocator settle first
        engine.train(seqs, advantages, rollout)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.train(seqs, advantages, rollout)
        torch.cuda.synchronize(device)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
