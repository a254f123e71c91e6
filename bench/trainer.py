"""Trainer throughput: the FSDP2 engine against the naive transformers loop, on the same RL-shaped batch.

    python bench/trainer.py                                   # 0.5B and 1.5B on one GPU
    torchrun --nproc-per-node 2 bench/trainer.py --scaling    # the 1.5B engine over 2 GPUs, merged in
    python bench/trainer.py --smoke                           # tiny model on CPU: checks the script

Engine (services/trainer, in-process): packed rows, bf16 compute over fp32 master weights (FSDP2
MixedPrecisionPolicy), fused AdamW, logits for response tokens only; in the variants of VARIANTS (flash
varlen attention per row, fused chunked logprob head, compiled norms and MLP), the fastest reported.
Naive: the same transformers model under autocast bf16, right-padded micro-batches of --naive-batch
sequences, full logits, torch.optim.AdamW(foreach=False, fused=False). Both run one
forward+backward per token (one optimizer step per batch needs no separate old-logprob pass), so the
speedup is the engine's alone. MFU = 6 * params * tokens / step time / 989e12 (dense bf16 peak).
Writes bench/results/trainer/trainer.json; a failing configuration leaves its error there and null numbers.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

# Micro-batches change shape every step; expandable segments keep the allocator from fragmenting.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import commit  # noqa: E402 - bench/ is this script's own folder

from services.trainer.packing import Seq  # noqa: E402

PEAK_FLOPS = 989e12
QWEN2 = {"vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768}
SHAPES = {  # the real Qwen2-0.5B / Qwen2-1.5B shapes, random weights
    "0p5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "intermediate_size": 4864},
    "1p5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "intermediate_size": 8960},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}
# The engine's config where pydantic is missing (the GPU image); --smoke checks it against TrainerSection.
TRAINER_DEFAULTS = {
    "backend": "fsdp2", "host": "127.0.0.1", "num_ranks": 1, "num_threads": 1, "grpc_port": 0, "lr": 1e-6,
    "lr_schedule": "constant", "lr_warmup_steps": 0, "lr_schedule_steps": 0, "weight_decay": 0.0,
    "max_grad_norm": 1.0, "max_tokens_per_microbatch": 16384, "minibatches": 1,
    "dtype": "bfloat16", "checkpoint_root": "",
    "loss": {
        "name": "grpo", "clip_eps": 0.2, "clip_eps_low": 0.2, "clip_eps_high": 0.28, "dr_grpo_norm_tokens": 0,
        "kl_beta": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0, "importance_sampling": "off",
        "is_truncation": 2.0,
    },
    "memory": {"activation_checkpointing": "off", "logprob_chunk_tokens": 0},
    "fsdp2": {
        "cpu_offload": False, "ref_cpu_offload": False, "attn_implementation": "sdpa_varlen", "flash_varlen": True,
        # Every sequence whole, as the megatron backend packs them and as the committed GPU results were measured.
        "share_prompts": False, "compile_layers": False,
    },
    "megatron": {"tensor_parallel": 1, "pipeline_parallel": 1},
}  # fmt: skip
# Every variant runs (--variants picks them); the fastest is the headline, each one's numbers are kept.
FUSED = {"attn_implementation": "sdpa_varlen", "flash_varlen": True, "logprob_chunk_tokens": 4096}
VARIANTS = {
    "compiled": {**FUSED, "compile_layers": True},  # + inductor-fused RMSNorm / SwiGLU / head softmax
    "fused": FUSED,  # one flash varlen call per row, fused chunked lm_head logprobs
    "per_sequence": {"attn_implementation": "sdpa_varlen", "flash_varlen": False},  # the first engine
}
# Only when every chosen variant failed: selective recomputation (an OOM), then plain sdpa (an attention error).
FALLBACKS = {
    "fused_selective": {**FUSED, "activation_checkpointing": "selective"},
    "sdpa_selective": {"attn_implementation": "sdpa", "activation_checkpointing": "selective"},
}


def log(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"[bench/trainer {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def nested(options: dict) -> dict:
    """The bench's flat options (its variants, as its results record them) as TrainerSection's nested keys."""
    table = {key: section for section, keys in TRAINER_DEFAULTS.items() if isinstance(keys, dict) for key in keys}
    out = {section: dict(keys) if isinstance(keys, dict) else keys for section, keys in TRAINER_DEFAULTS.items()}
    for key, value in options.items():
        if key in table:
            out[table[key]][key] = value
        elif key == "loss" and isinstance(value, str):
            out["loss"]["name"] = value
        else:
            out[key] = value
    if out["backend"] == "megatron":  # it refuses FSDP2 options other than their defaults
        out["fsdp2"] = {}
    return out


def trainer_config(**options):
    """TrainerSection with the bench's defaults and `options` (flat: `cpu_offload`, `tensor_parallel`, ...)."""
    data = nested(options)
    try:
        from services.common.config import TrainerSection
    except ImportError:
        return SimpleNamespace(**{k: SimpleNamespace(**v) if isinstance(v, dict) else v for k, v in data.items()})
    return TrainerSection(**data)


