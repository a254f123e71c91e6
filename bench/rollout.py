"""Generated tokens/s through the rollout service (Redis streams, a worker process with its gRPC service, the rewards)
against the raw engine on the same prompts, in the same run.

    .venv/bin/python bench/rollout.py           # SmolLM2-135M-Instruct; writes bench/results/rollout/rollout_cpu.json
    .venv/bin/python bench/rollout.py --smoke   # tiny random model, seconds; writes /tmp/rollout_smoke.json

The service side: Redis, weightsync (the worker registers with it) and one rollout worker are started as processes.
The raw side: the same engine class in this process, beside the idle worker (on a GPU each takes its own
--gpu-memory-utilization). Each is warmed up with the whole workload once (so kernels compiled for its shapes, on GPU
the sampler's Triton ones, are not timed); then the two take turns, --repeats times (8: on the H200 single passes of
the same batch moved between 2.5 and 3.6 s): every prompt enqueued at once and timed until its last group is back,
then one generate call of the same requests in this process. Taking turns puts a slow spell of the machine on both
sides (passes timed apart, one side after the other, gave ratios from 0.56 to 1.03 on the H200). Each side's median
pass is reported, the median of the per-turn ratios, and the worker's own log of each batch (generation, decoding and
rewards, publishing). Every sample runs to max_tokens (ignore_eos), so both sides generate exactly the same number of
tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from protos.grpo.v1 import queue_pb2  # noqa: E402
from services.common.config import RunConfig, dump_toml, load_config  # noqa: E402


def _requests(cfg: RunConfig, num_prompts: int, num_samples: int, max_tokens: int) -> list[queue_pb2.PromptWork]:
    from services.common.tasks import PromptRenderer, builtin_prompts, load_task

    if cfg.task.name == "class_continuation":  # --model-dir: the built-in prompts, no task package needed
        prompts = builtin_prompts(cfg.run.seed, cfg.task.prompt_len)
        train = [next(prompts) for _ in range(num_prompts)]
    else:
        train = load_task(cfg.task).train
    renderer = PromptRenderer(cfg.model.path, cfg.task.system_prompt, cfg.task.chat_template)
    return [
        queue_pb2.PromptWork(
            run_id="bench",
            step=1,
            prompt_index=i,
            prompt_ids=renderer.ids(p),
            num_samples=num_samples,
            sampling=queue_pb2.SamplingParams(
                temperature=1.0, top_p=1.0, max_tokens=max_tokens, ignore_eos=True, seed=1000 + i
            ),
            task=queue_pb2.TaskSpec(name="bench", answer=p.answer, prompt=p.text, metadata_json=json.dumps(p.metadata)),
        )
        for i, p in enumerate(train[:num_prompts])
    ]


def _pass(work: list[queue_pb2.PromptWork], n: int) -> list[queue_pb2.PromptWork]:
    """The workload under pass number n (its own step, so no pass's groups are taken for another's)."""
    out = []
    for w in work:
        item = queue_pb2.PromptWork()
        item.CopyFrom(w)
        item.step = n
        out.append(item)
    return out


def _interleaved(
    cfg: RunConfig, work: list[queue_pb2.PromptWork], tmp: Path, repeats: int
) -> tuple[list[float], list[float], int, list[str]]:
    """Seconds of each service pass and each raw pass, taking turns; the tokens of one pass; the worker's batch log."""
    from deploy.placement.ports import fill_blanks
    from deploy.procs import check_alive, spawn, stop_all
    from services.common.grpcio import wait_healthy
    from services.common.queue import WorkQueue, connect
    from services.common.redis_server import start_redis

    cfg = fill_blanks(cfg)
    config_path = tmp / "config.toml"
    config_path.write_text(dump_toml(cfg))
    redis_proc = start_redis(cfg.redis.port, tmp / "redis")
    env = {"OMP_NUM_THREADS": str(cfg.rollout.num_threads)}
    services = [spawn("weightsync", ["-m", "services.weightsync.main", "--config", str(config_path)], tmp / "logs")]
    try:
        wait_healthy(f"{cfg.weightsync.host}:{cfg.weightsync.grpc_port}", timeout_s=120)
        args = ["-m", "services.rollout.main", "--worker-index", "0", "--config", str(config_path)]
        services.append(spawn("rollout-0", args, tmp / "logs", env))
        queue = WorkQueue(connect(cfg.redis.url), cfg.redis.prompts_stream, cfg.redis.trajectories_stream)
        queue.ensure_group()
        _run(queue, _pass(work, 0), lambda: check_alive(services), timeout_s=1800)  # start-up, compiles
        engine, requests = _raw_engine(cfg, work)
        engine.generate(requests)  # warm-up, as the service's
        service_s, raw_s = [], []
        for n in range(1, repeats + 1):
            start = time.perf_counter()
            groups = _run(queue, _pass(work, n), lambda: check_alive(services), timeout_s=1800)
            service_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            samples = engine.generate(requests)
            raw_s.append(time.perf_counter() - start)
        tokens = sum(len(t.response_ids) for g in groups for t in g.trajectories)
        raw_tokens = sum(len(s.token_ids) for group in samples for s in group)
        assert tokens == raw_tokens, f"service generated {tokens} tokens, raw {raw_tokens}"
        # The worker's own account of each engine batch: where the service's time went besides generation.
        log = (tmp / "logs" / "rollout-0.log").read_text(errors="replace").splitlines()
        batches = [line.split(" INFO ", 1)[-1] for line in log if "sequences):" in line]
        return service_s, raw_s, tokens, batches
    finally:
        stop_all(services)
        redis_proc.terminate()
        redis_proc.wait()


