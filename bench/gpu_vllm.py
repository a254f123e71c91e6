"""Colocated GRPO on one GPU with CUDA vLLM against the transformers engine, same batch, same run.

    python bench/gpu_vllm.py [--steps 4 --prompts 8 --samples 8 --max-tokens 128] [--rollout-json R.json]
                             [--model-dir DIR]

Each variant is `make run`'s launcher (deploy.local) with a Qwen2-1.5B-shaped random model (hidden 1536, 28 layers,
12 heads, 2 KV heads, intermediate 8960; the char vocabulary makes it 1.31B parameters), an FSDP2 trainer on one
rank (bf16 compute over fp32 masters) and one rollout worker on the same GPU, CUDA IPC refit: `vllm`
(rollout.gpu.sleep_level=0: the engine keeps its memory), `vllm_sleep` (sleep_level=1: weights offloaded and KV
cache freed while the trainer trains), `hf` (rollout.engine=hf), `vllm_fp32_trainer` (`vllm` with the trainer
computing in fp32), `vllm_bf16_head` (`vllm` with the lm_head in bf16 on both sides, model.lm_head_fp32=false) and
`vllm_custom_ops` (`vllm` with vLLM's CUDA kernels for its custom ops, rollout.gpu.custom_ops=["all"]).
It writes the seeds' table per step of each, the refit's seconds per GB (services included, verified), the
engine's own load time from its log, peak memory (the trainer's per step; the GPU's from nvidia-smi), and, from
--rollout-json (bench/rollout.py on the same machine), raw vLLM tokens/s and the service's share of it. Writes
bench/results/gpu_vllm/gpu_vllm.json (or --out) after every variant. --model-dir runs a pretrained model instead
(SmolLM2-135M-Instruct, carried to the GPU machine in bf16: its real 49k vocabulary is where the lm_head's precision
shows).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from multigpu import GpuMemorySampler, hbm_copy_GBps  # noqa: E402
from provenance import stamp  # noqa: E402 - bench/ is this script's own folder

VARIANTS = {
    "vllm": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0"],
    "vllm_sleep": ["rollout.engine=vllm", "rollout.gpu.sleep_level=1"],
    "hf": ["rollout.engine=hf"],
    # The trainer computing in fp32 (the config's default) against vLLM's bf16: the mismatch floor of the engine.
    "vllm_fp32_trainer": ["rollout.engine=vllm", 'trainer.dtype="float32"'],
    # `vllm` with both sides' lm_head in bf16 (model.lm_head_fp32=false): the mismatch that fp32 logits remove.
    "vllm_bf16_head": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", "model.lm_head_fp32=false"],
    # `vllm` with vLLM's hand-written CUDA kernels for its custom ops (silu_and_mul, rotary embedding, ...) instead
    # of Inductor's fusions of their native forms, which keep fp32 between ops where the trainer's eager bf16 rounds.
    "vllm_custom_ops": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", 'rollout.gpu.custom_ops=["all"]'],
    # `vllm` with responses that end at the model's EOS (the others all run max_tokens, past any EOS, for equal work):
    # the mismatch on what a pretrained model actually writes, not on its continuation after it is done.
    "vllm_eos": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", "coordinator.ignore_eos=false"],
    "vllm_eos_fp32_trainer": ["rollout.engine=vllm", "coordinator.ignore_eos=false", 'trainer.dtype="float32"'],
    # `vllm` with each response packed with its own copy of the prompt (trainer.fsdp2.share_prompts=false).
    "vllm_unshared": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", "trainer.fsdp2.share_prompts=false"],
    # Asynchronous GRPO (coordinator.max_staleness = eta): the worker generates while the trainer trains on the same
    # GPU, and loads each refit between two decode steps (in-flight updates); `vllm` is its synchronous baseline.
    "vllm_async_1": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", "coordinator.max_staleness=1"],
    "vllm_async_2": ["rollout.engine=vllm", "rollout.gpu.sleep_level=0", "coordinator.max_staleness=2"],
}
ASYNC_KEYS = ("async/staleness_mean", "async/trainer_idle_s", "async/rollout_idle_s", "async/rollout_pause_s")
APPLIED = re.compile(
    r"version (\d+) applied in ([\d.]+)s: received and verified ([\d.]+)s, waited for the engine ([\d.]+)s, "
    r"loaded ([\d.]+)s, read back (\d+) tensors ([\d.]+)s"
)
# The vLLM engine's split of a load (services/rollout/vllm_engine.py): the copy into the engine, the prefix cache reset.
LOAD_SPLIT = re.compile(r"load: copy ([\d.]+)s, prefix cache reset ([\d.]+)s")
# One line per refit and side (services/weightsync/transfer/timing.py): the trainer's "refit <id>: ..." and the
# worker's "version <n>: ...", each "what +<ms>ms, ... (from <wall clock start>)".
MARKS = re.compile(r"(refit [0-9a-f]+|version \d+): ((?:[\w ]+ \+[\d.]+ms, )*[\w ]+ \+[\d.]+ms) \(from ([\d.]+)\)")


def refit_marks(log: str) -> list[dict]:
    """Each refit's moments on one side, in ms after its start, and the start's wall clock time."""
    out = []
    for who, steps, wall in MARKS.findall(log):
        marks = {what: float(ms) for what, ms in re.findall(r"([\w ]+) \+([\d.]+)ms", steps)}
        out.append({"refit": who, "from": float(wall), **{k.strip(): v for k, v in marks.items()}})
    return out


QWEN2_1_5B_SHAPE = [
    "model.hidden_size=1536",
    "model.num_layers=28",
    "model.num_heads=12",
    "model.num_kv_heads=2",
    "model.intermediate_size=8960",
]
"""The random model of the GPU benchmarks: Qwen2-1.5B's shape (1.31B with the character vocabulary)."""