def rl_batch(args, vocab: int, seed: int = 0) -> tuple[list[Seq], list[float], list[list[float]]]:
    """GRPO groups: one prompt (~prompt_tokens) per group; responses long-tailed (log-normal, clipped)."""
    rng = random.Random(seed)
    median = math.sqrt(args.min_response * args.max_response)  # 362 tokens for 64..2048; mean ~600
    seqs, advantages, rollout = [], [], []
    for _ in range(args.num_prompts):
        prompt = [rng.randrange(vocab) for _ in range(int(args.prompt_tokens * rng.uniform(0.75, 1.25)))]
        for _ in range(args.group):
            n = int(min(args.max_response, max(args.min_response, rng.lognormvariate(math.log(median), 1.0))))
            seqs.append(Seq(prompt, [rng.randrange(vocab) for _ in range(n)]))
            advantages.append(rng.gauss(0.0, 1.0))
            rollout.append([-math.log(vocab) + rng.gauss(0.0, 0.01) for _ in range(n)])
    return seqs, advantages, rollout


def qwen2(shape: str, attn: str, device: torch.device, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = {"vocab_size": 512} if shape == "tiny" else {}
    cfg = Qwen2Config(**{**QWEN2, **SHAPES[shape], "num_key_value_heads": 2, **vocab})
    if attn == "sdpa_varlen":
        from services.trainer.attention import register_attention

        register_attention()
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)  # fp32: the master weights
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    else:
        model.config._attn_implementation = attn
    return model


