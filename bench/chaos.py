"""`make chaos`: one 60-step local run under 30 seeded kill -9s (rollout workers, Redis, trainer, weightsync,
coordinator) against an uninterrupted run of the same config and seed; writes bench/results/chaos/chaos.json.

Checks: every step once, each trajectory trained at most once (`duplicated`), every prompt x sample of every step
in its batch (`lost`), and every step's deterministic metrics and batch equal to the uninterrupted run's."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import tomllib
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from deploy.ranks import launches_ranks  # noqa: E402

RUN_ID, NUM_STEPS, NUM_PROMPTS, NUM_SAMPLES = "chaos", 60, 4, 4
FAULTS = {"rollout_worker": 20, "redis": 5, "trainer": 3, "weightsync": 1, "coordinator": 1}
RESUMING = ("trainer", "weightsync", "coordinator")
"""Faults whose death makes the launcher stop everything and resume from the newest checkpoint."""
VICTIM = {"trainer": "-m services.trainer.main", "weightsync": "-m services.weightsync.main",
          "coordinator": "-m services.coordinator.main", "rollout_worker": "-m services.rollout.main"}  # fmt: skip
REWARD_SLEEP_S = 0.4
"""The toy model's step takes ~0.1 s; the reward's sleep stretches it to ~5 s (no CPU spent), so 30 faults, each
with its restart, spread over 60 steps instead of landing on a run that is already over."""
OVERRIDES = [
    f'run.run_id="{RUN_ID}"', f"run.num_steps={NUM_STEPS}", "run.checkpoint_every=5", "run.max_restarts=10",
    f"coordinator.num_prompts={NUM_PROMPTS}", f"coordinator.num_samples={NUM_SAMPLES}", "rollout.num_workers=2",
    "rollout.max_restarts=20", "rollout.lease_timeout_s=3", "trainer.num_ranks=1",
    'task.rewards={"chaos:slow_toy_reward" = 1.0}',
]  # fmt: skip
# Keys a run writes that are not a function of its data and weights (tests/integration/test_resume.py).
NOT_DETERMINISTIC = ("timing/", "time/", "throughput/", "refit/GBps", "peak_mem", "rollout/peak_mem_GiB", "gc/")


def slow_toy_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """The built-in toy reward, after a sleep (see REWARD_SLEEP_S)."""
    from services.common.rewards import class_continuation_reward

    time.sleep(REWARD_SLEEP_S)
    return class_continuation_reward(prompt, completion, answer, metadata)


@dataclass
class Fault:
    kind: str
    at_step: int
    """Fired once the run has completed this step (its highest step so far), after delay_s more."""
    delay_s: float
    fired_s: float | None = None
    """Seconds from the launch to the kill."""
    target: str = ""
    pid: int = 0
    recover_s: float | None = None
    resumed_from_step: int | None = None
    redone_steps: list[int] | None = None


def schedule(rng: random.Random) -> list[Fault]:
    """Workers and Redis anywhere in steps 1..57; the five resuming faults after the first checkpoint (step 5), at
    least 8 steps apart, so each resume has a newer checkpoint and redoes at most a few steps."""
    while True:
        steps = sorted(rng.sample(range(7, NUM_STEPS - 3), len(RESUMING) + 2))
        if all(b - a >= 8 for a, b in zip(steps, steps[1:])):
            break
    kinds = [k for k in RESUMING for _ in range(FAULTS[k])]
    rng.shuffle(kinds)
    faults = [Fault(k, s, rng.uniform(0, 4)) for k, s in zip(kinds, steps)]
    faults += [Fault(k, rng.randint(1, NUM_STEPS - 3), rng.uniform(0, 4)) for k in ("rollout_worker", "redis")
               for _ in range(FAULTS[k])]  # fmt: skip
    return sorted(faults, key=lambda f: (f.at_step, f.delay_s))


def processes(mentioning: str) -> list[tuple[int, str]]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mentioning in cmdline:
            found.append((int(pid), cmdline))
    return found


def victims(kind: str, run_dir: Path) -> list[tuple[int, str]]:
    """(pid, name) of the live processes a fault of this kind may kill: the service's own python process, never
    its deploy.guard parent nor torchrun's agent; Redis by the name it gives itself."""
    if kind == "redis":
        port = tomllib.loads((run_dir / "config.toml").read_text())["redis"]["port"]
        return [(pid, "redis") for pid, _ in processes(f"redis-server 127.0.0.1:{port}")]
    found = []
    for pid, cmd in processes(str(run_dir)):
        if VICTIM[kind] in cmd and "deploy.guard" not in cmd and not launches_ranks(cmd):
            index = re.search(r"--worker-index (\d+)", cmd)
            found.append((pid, f"rollout-{index.group(1)}" if index else kind))
    return found


def jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return rows


