"""The engine's options under torchrun (2 gloo ranks): activation checkpointing, offload, transformers' sdpa
mask, unshared prompts, the fused logprob head and bf16 against the default fp32 step, and the GSPO / Dr.GRPO /
IS / entropy / k1 objectives against an unsharded, unpacked single-process step. Run as a script, this file is
the worker of every rank."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

LR, KL_BETA = 1e-3, 0.1
BASE = {"lr": LR, "weight_decay": 0.01, "loss": {"kl_beta": KL_BETA}, "max_tokens_per_microbatch": 16}
SAME_AS_BASE = {
    "ac_layer": {"memory": {"activation_checkpointing": "layer"}},
    "ac_selective": {"memory": {"activation_checkpointing": "selective"}},
    "offload": {"fsdp2": {"cpu_offload": True, "ref_cpu_offload": True}},
    "sdpa_mask": {"fsdp2": {"attn_implementation": "sdpa"}},
    "unshared_prompts": {"fsdp2": {"share_prompts": False}},
    "chunked_logprobs": {"memory": {"logprob_chunk_tokens": 3}},
}
# Recomputation and offload redo the same ops in the same order: bit-identical. Masked attention over the
# whole row sums in another order, and AdamW's normalisation lifts that float noise to ~1e-6 in the parameters.
# The fused head's logsumexp rounds differently from log_softmax: the same ~1e-6 after AdamW.
# A shared prompt's attention runs under a mask: the same float noise.
TOLERANCE = {
    "ac_layer": 0.0,
    "ac_selective": 0.0,
    "offload": 0.0,
    "sdpa_mask": 1e-5,
    "unshared_prompts": 1e-5,
    "chunked_logprobs": 1e-5,
}
AGAINST_REFERENCE = {
    "base": {},
    "gspo_sequence_is": {
        "loss": {
            "name": "gspo",
            "clip_eps_low": 3e-4,
            "clip_eps_high": 4e-4,
            "importance_sampling": "sequence",
            "is_truncation": 1.5,
            "kl_estimator": "k1",
            "entropy_coef": 0.01,
        }
    },
    "dr_grpo_token_is": {"loss": {"name": "dr_grpo", "dr_grpo_norm_tokens": 12, "importance_sampling": "token"}},
    # Two AdamW steps: the second mini-batch's ratio is measured from pi_old, the policy before the first;
    # a large step and a narrow clip range make it leave the range, so a wrong anchor changes the update.
    "minibatches": {"minibatches": 2, "lr": 0.01, "loss": {"clip_eps": 0.002}},
    # The lr schedule against transformers' own scheduler (TRL's): the first of two AdamW steps is warmup step 0
    # (lr 0: only the moments move), the second runs at the full lr of a linear decay over 4 steps.
    "lr_warmup_linear": {
        "minibatches": 2,
        "lr": 0.01,
        "loss": {"clip_eps": 0.002},
        "lr_schedule": "linear",
        "lr_warmup_steps": 1,
        "lr_schedule_steps": 4,
    },
    # Multi-turn episodes: tokens an environment wrote (rollout logprob 0.0, as the worker leaves them) stay out of
    # the loss, the KL, the entropy, the normalisers and the per-sequence ratios; the reference drops them.
    "multiturn_token_mean": {"loss": {"importance_sampling": "token", "entropy_coef": 0.01}},
    "multiturn_gspo": {
        "loss": {"name": "gspo", "importance_sampling": "sequence", "is_truncation": 1e6, "entropy_coef": 0.01}
    },
}
MASKED = {"multiturn_token_mean", "multiturn_gspo"}
# AdamW's first steps move every parameter by ~lr whatever its gradient's size, so float noise in the
# gradients shows up in proportion to lr: 10x the base lr for the mini-batch case (a wrong pi_old is off by 2e-2).
PARAM_TOLERANCE = {"minibatches": 2e-4, "lr_warmup_linear": 2e-4}
CASES = {**AGAINST_REFERENCE, **SAME_AS_BASE, "bf16": {"dtype": "bfloat16"}}


def _fields(name: str) -> dict:
    """TrainerSection's fields of a case: BASE with the case on top, subsection by subsection."""
    out = dict(BASE)
    for key, value in CASES[name].items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def _batch(vocab: int):
    from services.trainer.packing import Seq

    # Sequences 1 and 2 answer one prompt: with share_prompts their block is 3 + 5 + 5 tokens, so with 16 per
    # micro-batch rank 0 runs one micro-batch (16 tokens), rank 1 two (13 and 8); unshared, 16 + 8 + 8 + 8.
    rng = random.Random(0)
    shapes = [(6, 10, 1.0), (3, 5, -0.5), (3, 5, 0.25), (2, 6, -1.0)]
    prompts = [[rng.randrange(vocab) for _ in range(p)] for p, _, _ in shapes]
    prompts[2] = prompts[1]
    seqs = [Seq(prompt, [rng.randrange(vocab) for _ in range(r)]) for prompt, (_, r, _) in zip(prompts, shapes)]
    rollout = [[-rng.uniform(4.0, 4.6) for _ in range(r)] for _, r, _ in shapes]
    return seqs, [a for _, _, a in shapes], rollout