def init_distributed(device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_GiB(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # CPU: max RSS, not resettable


def timed(step, args, device: torch.device) -> list[float]:
    times = []
    for i in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        log(f"  step {i} {'(warmup) ' if i < args.warmup else ''}{times[-1]:.3f} s")
    return times[args.warmup :]


def summary(times: list[float], num_tokens: int, num_params: int, world: int, device: torch.device) -> dict:
    step_s = statistics.median(times)
    return {
        "step_s": step_s,
        "steps_s": times,
        "tokens_per_s": num_tokens / step_s,
        "mfu": 6 * num_params * num_tokens / step_s / (PEAK_FLOPS * world),
        "peak_mem_GiB": peak_GiB(device),
    }


def build_engine(shape: str, device: torch.device, options: dict):
    """The FSDP2 engine over this run's ranks with `options` on top of the bench's config; its params."""
    from services.trainer.fsdp2.build import assemble_engine

    cfg = trainer_config(num_ranks=dist.get_world_size(), **options)
    model = qwen2(shape, cfg.fsdp2.attn_implementation, device)
    num_params = sum(p.numel() for p in model.parameters())
    return assemble_engine(model, None, cfg, Path(tempfile.gettempdir()), device), num_params


def run_engine(shape: str, batch, args, device: torch.device, options: dict) -> dict:
    options = {"max_tokens_per_microbatch": args.max_tokens, "dtype": args.dtype, **options}
    engine, num_params = build_engine(shape, device, options)
    return measure(engine, batch, num_params, args, device, options)


def measure(engine, batch, num_params: int, args, device: torch.device, options: dict) -> dict:
    """A built engine's check logprobs, then its timed steps on the batch, summarised."""
    seqs, advantages, rollout = batch
    check = engine.logprobs(seqs[: args.check_seqs])
    times = timed(lambda: engine.train(seqs, advantages, rollout), args, device)
    num_tokens = sum(s.num_tokens for s in seqs)
    out = summary(times, num_tokens, num_params, dist.get_world_size(), device)
    out.update(options, params=num_params, num_tokens=num_tokens, check_logprobs=[t.tolist() for t in check])
    return out


def naive_step(model, optimizer, batch, args, device: torch.device) -> None:
    """Right-padded micro-batches in arrival order, full logits, one fwd+bwd per micro-batch, one step."""
    seqs, advantages, _ = batch
    num_response_tokens = sum(len(s.response_ids) for s in seqs)
    for start in range(0, len(seqs), args.naive_batch):
        chunk = range(start, min(start + args.naive_batch, len(seqs)))
        width = max(seqs[i].num_tokens for i in chunk)
        ids_BT = torch.zeros(len(chunk), width, dtype=torch.long)
        mask_BT, resp_BT, adv_BT = (torch.zeros(len(chunk), width) for _ in range(3))
        for row, i in enumerate(chunk):
            s = seqs[i]
            ids_BT[row, : s.num_tokens] = torch.tensor(s.prompt_ids + s.response_ids)
            mask_BT[row, : s.num_tokens] = 1
            resp_BT[row, len(s.prompt_ids) : s.num_tokens] = 1
            adv_BT[row] = advantages[i]
        ids_BT, mask_BT, resp_BT, adv_BT = (t.to(device) for t in (ids_BT, mask_BT, resp_BT, adv_BT))
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits_BTV = model(input_ids=ids_BT, attention_mask=mask_BT).logits
        logp_BT = torch.log_softmax(logits_BTV[:, :-1].float(), -1).gather(-1, ids_BT[:, 1:, None])[..., 0]
        ratio_BT = torch.exp(logp_BT - logp_BT.detach())
        loss = -(ratio_BT * adv_BT[:, 1:] * resp_BT[:, 1:]).sum() / num_response_tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_naive(shape: str, batch, args, device: torch.device) -> dict:
    seqs = batch[0]
    model = qwen2(shape, "sdpa", device)
    num_params = sum(p.numel() for p in model.parameters())
    check = naive_logprobs(model, seqs[: args.check_seqs], device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False, fused=False)
    times = timed(lambda: naive_step(model, optimizer, batch, args, device), args, device)
    num_tokens = sum(s.num_tokens for s in seqs)
    groups = [seqs[i : i + args.naive_batch] for i in range(0, len(seqs), args.naive_batch)]
    padded = sum(len(g) * max(s.num_tokens for s in g) for g in groups)
    out = summary(times, num_tokens, num_params, 1, device)
    out.update(params=num_params, num_tokens=num_tokens, padded_tokens=padded, check_logprobs=check)
    return out


@torch.no_grad()
def naive_logprobs(model, seqs: list[Seq], device: torch.device) -> list[list[float]]:
    out = []
    for s in seqs:
        ids = torch.tensor([s.prompt_ids + s.response_ids], device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
        out.append(torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(s.prompt_ids) :, None])[:, 0].tolist())
    return out


def attempt(name: str, fn, errors: dict, device: torch.device) -> dict | None:
    reset_peak(device)
    try:
        return fn()
    except Exception as e:  # a failing configuration is recorded, the others still run
        errors[name] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
        log(f"{name} failed: {errors[name]}")
        return None
    finally:
        torch._dynamo.reset()  # compiled graphs would keep the finished variant's model alive
        reset_peak(device)


def bench_engine(shape: str, batch, args, device: torch.device, errors: dict) -> tuple[dict | None, dict]:
    """The fastest variant's result and every variant's tokens/s (None where it failed)."""
    runs = {}
    for name in args.variants.split(","):
        if name not in VARIANTS:
            raise ValueError(f"--variants must name some of {sorted(VARIANTS)}, got {name!r}")
        log(f"{shape} engine {name}: {VARIANTS[name]} dtype={args.dtype}")
        run = functools.partial(run_engine, shape, batch, args, device, VARIANTS[name])
        runs[name] = attempt(f"engine_{shape}_{name}", run, errors, device)
    for name, options in FALLBACKS.items():
        if any(runs.values()):
            break
        log(f"{shape} engine fallback {name}: {options}")
        run = functools.partial(run_engine, shape, batch, args, device, options)
        runs[name] = attempt(f"engine_{shape}_{name}", run, errors, device)
    done = {name: r for name, r in runs.items() if r is not None}
    best = max(done, key=lambda name: done[name]["tokens_per_s"], default=None)
    variants = {
        name: r and {k: r[k] for k in ("tokens_per_s", "mfu", "step_s", "peak_mem_GiB")} for name, r in runs.items()
    }
    for name, v in variants.items():
        log(f"{shape} {name}: " + (f"{v['tokens_per_s']:.0f} tok/s, MFU {v['mfu']:.3f}" if v else "failed"))
    return (done[best] | {"variant": best} if best else None), variants


def bench_model(shape: str, args, device: torch.device, results: dict) -> None:
    vocab = 512 if shape == "tiny" else QWEN2["vocab_size"]
    batch = rl_batch(args, vocab)
    lens = sorted(len(s.response_ids) for s in batch[0])
    num_tokens = sum(s.num_tokens for s in batch[0])
    median = lens[len(lens) // 2]
    log(f"{shape}: {len(lens)} sequences, {num_tokens} tokens, responses {lens[0]}..{lens[-1]} (median {median})")
    engine, variants = bench_engine(shape, batch, args, device, results["errors"])
    naive = None
    if not args.skip_naive:
        log(f"{shape} naive: padded micro-batches of {args.naive_batch}, autocast bf16, plain AdamW")
        naive = attempt(f"naive_{shape}", lambda: run_naive(shape, batch, args, device), results["errors"], device)
    if engine and naive:
        diffs = [abs(a - b) for x, y in zip(engine["check_logprobs"], naive["check_logprobs"]) for a, b in zip(x, y)]
        engine["check_max_abs_logprob_diff_vs_naive"] = max(diffs)
    for part in (engine, naive):
        if part:
            part.pop("check_logprobs")
    key = shape
    results["configs"][key] = {"engine": engine, "variants": variants, "naive": naive, "response_tokens": lens}
    results[f"engine_variant_{key}"] = engine and engine["variant"]
    results[f"mfu_{key}"] = engine and engine["mfu"]
    results[f"tokens_per_s_{key}"] = engine and engine["tokens_per_s"]
    results[f"peak_mem_GiB_{key}"] = engine and engine["peak_mem_GiB"]
    results[f"naive_mfu_{key}"] = naive and naive["mfu"]
    results[f"naive_tokens_per_s_{key}"] = naive and naive["tokens_per_s"]
    results[f"naive_peak_mem_GiB_{key}"] = naive and naive["peak_mem_GiB"]
    results[f"speedup_vs_naive_{key}"] = engine and naive and engine["tokens_per_s"] / naive["tokens_per_s"]


def machine(device: torch.device) -> str:
    import transformers

    where = f"{torch.cuda.get_device_name(device)} x{dist.get_world_size()}" if device.type == "cuda" else "CPU"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}"
    return f"{where}, {versions}, host {platform.node()}"


def scaling(args, device: torch.device, results: dict) -> None:
    """The 1.5B engine over every rank of this torchrun, against the single-GPU figure already written."""
    shape, world = ("tiny" if args.smoke else "1p5b"), dist.get_world_size()
    key = f"{world}gpu_{shape}"
    batch = rl_batch(args, 512 if args.smoke else QWEN2["vocab_size"])
    engine, variants = bench_engine(shape, batch, args, device, results["errors"])
    if engine:
        engine.pop("check_logprobs")
    results["configs"][key] = {"engine": engine, "variants": variants}
    results[f"tokens_per_s_{key}"] = engine and engine["tokens_per_s"]
    results[f"mfu_{key}"] = engine and engine["mfu"]
    single = results.get(f"tokens_per_s_{shape}")
    results[f"scaling_efficiency_{key}"] = engine and single and engine["tokens_per_s"] / (world * single)


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """The models, RL-shaped batch and timing every trainer benchmark shares (bench/megatron_vs_fsdp2.py too)."""
    p.add_argument("--models", default="0p5b,1p5b")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--min-response", type=int, default=64)
    p.add_argument("--max-response", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=16384, help="the engines' max_tokens_per_microbatch")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--check-seqs", type=int, default=4)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, small batch")
    p.add_argument("--scaling", action="store_true", help="under torchrun: the 1.5B engine over all ranks")
    add_batch_args(p)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"engine variants, of {','.join(VARIANTS)}")
    p.add_argument("--naive-batch", type=int, default=4, help="sequences per naive padded micro-batch")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.smoke:
        args.models, args.num_prompts, args.group, args.prompt_tokens = "tiny", 4, 4, 16
        args.min_response, args.max_response, args.max_tokens, args.steps = 8, 64, 256, 1
        if "--variants" not in sys.argv:  # inductor on two CPU cores takes minutes; compile is a GPU option
            args.variants = "fused,per_sequence"
    smoke_out = Path(tempfile.gettempdir()) / "trainer_smoke.json"
    args.out = Path(args.out or (smoke_out if args.smoke else ROOT / "bench/results/trainer/trainer.json"))
    return args


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("WORLD_SIZE", 1))))
    return torch.device("cpu")