def status(out: Path) -> dict | None:
    urls = re.findall(r"status: (http://\S+/status)", out.read_text(errors="replace"))
    try:
        with urllib.request.urlopen(urls[-1], timeout=1) as reply:
            return json.load(reply)
    except (IndexError, OSError, ValueError):
        return None


def worker_back(fault: Fault, out: Path) -> bool:
    """A new process of the killed worker heartbeats at the run's current policy version (it has its weights)."""
    s = status(out)
    if s is None:
        return False
    return any(
        name.startswith(f"{fault.target}@") and not name.endswith(f":{fault.pid}")
        and beat["policy_version"] == s["policy_version"] and beat["age_s"] < 5
        for name, beat in s["workers"].items()
    )  # fmt: skip


class Chaos:
    """Fires the schedule against a running launcher and times each fault's recovery."""

    def __init__(self, faults: list[Fault], run_dir: Path, out: Path, rng: random.Random):
        self.faults, self.run_dir, self.out, self.rng = faults, run_dir, out, rng
        self.t0 = time.monotonic()
        self.rows: list[dict] = []
        self.high_step, self.high_at = 0, self.t0
        self.new_rows_at: list[float] = []
        """When the watcher saw each newly appended metrics row (also redone steps after a resume)."""

    def poll(self) -> None:
        rows = jsonl(self.run_dir / "metrics.jsonl")
        same = next((i for i, (a, b) in enumerate(zip(self.rows, rows)) if a != b), min(len(self.rows), len(rows)))
        self.new_rows_at += [time.monotonic()] * (len(rows) - same)
        self.rows = rows
        if rows and rows[-1]["step"] > self.high_step:
            self.high_step, self.high_at = rows[-1]["step"], time.monotonic()
        for f in self.faults:
            if f.fired_s is not None and f.recover_s is None and self.recovered(f):
                f.recover_s = round(time.monotonic() - self.t0 - f.fired_s, 2)
        self.fire_next()

    def step_since(self, fired_s: float) -> bool:
        return any(t - self.t0 > fired_s for t in self.new_rows_at)

    def recovered(self, f: Fault) -> bool:
        if f.kind == "rollout_worker":
            return worker_back(f, self.out)
        if f.kind == "redis":
            return bool(victims("redis", self.run_dir)) and self.step_since(f.fired_s)
        resumes = re.findall(r"died: resuming the run from step (\d+)", self.out.read_text(errors="replace"))
        fired = [g for g in self.faults if g.kind in RESUMING and g.fired_s is not None]
        if len(resumes) < len(fired) or not self.step_since(f.fired_s):
            return False
        f.resumed_from_step = int(resumes[fired.index(f)])
        f.redone_steps = list(range(f.resumed_from_step + 1, f.at_step + 1))
        return True

    def fire_next(self) -> None:
        pending = [f for f in self.faults if f.fired_s is None]
        if not pending:
            return
        f = pending[0]
        if self.high_step < f.at_step or time.monotonic() - self.high_at < f.delay_s:
            return
        # Every fault waits out a resume in progress (its services are being started again), and Redis its own.
        busy = [g for g in self.faults if g.fired_s is not None and g.recover_s is None]
        if any(g.kind in RESUMING or (g.kind == f.kind == "redis") for g in busy):
            return
        candidates = victims(f.kind, self.run_dir)
        if not candidates or (f.kind in RESUMING and not (self.run_dir / "resume").exists()):
            return
        f.pid, f.target = self.rng.choice(sorted(candidates))
        os.kill(f.pid, signal.SIGKILL)
        f.fired_s, f.at_step = round(time.monotonic() - self.t0, 2), self.high_step
        print(f"chaos: t={f.fired_s:.0f}s step {f.at_step}: kill -9 {f.target} (pid {f.pid})", flush=True)


def launch(output_dir: Path, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "deploy.local", "--config", "deploy/configs/local.toml",
           f'run.output_dir="{output_dir}"', *OVERRIDES]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), os.environ.get("PYTHONPATH", "")])}
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT)


def run(output_dir: Path, chaos_seed: int | None) -> tuple[int, float, list[Fault]]:
    """One run to its end (and its faults, with a seed); returns the launcher's exit status, wall seconds, faults."""
    out = output_dir / "launcher.out"
    proc, t0 = launch(output_dir, out), time.monotonic()
    rng = random.Random(chaos_seed)
    chaos = Chaos(schedule(rng), output_dir / RUN_ID, out, rng) if chaos_seed is not None else None
    try:
        while proc.poll() is None:
            if chaos is not None:
                chaos.poll()
            time.sleep(0.25)
    finally:
        proc.kill()
    if chaos is not None:
        chaos.poll()
    return proc.returncode, round(time.monotonic() - t0, 1), chaos.faults if chaos else []


def deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(k.startswith(p) or p in k for p in NOT_DETERMINISTIC)}