def run_variant(name: str, args, work: Path) -> Path:
    overrides = [
        f'run.output_dir="{work}"',
        f'run.run_id="{name}"',
        f"run.num_steps={args.steps}",
        *(
            [f'model.path="{args.model_dir}"', "model.create=false"]
            if args.model_dir
            else [f'model.path="{work / "model"}"', "model.create=true", *QWEN2_1_5B_SHAPE]
        ),
        "coordinator.ignore_eos=true",  # every response max_tokens long: the same work for both engines
        f"coordinator.num_prompts={args.prompts}",
        f"coordinator.num_samples={args.samples}",
        f"coordinator.max_tokens={args.max_tokens}",
        f"rollout.max_num_seqs={args.prompts * args.samples}",
        "trainer.num_ranks=1",
        "trainer.max_tokens_per_microbatch=16384",
        'trainer.dtype="bfloat16"',  # bf16 compute over fp32 master weights
        'trainer.fsdp2.attn_implementation="sdpa_varlen"',
        'weightsync.transport="cuda_ipc"',
        "weightsync.timeout_s=600",
        *VARIANTS[name],
        *([f"rollout.gpu.gpu_memory_utilization={args.gpu_memory_utilization}"] if name != "hf" else []),
    ]
    subprocess.run([sys.executable, "-m", "deploy.local", *overrides], cwd=ROOT, check=True, timeout=1800)
    return work / name


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(run_dir: Path, peak_MiB: dict[int, int], wall_s: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/total_s" in r]
    keys = (
        "step", "timing/total_s", "timing/policy_training_s", "timing/refit_s", "timing/generation_s",
        "timing/logprobs_s", "avg_generated_tokens", "mismatch/mult_prob_error", "refit/bytes", "refit/GBps",
        "peak_mem_GiB", "rollout/peak_mem_GiB", *ASYNC_KEYS,
    )  # fmt: skip
    table = [{k: r.get(k) for k in keys} for r in rows]
    refits = {r["step"]: r for r in map(json.loads, (run_dir / "refits.jsonl").read_text().splitlines())}
    for row in table:
        r = refits.get(row["step"], {})
        row["refit_breakdown"] = {k: r.get(k) for k in ("gather_s", "publish_s", "apply_s", "num_readback_verified")}
    log = (run_dir / "logs" / "rollout-0.log").read_text()
    trainer_log = run_dir / "logs" / "trainer.log"
    marks = {
        "trainer": refit_marks(trainer_log.read_text()) if trainer_log.exists() else [],
        "rollout": refit_marks(log),
    }
    applied = [
        dict(zip(("version", "apply_s", "receive_s", "wait_s", "load_s", "readback_n", "readback_s"), map(float, m)))
        for m in APPLIED.findall(log)
    ]
    load_split = [{"copy_s": float(c), "reset_s": float(r)} for c, r in LOAD_SPLIT.findall(log)]
    steady = rows[1:] or rows  # the first step carries the one-time costs (kernels, IPC handles)
    nbytes = rows[-1]["refit/bytes"]
    refit_s = _mean([r["timing/refit_s"] for r in steady])
    load_s = _mean([a["load_s"] for a in applied[1:] or applied])
    # One worker, one refit a step: a step's pause is that refit's, 0 where it landed while no generation ran (it
    # paused nothing, and is left out of the median).
    pauses = [r["async/rollout_pause_s"] for r in steady if r.get("async/rollout_pause_s")]
    return {
        "steps": table,
        "engine_applied": applied,
        "engine_load_split": load_split,
        "refit_marks": marks,
        "step_s": _mean([r["timing/total_s"] for r in steady]),
        "step_s_median": statistics.median(r["timing/total_s"] for r in steady),
        "rollout_pause_s_median": statistics.median(pauses) if pauses else None,
        "rollout_pause_s_inflight": pauses,
        "rollout_idle_s": _mean([r.get("async/rollout_idle_s", 0.0) for r in steady]),
        "trainer_idle_s": _mean([r.get("async/trainer_idle_s", 0.0) for r in steady]),
        "generation_s": _mean([r["timing/generation_s"] for r in steady]),
        "policy_training_s": _mean([r["timing/policy_training_s"] for r in steady]),
        "refit_s": refit_s,
        "refit_bytes": nbytes,
        "refit_ms_per_GB": refit_s * 1e3 / (nbytes / 1e9),
        "engine_load_ms_per_GB": None if load_s is None else load_s * 1e3 / (nbytes / 1e9),
        "avg_generated_tokens": _mean([r["avg_generated_tokens"] for r in steady]),
        "mult_prob_error_max": max(r["mismatch/mult_prob_error"] for r in rows),
        "trainer_peak_mem_GiB": max(r.get("peak_mem_GiB", 0.0) for r in rows),
        "rollout_peak_mem_GiB": max(r.get("rollout/peak_mem_GiB", 0.0) for r in rows),
        "gpu_peak_mem_GiB": {str(k): v / 1024 for k, v in sorted(peak_MiB.items())},
        "wall_s": wall_s,
    }


def async_keys(variants: dict) -> dict:
    """bench/results/gpu_vllm/async_gpu.json's keys, where the run had `vllm` and an asynchronous variant: median
    steady steps, bound_s (the larger of generation and training + logprobs + refit, from the synchronous run), the
    in-flight pause per refit."""
    sync = variants.get("vllm", {})
    if not sync.get("steps") or not any(f"vllm_async_{eta}" in variants for eta in (1, 2)):
        return {}
    steady = sync["steps"][1:] or sync["steps"]
    gen = statistics.median(r["timing/generation_s"] for r in steady)
    rest = statistics.median(
        r["timing/policy_training_s"] + (r["timing/logprobs_s"] or 0.0) + r["timing/refit_s"] for r in steady
    )
    out = {"step_s_sync": sync["step_s_median"], "bound_s": max(gen, rest)}
    for eta in (1, 2):
        x = variants.get(f"vllm_async_{eta}", {})
        out[f"step_s_async_{eta}"] = x.get("step_s_median")
        out[f"rollout_pause_s_median_async_{eta}"] = x.get("rollout_pause_s_median")
        out[f"rollout_idle_frac_async_{eta}"] = (
            x["rollout_idle_s"] / x["step_s"] if x.get("step_s") and x.get("rollout_idle_s") is not None else None
        )
    out["rollout_pause_s_median"] = out["rollout_pause_s_median_async_1"]
    return out


def result(variants: dict, args, copy_GBps: float) -> dict:

    v, hf = variants.get("vllm") or variants.get("vllm_sleep") or {}, variants.get("hf", {})
    rollout = json.loads(Path(args.rollout_json).read_text()) if args.rollout_json else {}
    return {
        "vllm_version": metadata.version("vllm"),
        "raw_vllm_tokps": rollout.get("raw_tokps"),
        "service_over_raw_tokps": rollout.get("service_over_raw_tokps"),
        "step_s_vllm": v.get("step_s"),
        "step_s_hf": hf.get("step_s"),
        "hf_over_vllm_step": hf["step_s"] / v["step_s"] if v.get("step_s") and hf.get("step_s") else None,
        "generation_s_vllm": v.get("generation_s"),
        "generation_s_hf": hf.get("generation_s"),
        "refit_s_vllm": v.get("refit_s"),
        "refit_ms_per_GB_vllm": v.get("refit_ms_per_GB"),
        "engine_load_ms_per_GB_vllm": v.get("engine_load_ms_per_GB"),
        "refit_bytes": v.get("refit_bytes"),
        "mult_prob_error": v.get("mult_prob_error_max"),
        "peak_mem_GiB": {
            name: {
                "trainer": x["trainer_peak_mem_GiB"],
                "rollout": x["rollout_peak_mem_GiB"],
                "gpu_total": x["gpu_peak_mem_GiB"],
            }
            for name, x in variants.items()
            if "error" not in x
        },
        **async_keys(variants),
        "hbm_copy_GBps": copy_GBps,
        "rollout_bench": rollout,
        "variants": variants,
        **stamp(),
        "batch": {"prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens, "steps": args.steps},
        "model": args.model_dir or "random Qwen2-1.5B shape (hidden 1536, 28 layers, char vocabulary)",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--variants", default="vllm,hf,vllm_sleep")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    p.add_argument("--rollout-json", default="", help="bench/rollout.py's output on the same machine")
    p.add_argument("--work", default="/tmp/gpu_vllm")
    p.add_argument("--model-dir", default="", help="a pretrained model (e.g. SmolLM2) instead of the random 1.5B shape")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_vllm" / "gpu_vllm.json"))
    args = p.parse_args()
    copy_GBps = hbm_copy_GBps()
    variants: dict[str, dict] = {}
    for name in args.variants.split(","):
        start = time.perf_counter()
        try:
            with GpuMemorySampler() as mem:
                run_dir = run_variant(name, args, Path(args.work))
            variants[name] = summarize(run_dir, mem.peak_MiB, time.perf_counter() - start)
        except Exception as e:  # one variant's failure is recorded; the others still run
            variants[name] = {"error": f"{type(e).__name__}: {e}"}
        Path(args.out).write_text(json.dumps(result(variants, args, copy_GBps), indent=2) + "\n")
        long = ("steps", "engine_applied", "refit_marks")
        print(json.dumps({name: {k: v for k, v in variants[name].items() if k not in long}}))
    print(json.dumps({k: v for k, v in result(variants, args, copy_GBps).items() if k not in ("variants",)}, indent=2))


if __name__ == "__main__":
    main()