def main() -> None:
    args = parse_args()
    device = pick_device()
    init_distributed(device)
    if args.smoke:
        from pydantic import BaseModel

        from services.common.config import TrainerSection

        def fields(model) -> dict:
            return {k: fields(f.annotation) if isinstance(f.default, BaseModel) else None
                    for k, f in model.model_fields.items()}  # fmt: skip

        def keys(d: dict) -> dict:
            return {k: keys(v) if isinstance(v, dict) else None for k, v in d.items()}

        assert keys(TRAINER_DEFAULTS) == fields(TrainerSection), "TRAINER_DEFAULTS drifted from TrainerSection"
    # --scaling adds to the single-GPU results; a plain run starts them over.
    results = json.loads(args.out.read_text()) if args.scaling and args.out.exists() else {}
    results.setdefault("configs", {})
    results.setdefault("errors", {})
    if args.scaling:
        scaling(args, device, results)
        results["command_scaling"] = (
            f"torchrun --nproc-per-node {dist.get_world_size()} bench/trainer.py {' '.join(sys.argv[1:])}"
        )
    else:
        for shape in args.models.split(","):
            bench_model(shape, args, device, results)
        results["command"] = f"python bench/trainer.py {' '.join(sys.argv[1:])}".strip()
    results["machine_scaling" if args.scaling else "machine"] = machine(device)
    results["commit"] = commit()
    if dist.get_rank() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps({k: v for k, v in results.items() if not isinstance(v, (dict, list))}, indent=1), flush=True)
        log(f"wrote {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