def _episodes(seqs, rollout):
    """The batch as multi-turn episodes: some response tokens are an environment's (a tool result after a model
    turn), with rollout logprob 0.0 as the worker leaves them."""
    from services.trainer.packing import Seq

    masks = [[1] * 3 + [0] * 4 + [1] * 3, [1] * 5, [1, 1, 0, 0, 1], [1, 0, 0, 0, 1, 1]]
    episodes = [Seq(s.prompt_ids, s.response_ids, [bool(m) for m in mask]) for s, mask in zip(seqs, masks)]
    rollout = [[lp if m else 0.0 for lp, m in zip(lps, mask)] for lps, mask in zip(rollout, masks)]
    return episodes, rollout


def _reference_step(model_dir: str, cfg, seqs, advantages, rollout) -> tuple[dict, dict]:
    """The same step in one process: every sequence unpacked, the objective summed with its weights; with
    cfg.minibatches = 2, two AdamW steps on the halves, pi_old being the policy before the first."""
    from transformers import get_scheduler

    from services.trainer.fsdp2.build import load_model
    from services.trainer.lr_schedule import TRANSFORMERS_NAMES

    model, ref = load_model(model_dir, torch.float32, "sdpa"), load_model(model_dir, torch.float32, "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    optimizer.schedule = get_scheduler(  # transformers' formulas, stepped after each optimizer step
        TRANSFORMERS_NAMES[cfg.lr_schedule],
        optimizer,
        num_warmup_steps=cfg.lr_warmup_steps,
        num_training_steps=cfg.lr_schedule_steps,
    )
    if cfg.minibatches == 1:
        return _reference_update(model, ref, optimizer, cfg, seqs, advantages, rollout, None)
    assert cfg.minibatches == 2 and len(seqs) == 4
    with torch.no_grad():
        old = [_logprobs(model, s)[0] for s in seqs]
    losses = []
    for half in (slice(0, 2), slice(2, 4)):
        params, metrics = _reference_update(
            model, ref, optimizer, cfg, seqs[half], advantages[half], rollout[half], old[half]
        )
        losses.append(metrics["loss"])
    return params, {"loss": sum(losses) / 2}  # the engine reports the mean over its optimizer steps


def _logprobs(model, s):
    from services.trainer.losses import token_logprobs_and_entropy

    ids, p = torch.tensor([s.prompt_ids + s.response_ids]), len(s.prompt_ids)
    return token_logprobs_and_entropy(model(input_ids=ids).logits[0, p - 1 : -1], torch.tensor(s.response_ids))


