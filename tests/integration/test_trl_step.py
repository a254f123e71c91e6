"""One GRPO step of ours against TRL's own loss (the peer of bench/vs_trl.py) on the same batch: TRL 1.16's
GRPOTrainer._compute_loss with loss_type="dapo" on left-padded prompts and right-padded completions, and our
trainer Engine (packed rows, token-mean weights, the dapo objective) on the same sequences and advantages. The
gradients must agree: then comparison (a) of the head-to-head differs by sampling alone. Run as a script this file
is either side's worker: `ours` under torchrun, `trl` with TRL on PYTHONPATH."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
# 2 prompts x 4 samples, as the head-to-head; prompts of different lengths (TRL left-pads them), completions of
# different lengths (TRL right-pads them), rewards with and without signal in a group.
PROMPT_LENS = [5, 9]
RESPONSE_LENS = [[3, 8, 1, 6], [7, 2, 8, 4]]
ADVANTAGES = [[1.2, -0.4, -0.4, -0.4], [0.0, 0.0, 0.0, 0.0]]


def _batch(vocab: int) -> tuple[list[list[int]], list[list[int]], list[float]]:
    rng = random.Random(0)
    prompts, responses, advantages = [], [], []
    for p_len, r_lens, advs in zip(PROMPT_LENS, RESPONSE_LENS, ADVANTAGES):
        prompt = [rng.randrange(3, vocab) for _ in range(p_len)]
        for r_len, adv in zip(r_lens, advs):
            prompts.append(prompt)
            responses.append([rng.randrange(3, vocab) for _ in range(r_len)])
            advantages.append(adv)
    return prompts, responses, advantages


def _ours(model_dir: str, out: str) -> None:
    """Our Engine's step with SGD at lr 1 (the engine sets each step's lr from the config's schedule) and no clipping:
    parameters before minus after are the gradient."""
    import torch.distributed as dist

    from services.common.config import TrainerSection
    from services.trainer.fsdp2.build import assemble_engine, load_model
    from services.trainer.packing import Seq

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = TrainerSection(num_ranks=1, lr=1.0, loss={"name": "dapo"}, max_grad_norm=1e9, max_tokens_per_microbatch=32)
    policy = load_model(model_dir, torch.float32, cfg.fsdp2.attn_implementation)
    engine = assemble_engine(policy, None, cfg, Path(model_dir), torch.device("cpu"))
    engine.backend.optimizer = torch.optim.SGD(engine.backend.model.parameters(), lr=1.0)
    before = {k: v.clone() for k, v in engine.full_state_dict().items()}  # views of the live tensors
    prompts, responses, advantages = _batch(engine.vocab_size)
    seqs = [Seq(p, r) for p, r in zip(prompts, responses)]
    metrics = engine.train(seqs, advantages, [[0.0] * len(r) for r in responses])
    after = engine.full_state_dict()
    torch.save({"grads": {k: before[k] - after[k] for k in before}, "loss": metrics["loss"]}, out)
    dist.destroy_process_group()


def _trl(model_dir: str, out: str) -> None:
    """TRL's GRPOTrainer._compute_loss on the same batch, padded the way its generation step pads it."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = trl.GRPOConfig(
        output_dir=str(Path(out).parent / "trl"),
        num_generations=4,
        per_device_train_batch_size=8,
        loss_type="dapo",
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to=[],
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}),
        processing_class=tok,
    )
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets before the first step
    prompts, responses, advantages = _batch(model.config.vocab_size)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width_p, width_c = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([r + [pad] * (width_c - len(r)) for r in responses])
    completion_mask = torch.tensor([[1] * len(r) + [0] * (width_c - len(r)) for r in responses])
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }
    model.train()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    torch.save({"grads": grads, "loss": loss.item()}, out)


def _run(cmd: list[str], env: dict | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_our_dapo_step_has_trls_gradient(tmp_path, tiny_model):
    sys.path.insert(0, str(REPO / "bench"))
    from vs_trl import install_trl

    ours, theirs = tmp_path / "ours.pt", tmp_path / "trl.pt"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    _run([*torchrun, __file__, "ours", str(tiny_model), str(ours)])
    env = {**os.environ, "PYTHONPATH": f"{install_trl()}{os.pathsep}{REPO}"}
    _run([sys.executable, __file__, "trl", str(tiny_model), str(theirs)], env)
    got, want = torch.load(ours), torch.load(theirs)
    assert abs(got["loss"] - want["loss"]) <= 1e-6 + 1e-5 * abs(want["loss"])
    # Tied weights: TRL's named_parameters lists the embedding once, our state dict may name lm_head too.
    common = sorted(set(got["grads"]) & set(want["grads"]))
    assert len(common) == len(want["grads"]), sorted(set(want["grads"]) - set(got["grads"]))
    scale = max(want["grads"][k].abs().max().item() for k in common)
    assert scale > 0  # the batch has signal: a zero gradient on both sides would prove nothing
    worst = max((got["grads"][k] - want["grads"][k]).abs().max().item() for k in common)
    assert worst <= 1e-4 * scale, (worst, scale)


if __name__ == "__main__":
    {"ours": _ours, "trl": _trl}[sys.argv[1]](*sys.argv[2:4])
