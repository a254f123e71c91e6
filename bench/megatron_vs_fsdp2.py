"""Megatron-core backend against the FSDP2 backend, same RL-shaped batch (bench/trainer.py's), same run.

    python bench/megatron_vs_fsdp2.py     # 0.5B and 1.5B on one GPU -> bench/results/megatron_vs_fsdp2/megatron.json
    torchrun --nproc-per-node 2 bench/megatron_vs_fsdp2.py --tp 2   # TP=2 vs FSDP2 on 2 GPUs, merged in

Both backends load the same random Qwen2-shaped weights and train bf16 with fp32 master weights and
AdamW, packed rows of --max-tokens, fused chunked logprob head. FSDP2 runs its fastest variant from
bench/trainer.py (--fsdp2-variant); Megatron runs the local layer spec with the packed flash attention
(services/trainer/megatron/attention.py), DDP and the distributed optimizer; if it fails (an OOM) it is
retried with full-layer recomputation. MFU = 6 * params * tokens / step time / (989e12 * GPUs).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import trainer as bt  # bench/trainer.py: the batch, the model shapes, the timing and the FSDP2 runner

MEGATRON_VARIANTS = {"megatron": {"activation_checkpointing": "off"}}
MEGATRON_FALLBACKS = {"megatron_layer_recompute": {"activation_checkpointing": "layer"}}


def save_hf(shape: str, folder: Path, device: torch.device) -> int:
    """The weights bench/trainer.py's qwen2() gives FSDP2 (seed 0, drawn on the same device), as HF safetensors."""
    model = bt.qwen2(shape, "sdpa", device)
    num_params = sum(p.numel() for p in model.parameters())
    if dist.get_rank() == 0:
        model.to(torch.bfloat16).save_pretrained(folder)
    dist.barrier()
    del model
    gc.collect()
    return num_params


def megatron_engine(model_dir: Path, args, device, options: dict):
    from services.trainer.megatron.build import assemble

    cfg = bt.trainer_config(
        backend="megatron", tensor_parallel=args.tp, num_ranks=dist.get_world_size(),
        max_tokens_per_microbatch=args.max_tokens, dtype=args.dtype, logprob_chunk_tokens=4096, **options,
    )  # fmt: skip
    return assemble(cfg, model_dir, device)


def run_megatron(model_dir: Path, num_params: int, batch, args, device, options: dict) -> dict:
    return bt.measure(megatron_engine(model_dir, args, device, options), batch, num_params, args, device, options)


def first_success(prefix: str, variants: dict, fallbacks: dict, run, errors: dict, device) -> dict | None:
    """The first variant that runs, then the first fallback; None when all of them failed."""
    for name, options in {**variants, **fallbacks}.items():
        result = bt.attempt(f"{prefix}_{name}", functools.partial(run, options), errors, device)
        if result:
            return result | {"variant": name}
    return None


def bench_shape(shape: str, args, device, results: dict) -> None:
    errors, key = results["errors"], shape if args.tp == 1 else f"{shape}_tp{args.tp}"
    batch = bt.rl_batch(args, bt.QWEN2["vocab_size"])
    bt.log(f"{key}: {len(batch[0])} sequences, {sum(s.num_tokens for s in batch[0])} tokens")
    fsdp_options = bt.VARIANTS[args.fsdp2_variant]
    fsdp = bt.attempt(f"fsdp2_{key}", lambda: bt.run_engine(shape, batch, args, device, fsdp_options), errors, device)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        model_dir = Path(tmp)
        num_params = save_hf(shape, model_dir, device)
        run = functools.partial(run_megatron, model_dir, num_params, batch, args, device)
        meg = first_success(f"megatron_{key}", MEGATRON_VARIANTS, MEGATRON_FALLBACKS, run, errors, device)
    if fsdp and meg:
        from services.trainer.losses import mult_prob_error  # bt put the repository on sys.path

        a = torch.tensor([x for row in meg["check_logprobs"] for x in row])
        b = torch.tensor([x for row in fsdp["check_logprobs"] for x in row])
        results[f"check_mult_prob_error_{key}"] = mult_prob_error(a, b).item()
    for part in (fsdp, meg):
        if part:
            part.pop("check_logprobs")
    results["configs"][key] = {"fsdp2": fsdp, "megatron": meg}
    for name, part in (("fsdp2", fsdp), ("megatron", meg)):
        results[f"{name}_tokens_per_s_{key}"] = part and part["tokens_per_s"]
        results[f"mfu_{name}_{key}"] = part and part["mfu"]
        results[f"{name}_peak_mem_GiB_{key}"] = part and part["peak_mem_GiB"]
    results[f"megatron_over_fsdp2_tokps_{key}"] = fsdp and meg and meg["tokens_per_s"] / fsdp["tokens_per_s"]
    if meg and fsdp:
        bt.log(f"{key}: megatron {meg['tokens_per_s']:.0f} tok/s ({meg['peak_mem_GiB']:.1f} GiB) vs fsdp2 "
               f"{fsdp['tokens_per_s']:.0f} tok/s ({fsdp['peak_mem_GiB']:.1f} GiB)")  # fmt: skip


def parser(doc: str = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    bt.add_batch_args(p)  # the trainer benchmark's models, batch and timing: both backends see the same
    p.add_argument(
        "--tp", type=int, default=1, help="Megatron tensor parallel size (run under torchrun with as many ranks)"
    )
    p.add_argument("--fsdp2-variant", default="compiled", choices=sorted(bt.VARIANTS))
    p.add_argument("--tmp", default=None, help="folder for the HF checkpoint Megatron loads")
    p.add_argument("--out", type=Path, default=bt.ROOT / "bench/results/megatron_vs_fsdp2/megatron.json")
    return p


def main() -> None:
    args = parser().parse_args()
    device = bt.pick_device()
    bt.init_distributed(device)
    results = json.loads(args.out.read_text()) if args.tp > 1 and args.out.exists() else {}
    results.setdefault("configs", {})
    results.setdefault("errors", {})
    for shape in args.models.split(","):
        bench_shape(shape, args, device, results)
    suffix = "" if args.tp == 1 else f"_tp{args.tp}"
    launcher = "python" if dist.get_world_size() == 1 else f"torchrun --nproc-per-node {dist.get_world_size()}"
    results[f"command{suffix}"] = f"{launcher} bench/megatron_vs_fsdp2.py {' '.join(sys.argv[1:])}".strip()
    results[f"machine{suffix}"] = bt.machine(device)
    results["commit"] = bt.commit()
    if dist.get_rank() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps({k: v for k, v in results.items() if not isinstance(v, (dict, list))}, indent=1), flush=True)
        bt.log(f"wrote {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