def _run(queue, work: list[queue_pb2.PromptWork], check_alive, timeout_s: float) -> list[queue_pb2.TrajectoryGroup]:
    cursor = queue.trajectories_tail()
    queue.enqueue(work)
    want = {(w.step, w.prompt_index) for w in work}
    got: dict[tuple[int, int], queue_pb2.TrajectoryGroup] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(want):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(got)}/{len(want)} groups after {timeout_s}s")
        check_alive()
        cursor, groups = queue.read_trajectories(cursor, block_ms=200)
        for g in groups:
            if g.error:
                raise RuntimeError(f"prompt {g.prompt_index} rejected: {g.error}")
            got[(g.step, g.prompt_index)] = g
    return list(got.values())


def _raw_engine(cfg: RunConfig, work: list[queue_pb2.PromptWork]):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.rollout.kv_cache_GiB))
    from services.rollout.engine import Request
    from services.rollout.engines import make_engine

    engine = make_engine(cfg.rollout, cfg.model.path, cfg.run.seed, cfg.model.lm_head_fp32)
    return engine, [Request(list(w.prompt_ids), w.num_samples, w.sampling) for w in work]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny random model and few tokens; /tmp output")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of the worker and of the raw engine")
    parser.add_argument("--model-dir", default="", help="an HF folder to generate with, on the built-in prompts")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.0, help="rollout.gpu.*; 0 = the default")
    parser.add_argument("--args", nargs="*", default=[], help="config overrides, e.g. rollout.cpu_compile=true")
    parser.add_argument("--repeats", type=int, default=8, help="timed passes a side after the warm-up; the median")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    # Before torch is first imported (by the prompt renderer): the raw engine runs with the worker's threads.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    task = [
        'task.name="reasoning_gym"',
        'task.generator="basic_arithmetic"',
        'task.system_prompt="Answer with only the final number."',
        "task.eval_size=1",
        "task.rewards={reasoning_gym=1.0}",
    ]
    overrides = [
        *([] if args.model_dir else task),
        f"rollout.engine={args.engine}",
        *([f"rollout.gpu.gpu_memory_utilization={args.gpu_memory_utilization}"] if args.gpu_memory_utilization else []),
        f"rollout.max_num_seqs={args.prompts * args.samples}",
        f"rollout.num_threads={args.threads}",
        "rollout.max_model_len=512",
        f'run.output_dir="{tmp}"',
        *args.args,
    ]
    if args.model_dir:
        overrides += [f'model.path="{args.model_dir}"', "task.chat_template=false"]
    elif args.smoke:
        from services.common.config import ModelSection
        from services.common.tinymodel import create_tiny_model

        model = create_tiny_model(ModelSection(path=str(tmp / "tiny")), seed=0)
        overrides += [f'model.path="{model}"', "task.chat_template=false", "task.train_size=8"]
        args.prompts, args.max_tokens = min(args.prompts, 4), min(args.max_tokens, 8)
    else:
        from services.common.models import build_model

        overrides.append(f'model.path="{build_model("smollm2-135m-instruct", REPO / "runs" / "models")}"')
    cfg = load_config(None, overrides)
    work = _requests(cfg, args.prompts, args.samples, args.max_tokens)
    service_passes, raw_passes, tokens, batches = _interleaved(cfg, work, tmp, args.repeats)
    service_s, raw_s = statistics.median(service_passes), statistics.median(raw_passes)
    result = {
        "service_over_raw_tokps": raw_s / service_s,
        "service_over_raw_per_turn_median": statistics.median(r / s for s, r in zip(service_passes, raw_passes)),
        "raw_tokps": tokens / raw_s,
        "service_tokps": tokens / service_s,
        "service_s": service_s,
        "raw_s": raw_s,
        "service_passes_s": [round(x, 4) for x in service_passes],
        "raw_passes_s": [round(x, 4) for x in raw_passes],
        "worker_batches": batches,
        "tokens": tokens,
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "max_tokens": args.max_tokens,
        "model": Path(cfg.model.path).name,
        "engine": cfg.rollout.engine,
        "threads": args.threads,
        "repeats": args.repeats,
    }
    default = "/tmp/rollout_smoke.json" if args.smoke else REPO / "bench" / "results" / "rollout" / "rollout_cpu.json"
    out = Path(args.out or default)
    write_result(out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