def checks(run_dir: Path, reference_dir: Path) -> dict:
    rows, batches = jsonl(run_dir / "metrics.jsonl"), jsonl(run_dir / "batches.jsonl")
    ids = [t for b in batches for t in b["trajectory_ids"]]
    expected = {f"{RUN_ID}/{s}/{p}/{k}" for s in range(1, NUM_STEPS + 1) for p in range(NUM_PROMPTS)
                for k in range(NUM_SAMPLES)}  # fmt: skip
    ref_rows = {r["step"]: deterministic(r) for r in jsonl(reference_dir / "metrics.jsonl")}
    ref_batches = {b["step"]: b for b in jsonl(reference_dir / "batches.jsonl")}
    unequal = set({r["step"] for r in rows if ref_rows.get(r["step"]) != deterministic(r)}
                     | {b["step"] for b in batches if ref_batches.get(b["step"]) != b})  # fmt: skip
    # Trajectory ids name (step, prompt index, sample), not the prompt: the prompts themselves come from samples.jsonl
    # (run.samples_per_step of them a step), so a resume that hands out the wrong prompts shows here.
    prompts = [(r["step"], r["prompt"]) for r in jsonl(run_dir / "samples.jsonl") if not r["eval"]]
    ref_prompts = [(r["step"], r["prompt"]) for r in jsonl(reference_dir / "samples.jsonl") if not r["eval"]]
    unequal |= {s for s, _ in set(prompts) ^ set(ref_prompts)}
    unequal_keys = sorted(
        {k for r in rows for k, v in deterministic(r).items() if ref_rows.get(r["step"], {}).get(k) != v}
    )
    return {
        "steps_completed": len({r["step"] for r in rows}),
        "steps_once": [r["step"] for r in rows] == list(range(1, NUM_STEPS + 1))
        and [b["step"] for b in batches] == list(range(1, NUM_STEPS + 1)),
        "lost": len(expected - set(ids)),
        "duplicated": len(ids) - len(set(ids)),
        "dropped_groups": sum(r.get("data/dropped_groups", 0) for r in rows),
        "unequal_steps": sorted(unequal),
        "prompts_not_trained": len({p for _, p in ref_prompts} - {p for _, p in prompts}),
        "unequal_keys": unequal_keys,
    }


def check_result(faulted: Path, reference: Path, reference_ok: bool) -> dict:
    """The top-level keys of the result: the headline checks first."""
    c = checks(faulted / RUN_ID, reference / RUN_ID)
    head = {k: c.pop(k) for k in ("lost", "duplicated", "steps_completed")}
    return {**head, "resumed_equal": not c["unequal_steps"] and reference_ok, **c}


def summary(faults: list[Fault]) -> dict:
    out = {}
    for kind in FAULTS:
        fired = [f for f in faults if f.kind == kind and f.fired_s is not None]
        times = [f.recover_s for f in fired if f.recover_s is not None]
        out[kind] = {
            "scheduled": FAULTS[kind], "count": len(fired), "recovered": len(times),
            "recover_s_median": round(statistics.median(times), 1) if times else None,
            "recover_s_max": max(times) if times else None,
        }  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the faults' RNG (the run's own seed is run.seed)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "bench_chaos")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "chaos" / "chaos.json")
    parser.add_argument("--recheck", action="store_true", help="only the checks, on the existing run folders")
    a = parser.parse_args()
    reference, faulted = a.output_dir / "reference", a.output_dir / "faults"
    if a.recheck:  # the checks again, on the run folders of the last `make chaos` (its faults are in a.out)
        result = json.loads(a.out.read_text())
        result.update(check_result(faulted, reference, result["reference_exit_code"] == 0))
        write_result(a.out, result)
        return 0
    for d in (reference, faulted):
        subprocess.run(["rm", "-rf", str(d)], check=True)
    print("chaos: the run under faults", flush=True)
    rc, wall_s, faults = run(faulted, a.seed)
    print(f"chaos: exited {rc} after {wall_s}s; the uninterrupted reference run", flush=True)
    ref_rc, ref_wall_s, _ = run(reference, None)
    redone = sorted({s for f in faults for s in (f.redone_steps or [])})
    result = {
        "faults": summary(faults),
        **check_result(faulted, reference, ref_rc == 0),
        "resumed_steps": redone,
        "exit_code": rc, "reference_exit_code": ref_rc, "wall_s": wall_s, "reference_wall_s": ref_wall_s,
        "config": ["deploy/configs/local.toml", *OVERRIDES, f"reward sleep {REWARD_SLEEP_S}s"],
        "fault_log": [asdict(f) for f in sorted(faults, key=lambda f: f.fired_s if f.fired_s is not None else 1e9)],
    }  # fmt: skip
    write_result(a.out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("fault_log", "config")}, indent=2))
    ok = rc == 0 and result["steps_once"] and not result["lost"] and not result["duplicated"]
    return 0 if ok and result["resumed_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
