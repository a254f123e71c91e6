"""Run under torchrun (1 or 2 ranks): the Megatron backend against the FSDP2 backend and a plain HF forward on
the same HF checkpoint; prints one JSON line of measurements for tests/gpu/test_megatron_gpu.py to assert on.

    torchrun --nproc-per-node 2 tests/gpu/megatron_check.py MODEL_DIR OUT.json --tp 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.common.config import TrainerSection  # noqa: E402
from services.trainer.fsdp2.build import assemble_engine, load_model  # noqa: E402
from services.trainer.losses import mult_prob_error  # noqa: E402
from services.trainer.megatron.build import assemble  # noqa: E402
from services.trainer.packing import Seq  # noqa: E402


def random_seqs(num: int, vocab: int, seed: int = 0) -> list[Seq]:
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        return torch.randint(0, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()

    return [Seq(ids(5, 40), ids(5, 120)) for _ in range(num)]


def hf_logprobs(model_dir: Path, seqs, device) -> list[torch.Tensor]:
    """fp32, one unpacked sequence at a time: the reference both backends must match."""
    model = load_model(str(model_dir), torch.float32, "sdpa").to(device).eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.prompt_ids + s.response_ids], device=device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            n = len(s.prompt_ids)
            out.append(logp[n - 1 : -1].gather(-1, ids[0, n:, None])[:, 0].cpu())
    return out


def mpe(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    x, y = torch.cat(a), torch.cat(b)
    return mult_prob_error(x, y).item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--tp", type=int, default=1)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", 0))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    memory = {"logprob_chunk_tokens": 64}
    common = dict(num_ranks=world, dtype="bfloat16", lr=1e-3, max_tokens_per_microbatch=512, memory=memory)
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    seqs = random_seqs(12, vocab)
    advantages = [float(i % 3 - 1) for i in range(len(seqs))]

    hf = hf_logprobs(args.model_dir, seqs, device)
    mcfg = TrainerSection(backend="megatron", megatron={"tensor_parallel": args.tp}, **common)
    meg = assemble(mcfg, args.model_dir, device)
    meg_lp = meg.logprobs(seqs)
    rollout = [t.tolist() for t in meg_lp]
    sd = meg.full_state_dict()
    from safetensors.torch import load_file

    disk = {}
    for f in args.model_dir.glob("*.safetensors"):
        disk.update(load_file(f))
    errs = [(sd[k].float() - v.to(torch.bfloat16).float()).abs().max().item() for k, v in disk.items() if sd]
    meg_metrics = [meg.train(seqs, advantages, rollout)]
    ckpt = args.out.parent / "ckpt"
    meg.save(ckpt)
    meg_metrics.append(meg.train(seqs, advantages, rollout))
    meg_after = meg.logprobs(seqs)
    # Resume: the checkpoint after step 1 brings back weights, Adam moments and step count, so the
    # second step comes out bit for bit the same.
    resumed_version = meg.load(ckpt)
    resumed = meg.train(seqs, advantages, rollout)
    resumed_after = meg.logprobs(seqs)
    del meg
    torch.cuda.empty_cache()

    fcfg = TrainerSection(fsdp2={"attn_implementation": "sdpa_varlen"}, **common)
    policy = load_model(str(args.model_dir), torch.float32, fcfg.fsdp2.attn_implementation)
    fsdp = assemble_engine(policy, None, fcfg, args.model_dir, device)
    fsdp_lp = fsdp.logprobs(seqs)
    fsdp_metrics = [fsdp.train(seqs, advantages, rollout) for _ in range(2)]
    fsdp_after = fsdp.logprobs(seqs)

    if rank == 0:
        result = {
            "world": world,
            "tp": args.tp,
            "mpe_megatron_vs_hf_fp32": mpe(meg_lp, hf),
            "mpe_fsdp2_vs_hf_fp32": mpe(fsdp_lp, hf),
            "mpe_megatron_vs_fsdp2": mpe(meg_lp, fsdp_lp),
            "mpe_after_2_steps_megatron_vs_fsdp2": mpe(meg_after, fsdp_after),
            "mpe_megatron_moved_by_training": mpe(meg_after, meg_lp),
            "export_keys_equal": sorted(sd) == sorted(disk) or sorted(sd) == sorted([*disk, "lm_head.weight"]),
            "export_max_abs_err_vs_bf16": max(errs),
            "megatron": meg_metrics,
            "resume_version": resumed_version,
            "resume_same_step": all(resumed[k] == meg_metrics[1][k] for k in ("loss", "grad_norm")),
            "resume_same_logprobs": all(torch.equal(a, b) for a, b in zip(resumed_after, meg_after)),
            "fsdp2": fsdp_metrics,
        }
        args.out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
