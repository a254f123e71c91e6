"""Runs the loop for a number of steps in a background thread and keeps RunState current."""

from __future__ import annotations

import logging
import threading

from protos.grpo.v1 import coordinator_pb2

from .alerts import CollapseMonitor
from .loop import GrpoLoop
from .plot import plot_run

log = logging.getLogger(__name__)

MAX_STEP = 2**63 - 1
"""The last step a run may reach: the step counters travel as protobuf integers (RunStatus.num_steps, uint64) and
into int64 metrics; beyond them every later status answer would fail to serialize."""


class Runner:
    def __init__(self, loop: GrpoLoop):
        self.loop, self.state = loop, loop.state
        self._thread: threading.Thread | None = None
        self.monitor: CollapseMonitor | None = None

    def start(self, num_steps: int) -> None:
        with self.state.lock:
            if self.state.state == coordinator_pb2.RUN_STATE_RUNNING:
                raise ValueError(f"run {self.state.run_id} is already running")
            if not 0 < num_steps <= MAX_STEP - self.state.step:
                raise ValueError(f"num_steps must be in 1..{MAX_STEP - self.state.step} at step {self.state.step}")
            self.state.state = coordinator_pb2.RUN_STATE_RUNNING
            self.state.num_steps = self.state.step + num_steps
            self.state.stop.clear()
        self._thread = threading.Thread(target=self._run, name="grpo-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.state.stop.set()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread:
            self._thread.join(timeout_s)

    def _checkpoint_on_stop(self) -> None:
        """A stopped run (StopRun, SIGTERM) saves what it completed, so that resuming loses no step. The loop
        skips it when a step was cut between Train and its end: the trainer is then ahead of the last step."""
        try:
            self.loop.checkpoint(self.state.step)
        except Exception:
            log.exception("checkpoint at stop failed; the run resumes from its previous checkpoint")

    def _watch_for_collapse(self) -> CollapseMonitor:
        """Every metrics row passes the collapse monitor before it is written (its alert/* keys join the row); a
        resumed run first rebuilds the monitor's baselines from the rows it kept."""
        if self.monitor is None:
            c = self.loop.cfg.coordinator
            num_eval_prompts = len(self.loop.feed.eval_prompts)
            self.monitor = CollapseMonitor(c.alerts, num_eval_prompts, num_completions=c.num_prompts * c.num_samples)
            self.monitor.prime(self.loop.metrics.read())
            self.loop.metrics.observers.append(self.monitor.observe)
        return self.monitor

    def _run(self) -> None:
        s = self.state
        final = coordinator_pb2.RUN_STATE_DONE
        try:
            # A resumed run: the trainer and the engines at its checkpoint.
            self.loop.checkpoints.load_pending(lambda: self.loop.refits.publish("resume"))
            monitor = self._watch_for_collapse()
            if s.step == 0 and not s.stop.is_set():
                initial = self.loop.evaluate_initial()
                if initial:
                    with s.lock:
                        s.last_eval, s.last_samples = initial, self.loop.samples.latest
                        s.alerts = monitor.status()
            while s.step < s.num_steps and not s.stop.is_set():
                m = self.loop.step(s.step + 1)
                with s.lock:
                    s.step, s.policy_version, s.last_metrics = int(m["step"]), int(m["policy_version"]), m
                    s.last_samples = self.loop.samples.latest
                    s.alerts = monitor.status()
                    if "eval/accuracy" in m:
                        s.last_eval = {k: v for k, v in m.items() if k.startswith("eval/") or k == "step"}
            if s.stop.is_set() and s.step < s.num_steps:
                final = coordinator_pb2.RUN_STATE_STOPPED
        except Exception as e:  # the run fails; the services stay up and the status says why
            log.exception("step %d failed", s.step + 1)
            final = coordinator_pb2.RUN_STATE_STOPPED if s.stop.is_set() else coordinator_pb2.RUN_STATE_FAILED
            with s.lock:
                s.error = f"step {s.step + 1}: {type(e).__name__}: {e}"
        if final == coordinator_pb2.RUN_STATE_STOPPED:
            self._checkpoint_on_stop()
        rows = self.loop.metrics.read()
        if rows:
            plot_run(rows, self.loop.run_dir / "plot.png")
        with s.lock:
            s.state = final
