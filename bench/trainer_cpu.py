"""One GRPO training step of SmolLM2-135M-Instruct on the CPU: the trainer engine's attention and thread variants
against the plain transformers loop TRL runs (a padded batch, full logits, torch AdamW), same batch, same run.

    .venv/bin/python bench/trainer_cpu.py                 # writes bench/results/trainer_cpu/trainer_cpu.json (~5 min)
    .venv/bin/python bench/trainer_cpu.py --smoke         # tiny random model, seconds

The batch is RL-shaped like the head-to-head's: --seqs sequences, --samples to a prompt of --prompt-tokens, with a
response of --response-tokens on average (uniform within +-50 %), random ids. Each variant runs --reps steps after one
warm-up and reports the median seconds and trained tokens (prompt + response) per second.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from services.trainer.packing import Seq  # noqa: E402

VARIANTS = {
    "engine_sdpa_mask": {"fsdp2": {"attn_implementation": "sdpa", "share_prompts": False}},
    "engine_sdpa_mask_shared": {"fsdp2": {"attn_implementation": "sdpa"}},
    "engine_sdpa_varlen": {"fsdp2": {"attn_implementation": "sdpa_varlen", "share_prompts": False}},
    "engine_sdpa_varlen_shared": {"fsdp2": {"attn_implementation": "sdpa_varlen"}},
}


def batch(args, vocab: int) -> tuple[list[Seq], list[float], list[list[float]]]:
    rng = random.Random(0)
    seqs, adv, roll = [], [], []
    for i in range(args.seqs):
        if i % args.samples == 0:
            prompt = [rng.randrange(vocab) for _ in range(args.prompt_tokens)]
        n = rng.randint(args.response_tokens // 2, args.response_tokens * 3 // 2)
        seqs.append(Seq(prompt, [rng.randrange(vocab) for _ in range(n)]))
        adv.append(1.0 if i % 2 else -1.0)
        roll.append([-2.0] * n)
    return seqs, adv, roll


def engine_step(model_dir: Path, options: dict, data, reps: int) -> list[float]:
    from services.common.config import TrainerSection
    from services.trainer.fsdp2.build import assemble_engine, load_model

    cfg = TrainerSection(num_ranks=1, lr=1e-5, loss={"name": "dapo"}, **options)
    model = load_model(str(model_dir), torch.float32, cfg.fsdp2.attn_implementation)
    engine = assemble_engine(model, None, cfg, model_dir, torch.device("cpu"))
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        engine.train(*data)
        times.append(time.perf_counter() - start)
    return times[1:]


def naive_step(model_dir: Path, data, reps: int) -> list[float]:
    """What TRL's GRPOTrainer does per step on CPU: right-padded batch, full logits, log_softmax, AdamW."""
    from transformers import AutoModelForCausalLM

    seqs, adv, _ = data
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    width = max(s.num_tokens for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    resp = torch.zeros(len(seqs), width)
    for i, s in enumerate(seqs):
        ids[i, : s.num_tokens] = torch.tensor(s.prompt_ids + s.response_ids)
        mask[i, : s.num_tokens] = 1
        resp[i, len(s.prompt_ids) : s.num_tokens] = 1
    advantages = torch.tensor(adv)[:, None]
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        loss = -(ratio * advantages * resp[:, 1:]).sum() / resp.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="responses to each prompt (a GRPO group)")
    parser.add_argument("--prompt-tokens", type=int, default=45)
    parser.add_argument("--response-tokens", type=int, default=28)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    # One rank: an in-process store, no port (a port from the pid collided with another process's in CI).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if args.smoke:
        from services.common.config import ModelSection
        from services.common.tinymodel import create_tiny_model

        model_dir = create_tiny_model(ModelSection(path=str(Path(tempfile.mkdtemp()) / "tiny")), seed=0)
        args.seqs, args.reps, args.threads = 4, 1, [1]
    else:
        from services.common.models import build_model

        model_dir = build_model("smollm2-135m-instruct", REPO / "runs" / "models")
    from transformers import AutoConfig

    data = batch(args, AutoConfig.from_pretrained(model_dir).vocab_size)
    tokens = sum(s.num_tokens for s in data[0])
    results = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        runs = {
            f"{name}_t{threads}": (lambda o=options: engine_step(model_dir, o, data, args.reps))
            for name, options in VARIANTS.items()
        }
        runs[f"naive_padded_t{threads}"] = lambda: naive_step(model_dir, data, args.reps)
        for name, run in runs.items():
            times = run()
            results[name] = {"median_s": statistics.median(times), "tokens_per_s": tokens / statistics.median(times)}
            print(name, json.dumps(results[name]), flush=True)
    best = min((k for k in results if k.startswith("engine")), key=lambda k: results[k]["median_s"])
    naive = min((k for k in results if k.startswith("naive")), key=lambda k: results[k]["median_s"])
    out = {
        "engine_best": best,
        "engine_over_naive_tokps": results[best]["tokens_per_s"] / results[naive]["tokens_per_s"],
        "tokens_per_step": tokens,
        "variants": results,
    }
    path = Path(
        args.out
        or (
            "/tmp/trainer_cpu_smoke.json"
            if args.smoke
            else REPO / "bench" / "results" / "trainer_cpu" / "trainer_cpu.json"
        )
    )
    write_result(path, out)
    print(json.dumps({k: v for k, v in out.items() if k != "variants"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