def _reference_update(model, ref, optimizer, cfg, seqs, advantages, rollout, old) -> tuple[dict, dict]:
    """An environment's tokens (a sequence's loss_mask) are dropped after the forward: the objective sees the
    policy's tokens only, unmasked."""
    from services.trainer.objective import TokenInputs, loss_weights, token_objective

    keep = [torch.tensor(s.mask()) > 0 for s in seqs]
    lens = torch.tensor([int(k.sum()) for k in keep])
    weights = loss_weights(cfg.loss, lens).split(lens.tolist())
    total, sums = 0.0, {"kl": 0.0, "entropy": 0.0, "mismatch/is_weight_mean": 0.0}
    for i, (s, adv, roll, w, k) in enumerate(zip(seqs, advantages, rollout, weights, keep)):
        logp, entropy = (t[k] for t in _logprobs(model, s))
        with torch.no_grad():
            ref_logp = _logprobs(ref, s)[0][k]
        x = TokenInputs(
            logp_R=logp,
            old_logp_R=logp.detach() if old is None else old[i][k],
            advantages_R=torch.full_like(logp, adv),
            rollout_logp_R=torch.tensor(roll)[k],
            ref_logp_R=ref_logp,
            entropy_R=entropy if cfg.loss.entropy_coef > 0 else None,
            segment_R=torch.zeros(len(logp), dtype=torch.long),
            num_segments=1,
        )
        terms = token_objective(cfg.loss, x)
        total = total + (terms.loss_R * w).sum()
        for key, values in (("kl", terms.kl_R), ("entropy", entropy), ("mismatch/is_weight_mean", terms.is_weight_R)):
            sums[key] += values.sum().item() / lens.sum().item()
    total.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item()
    optimizer.step()
    optimizer.schedule.step()
    optimizer.zero_grad()
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return params, {"loss": total.item(), "grad_norm": grad_norm, **sums}


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _worker(model_dir: str, out: str, names: str = ",".join(CASES)) -> None:
    import torch.distributed as dist

    from services.common.config import TrainerSection
    from services.trainer.fsdp2.build import assemble_engine, load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    batch = _batch(vocab=78)
    episodes = (*_episodes(batch[0], batch[2]), batch[1])
    results, params = {}, {}
    for name in names.split(","):
        seqs, rollout, advantages = episodes if name in MASKED else (batch[0], batch[2], batch[1])
        cfg = TrainerSection(**_fields(name))
        policy = load_model(model_dir, torch.float32, cfg.fsdp2.attn_implementation)
        ref = load_model(model_dir, torch.float32, cfg.fsdp2.attn_implementation)
        engine = assemble_engine(policy, ref, cfg, Path(model_dir), torch.device("cpu"))
        engine.full_state_dict(on_device=True)  # the refit's gather takes its references before the step
        metrics = engine.train(seqs, advantages, rollout)
        params[name] = engine.full_state_dict()
        # The refit's gather (left on the device, cast to the engine's dtype) holds the same values: the step's.
        kept = engine.full_state_dict(on_device=True, dtype=torch.bfloat16)
        if dist.get_rank() == 0:
            results[name] = {"metrics": metrics, "dtypes": sorted({str(t.dtype) for t in params[name].values()})}
            cast = {k: v.to(torch.bfloat16) for k, v in params[name].items()}
            results[name]["on_device_equal"] = kept.keys() == cast.keys() and all(
                torch.equal(kept[k], cast[k]) for k in kept
            )
            if name in AGAINST_REFERENCE:
                expected_params, expected = _reference_step(model_dir, cfg, seqs, advantages, rollout)
                results[name].update(expected=expected, param_diff=_max_diff(params[name], expected_params))
            else:
                results[name]["diff_to_base"] = _max_diff(params[name], params["base"])
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def _run(tmp_path_factory, tiny_model, ranks: int, names: list[str]) -> dict:
    out = tmp_path_factory.mktemp("engine") / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), __file__]
    proc = subprocess.run(
        [*cmd, str(tiny_model), str(out), ",".join(names)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model) -> dict:
    return _run(tmp_path_factory, tiny_model, 2, list(CASES))


def test_one_rank_accumulates_unsharded_and_matches_the_reference(tmp_path_factory, tiny_model):
    """On one rank the engine skips FSDP's reduce and re-gather between its 3 micro-batches (gradients
    accumulate unsharded); the step is still the unsharded, unpacked one."""
    got = _run(tmp_path_factory, tiny_model, 1, ["base", "minibatches", "bf16"])
    for name in ("base", "minibatches"):
        row = got[name]
        assert row["param_diff"] < PARAM_TOLERANCE.get(name, 1e-5), (name, row["param_diff"])
        assert row["metrics"]["loss"] == pytest.approx(row["expected"]["loss"], rel=1e-4, abs=1e-6), name
        assert row["on_device_equal"], name  # the one-rank refit gather takes the local shard: the same values
    # One FSDP2 rank in bf16 (the GPU's path) keeps its layers unsharded after forward: the refit's references,
    # taken before the step, must still be the fp32 masters the optimizer updated, not the bf16 compute copies.
    assert got["bf16"]["on_device_equal"]


@pytest.mark.parametrize("name", list(AGAINST_REFERENCE))
def test_objectives_match_an_unsharded_unpacked_step(results, name):
    got = results[name]
    assert got["param_diff"] < PARAM_TOLERANCE.get(name, 1e-5), got["param_diff"]
    for key, value in got["expected"].items():
        if key in got["metrics"]:
            assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    loss = CASES[name].get("loss", {})
    assert ("entropy" in got["metrics"]) == (loss.get("entropy_coef", 0) > 0)
    assert ("mismatch/is_weight_mean" in got["metrics"]) == (loss.get("importance_sampling", "off") != "off")


@pytest.mark.parametrize("name", list(CASES))
def test_the_refit_gather_on_the_device_equals_the_host_gather(results, name):
    assert results[name]["on_device_equal"]


@pytest.mark.parametrize("name", list(SAME_AS_BASE))
def test_memory_options_do_not_change_the_step(results, name):
    assert results[name]["diff_to_base"] <= TOLERANCE[name]
    assert results[name]["metrics"]["loss"] == pytest.approx(results["base"]["metrics"]["loss"], abs=1e-6)


def test_bf16_compute_keeps_fp32_master_weights_and_stays_close(results):
    bf16, base = results["bf16"], results["base"]
    assert bf16["dtypes"] == ["torch.float32"]
    assert bf16["diff_to_base"] < 5e-2
    assert bf16["metrics"]["grad_norm"] == pytest.approx(base["metrics"]["grad_norm"], rel=5e-2)
    assert all(math.isfinite(v) for v in bf16["metrics"].values())


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
