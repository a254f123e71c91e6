"""In-flight weight updates: keep the running requests' keys and values (PipelineRL, PRIME-RL) or recompute them with
the new weights (AReaL, and what services/rollout/vllm_engine.py does)?

    .venv/bin/python bench/inflight_kv.py --out bench/results/inflight_kv/inflight_kv_cpu.json

One vLLM engine (the rollout service's VllmEngine, vLLM's CPU build in fp32) with SmolLM2-135M-Instruct answers
--prompts arithmetic prompts x --samples samples x --max-tokens tokens (ignore_eos: equal work) in one generate call,
three times: with no load, and with new weights loaded after --switch-after decode steps, once keeping the running
requests' keys and values and once recomputing them. The new weights are the old ones moved by --lr in a random
sign per element (one Adam step's size at that learning rate), so that the two versions differ as two consecutive
versions of a run do. Per policy: the call's seconds, the decode step right after the load against the median step,
and, for every token sampled after the switch, how far the logprob the engine reported is from the new version's
logprob given the token's whole prefix (a transformers forward at the new weights, fp32): what the decoupled loss
takes as the behaviour policy, against what the token's recorded version says it was; with no load, the same
positions against the old version give the engine's own numerical floor. The old version's distance to the new one
on the same tokens is the scale: keeping the cache mixes the two.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from protos.grpo.v1 import queue_pb2  # noqa: E402
from services.common.config import RolloutSection  # noqa: E402
from services.common.tasks import Prompt, PromptRenderer  # noqa: E402
from services.rollout.engine import Request  # noqa: E402
from services.rollout.engines import make_engine  # noqa: E402


def prompts_of(model: str, n: int, seed: int) -> list[list[int]]:
    """n arithmetic prompts as the rollout sees them (the task's renderer: chat template and system prompt)."""
    renderer, rng = PromptRenderer(model, "Answer with only the final number."), random.Random(seed)
    questions = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(n)]
    return [renderer.ids(Prompt(f"What is {a} + {b}?", str(a + b))) for a, b in questions]


@torch.no_grad()
def logprobs_at(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens))
    return logp[positions, torch.tensor(tokens)]


def run(engine, requests, load, switch_after: int) -> tuple[list, float, list[float]]:
    """One generate call; `load` (or nothing) after switch_after decode steps. Returns the samples, the call's
    seconds and each decode step's seconds."""
    marks: list[float] = []

    def between_steps() -> int:
        marks.append(time.perf_counter())
        if load is not None and len(marks) == switch_after + 1:
            load()
            marks[-1] = time.perf_counter()  # the load's own time is the pause, not the next step's
        return int(load is not None and len(marks) > switch_after)

    start = time.perf_counter()
    outs = engine.generate(requests, between_steps)
    seconds = time.perf_counter() - start
    return outs, seconds, [b - a for a, b in zip(marks, marks[1:])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="runs/models/smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--switch-after", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    torch.manual_seed(0)
    old = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    names = dict(old.named_parameters())
    new_state = {n: t.detach() + args.lr * torch.sign(torch.randn_like(t)) for n, t in names.items()}
    new = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    new.load_state_dict(new_state, strict=False)
    old_named = sorted((n, t.detach().clone()) for n, t in names.items())
    new_named = sorted(new_state.items())

    engine = make_engine(RolloutSection(engine="vllm"), args.model, seed=0)
    prompts = prompts_of(args.model, args.prompts, seed=0)
    sampling = queue_pb2.SamplingParams(
        temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=11
    )
    requests = [Request(pr, args.samples, sampling) for pr in prompts]

    def keep() -> None:  # the new weights in place; the running requests' cached keys and values stay
        engine.llm.collective_rpc("load_named", args=(new_named,))

    def recompute() -> None:  # VllmEngine.load_weights: the running requests are preempted and recomputed
        engine.load_weights(new_named)

    engine.generate(requests[:2])  # warm-up
    result: dict = {}
    for name, load in (("no_load", None), ("keep", keep), ("recompute", recompute)):
        engine.load_weights(old_named)
        outs, seconds, steps = run(engine, requests, load, args.switch_after)
        row = {"call_s": round(seconds, 3), "median_step_s": round(statistics.median(steps), 4)}
        if load is not None:
            row["step_after_load_s"] = round(steps[args.switch_after], 4)
        # The tokens after the switch (the same positions with no load): the engine's logprob against the version
        # the token records, given its whole prefix. With no load that is the engine's own numerical floor.
        gaps, shift = [], []
        for prompt, samples in zip(prompts, outs):
            for s in samples:
                after = list(range(args.switch_after, len(s.token_ids)))
                assert load is None or [s.versions[i] for i in after] == [1] * len(after)
                got = torch.tensor(s.logprobs)[after]
                at_old, at_new = (
                    logprobs_at(old, prompt, s.token_ids)[after],
                    logprobs_at(new, prompt, s.token_ids)[after],
                )
                gaps.append((got - (at_old if load is None else at_new)).abs())
                shift.append((at_old - at_new).abs())
        gap, scale = torch.cat(gaps), torch.cat(shift)
        row |= {
            "tokens_after_switch": gap.numel(),
            "logprob_gap_to_recorded_version_mean": float(gap.mean()),
            "logprob_gap_to_recorded_version_max": float(gap.max()),
            "old_to_new_version_mean": float(scale.mean()),
        }
        result[name] = row
        print(name, row, flush=True)
    out = {
        "model": args.model,
        "batch": {"prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens},
        "switch_after_steps": args.switch_after,
        "lr": args.lr,
        **result,
    }
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
