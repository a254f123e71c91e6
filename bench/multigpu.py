"""A GRPO run on all GPUs of one host: trainer FSDP2 on half, transformers engines on the other half.

    python bench/multigpu.py [--steps 4] [--hidden 1536 --layers 28 ...]
    python bench/multigpu.py --colocated     # one GPU: trainer and engine share it, CUDA IPC refit

Writes bench/results/multigpu/multigpu.json (--colocated: multigpu_colocated.json): the seeds' table per step,
refit GB/s against the physical baseline measured in the same run (the NCCL GPU0 -> GPU1 broadcast;
colocated, a plain device-to-device copy), tokens/s per GPU, and peak memory per GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import stamp  # noqa: E402 - bench/ is this script's own folder


def _link_worker(rank: int, port: int, nbytes: int, reps: int, out: dict) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        dist.broadcast(buf, src=0)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        dist.broadcast(buf, src=0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if rank == 0:
        out["GBps"] = nbytes / min(times) / 1e9
    dist.destroy_process_group()


def nccl_link_GBps(nbytes: int = 2**30, reps: int = 10) -> float:
    """Best-of-reps broadcast bandwidth GPU0 -> GPU1, the physical baseline for refit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_link_worker, args=(port, nbytes, reps, out), nprocs=2, join=True)
        return out["GBps"]


class GpuMemorySampler:
    """Peak memory.used per GPU from nvidia-smi, sampled every 0.5 s while the run goes on."""

    def __init__(self):
        self.peak_MiB: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            for line in subprocess.run(query, capture_output=True, text=True).stdout.splitlines():
                index, used = (int(x) for x in line.split(","))
                self.peak_MiB[index] = max(self.peak_MiB.get(index, 0), used)
            self._stop.wait(0.5)


def hbm_copy_GBps(nbytes: int = 2**30, reps: int = 10) -> float:
    """Best-of-reps device-to-device copy on GPU0 (bytes copied per second): the colocated refit's floor."""
    src, dst = (torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(2))
    times = []
    for _ in range(reps + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / min(times[2:]) / 1e9


def run_grpo(args, num_gpus: int, work: Path) -> Path:
    half = max(1, num_gpus // 2)
    rollout = ["rollout.num_workers=1", 'weightsync.transport="cuda_ipc"'] if args.colocated else [
        f"rollout.num_workers={num_gpus - half}"
    ]  # fmt: skip
    overrides = [
        f'run.output_dir="{work}"',
        'run.run_id="multigpu"',
        f"run.num_steps={args.steps}",
        f'model.path="{work / "model"}"',
        "model.create=true",
        "coordinator.ignore_eos=true",  # every response max_tokens long: the same work in every run
        f"model.hidden_size={args.hidden}",
        f"model.num_layers={args.layers}",
        f"model.num_heads={args.heads}",
        f"model.num_kv_heads={args.kv_heads}",
        f"model.intermediate_size={args.intermediate}",
        "rollout.engine=hf",
        *rollout,
        f"trainer.num_ranks={half}",
        f"coordinator.num_prompts={args.prompts}",
        f"coordinator.num_samples={args.samples}",
        f"coordinator.max_tokens={args.max_tokens}",
        "trainer.max_tokens_per_microbatch=16384",
        # bf16 compute over fp32 master weights; the engines hold bf16, so refit sends bf16.
        'trainer.dtype="bfloat16"',
        'trainer.fsdp2.attn_implementation="sdpa_varlen"',
        'weightsync.cast_dtype="bfloat16"',
        "weightsync.timeout_s=600",
        *([f"weightsync.bucket_bytes={args.bucket_bytes}"] if args.bucket_bytes else []),
    ]
    subprocess.run([sys.executable, "-m", "deploy.local", *overrides], cwd=ROOT, check=True, timeout=1800)
    return work / "multigpu"


def summarize(run_dir: Path, num_gpus: int, link: tuple[str, float], peak_MiB: dict[int, int], args) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = (
        "step",
        "timing/total_s",
        "timing/policy_training_s",
        "timing/refit_s",
        "timing/generation_s",
        "timing/logprobs_s",
        "avg_generated_tokens",
        "reward/mean",
        "mismatch/mult_prob_error",
        "refit/GBps",
        "throughput/tokens_per_s_per_gpu",
        "peak_mem_GiB",
    )
    table = [{k: r.get(k) for k in keys} for r in rows]
    # Where each refit's seconds went (refits.jsonl): the trainer's gather, its publish, each engine's load.
    refits = {r["step"]: r for r in map(json.loads, (run_dir / "refits.jsonl").read_text().splitlines())}
    for row in table:
        r = refits.get(row["step"], {})
        row["refit_breakdown"] = {k: r.get(k) for k in ("gather_s", "publish_s", "apply_s")}
    steady = rows[1:] or rows  # the first step carries warm-up (allocator, NCCL communicators)
    refit_GBps = sum(r["refit/GBps"] for r in steady) / len(steady)
    tokens = sum(r["num_tokens"] for r in steady)
    return {
        **stamp(),
        "model": vars(args),
        "num_gpus": num_gpus,
        "steps": table,
        link[0]: link[1],
        "refit_GBps": refit_GBps,
        "refit_frac_of_link": refit_GBps / link[1],
        "refit_bytes": rows[-1]["refit/bytes"],
        # Whole-step throughput: every GPU counted, tokens trained per second of step wall time.
        "tokens_per_s_per_gpu_step": tokens / sum(r["timing/total_s"] for r in steady) / num_gpus,
        "trainer_tokens_per_s_per_gpu": sum(r["throughput/tokens_per_s_per_gpu"] for r in steady) / len(steady),
        "peak_mem_GiB_per_gpu": {str(k): v / 1024 for k, v in sorted(peak_MiB.items())},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=8960)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--colocated", action="store_true", help="one GPU: trainer and engine on it, CUDA IPC refit")
    p.add_argument("--bucket-bytes", type=int, default=0, help="weightsync.bucket_bytes; 0 = the config's default")
    p.add_argument("--work", default="/tmp/multigpu")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.out = args.out or str(
        ROOT / "bench" / "results" / "multigpu" / f"multigpu{'_colocated' if args.colocated else ''}.json"
    )
    num_gpus = 1 if args.colocated else torch.cuda.device_count()
    if num_gpus < 2 and not args.colocated:
        raise SystemExit(f"needs >= 2 GPUs, found {num_gpus} (or --colocated)")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    link = ("hbm_copy_GBps", hbm_copy_GBps()) if args.colocated else ("nccl_link_GBps", nccl_link_GBps())
    print(f"{link[0]}: {link[1]:.1f} GB/s", flush=True)
    with GpuMemorySampler() as mem:
        run_dir = run_grpo(args, num_gpus, Path(args.work))
    result = summarize(run_dir, num_gpus, link, mem.peak_MiB, args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
