"""A few GRPO steps through all four services, started the way `make run` starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common.config import dump_toml, load_config
from services.coordinator.metrics import STEP_KEYS

NUM_STEPS, NUM_PROMPTS, NUM_SAMPLES = 3, 4, 4


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(f"{pid}: {cmdline}")
    return found


def _launch(tmp_path: Path, tiny_model: Path, *overrides: str) -> subprocess.Popen:
    args = [
        f'run.output_dir="{tmp_path}"',
        'run.run_id="e2e"',
        f'model.path="{tiny_model}"',
        f"coordinator.num_prompts={NUM_PROMPTS}",
        f"coordinator.num_samples={NUM_SAMPLES}",
        *overrides,
    ]
    config = ["--config", str(Path(__file__).resolve().parents[2] / "deploy" / "configs" / "local.toml")]
    return subprocess.Popen(
        [sys.executable, "-m", "deploy.local", *config, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _logs(run_dir: Path, proc: subprocess.Popen | None = None) -> str:
    """The launcher's output and each service log's tail, for a failure message."""
    text = proc.stdout.read().decode()[-2000:] if proc else ""
    for log in sorted((run_dir / "logs").glob("*.log")):
        text += f"\n== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    return text


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_grpo_steps_through_all_services(tmp_path, tiny_model):
    proc = _launch(tmp_path, tiny_model, f"run.num_steps={NUM_STEPS}", "rollout.engine=vllm", "trainer.num_ranks=2")
    out, _ = proc.communicate(timeout=900)
    run_dir = tmp_path / "e2e"
    assert proc.returncode == 0, out.decode()[-2000:] + _logs(run_dir)

    metrics = _jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    for m in metrics:
        assert set(STEP_KEYS) <= set(m)
        assert m["policy_version"] == m["step"]
        # Trainer and rollout agree on the sampled tokens' logprobs (fp32).
        assert 1.0 <= m["mismatch/mult_prob_error"] <= 1.001
        assert m["refit/bytes"] > 0 and m["avg_generated_tokens"] == 8
        # Each process kind's peak memory: a vLLM worker and a trainer rank each hold more than 100 MiB.
        assert m["rollout/peak_mem_GiB"] > 0.1 and m["peak_mem_GiB"] > 0.1

    # After each refit the engine received exactly what the trainer sent, and what it holds
    # (where vLLM lets it be read) equals the trainer's tensors; the trainer checks both.
    refits = _jsonl(run_dir / "refits.jsonl")
    assert [r["policy_version"] for r in refits] == list(range(1, NUM_STEPS + 1))
    for r in refits:
        assert list(r["received_checksums"].values()) == [r["checksum"]]
        assert r["num_readback_verified"] >= 5
        # The breakdown adds up: gather and publish happen one after the other inside the refit, and
        # the one engine's load inside the publish.
        assert set(r["apply_s"]) == set(r["received_checksums"])
        assert 0 < r["gather_s"] and 0 < max(r["apply_s"].values()) <= r["publish_s"]
        assert r["gather_s"] + r["publish_s"] <= r["refit_s"]

    # Every prompt's trajectories land in exactly one training batch.
    batches = _jsonl(run_dir / "batches.jsonl")
    all_ids = [t for b in batches for t in b["trajectory_ids"]]
    assert len(all_ids) == len(set(all_ids)) == NUM_STEPS * NUM_PROMPTS * NUM_SAMPLES
    for b in batches:
        expected = {f"e2e/{b['step']}/{p}/{s}" for p in range(NUM_PROMPTS) for s in range(NUM_SAMPLES)}
        assert set(b["trajectory_ids"]) == expected

    # What the model wrote, a few per step; and the policy exported at the end as an HF folder.
    samples = _jsonl(run_dir / "samples.jsonl")
    assert sorted({s["step"] for s in samples}) == list(range(1, NUM_STEPS + 1))
    assert all(len(s["completion"]) <= 8 and s["policy_version"] == s["step"] - 1 for s in samples)
    exports = _jsonl(run_dir / "checkpoints.jsonl")
    [saved] = [c for c in exports if not c.get("resumable")]
    assert saved["policy_version"] == NUM_STEPS
    # and the run's whole state, resumable, at its last step
    assert [(c["step"], c["policy_version"]) for c in exports if c.get("resumable")] == [(NUM_STEPS, NUM_STEPS)]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in Path(saved["path"]).iterdir()}

    assert (run_dir / "plot.png").stat().st_size > 0
    assert b"reward" in out
    assert not _processes_mentioning(str(run_dir))


def test_bad_data_and_unknown_rewards_fail_before_any_process_starts(tmp_path, tiny_model):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "abc", "answer": "a"}\n{"prompt": 7, "answer": "b"}\n')
    stopped = tmp_path / "stopped"  # a run folder that never reached a checkpoint
    stopped.mkdir()
    (stopped / "config.toml").write_text(dump_toml(load_config(None, [f'model.path="{tiny_model}"'])))
    cases = [
        (
            ['task.name="dataset"', f'task.prompts_path="{rows}"', "task.eval_size=0"],
            "rows.jsonl: row 2: field 'prompt'",
        ),
        (['task.rewards={"no_such_reward" = 1.0}'], "task.rewards: unknown reward 'no_such_reward'"),
        (['task.rewards={"os.path:nope" = 1.0}'], "cannot import reward 'os.path:nope'"),
        ([f'run.resume="{stopped}"'], "holds no complete checkpoint"),
    ]
    for overrides, message in cases:
        proc = _launch(tmp_path, tiny_model, *overrides)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 2, out.decode()
        errors = [line for line in out.decode().splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0], out.decode()
        assert not (tmp_path / "e2e" / "logs").exists()


def test_ctrl_c_stops_every_process(tmp_path, tiny_model):
    proc = _launch(tmp_path, tiny_model, "run.num_steps=1000", "rollout.engine=hf", "trainer.num_ranks=2")
    metrics = tmp_path / "e2e" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text()):
        assert proc.poll() is None, _logs(tmp_path / "e2e", proc)
        assert time.monotonic() < deadline, "no step finished within 300 s"
        time.sleep(0.5)
    assert _processes_mentioning(str(tmp_path / "e2e"))
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        pytest.fail(f"launcher still running 60 s after Ctrl-C:\n{(e.output or b'')[-3000:].decode(errors='replace')}")
    assert proc.returncode != 0
    assert not _processes_mentioning(str(tmp_path / "e2e"))
