"""The synchronous GRPO step of DESIGN.md: enqueue, collect, advantages, train, refit, evaluate, save, record."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

from protos.grpo.v1 import queue_pb2, trainer_pb2, trainer_pb2_grpc
from services.common.config import RunConfig
from services.common.queue import WorkQueue
from services.common.tasks import Prompt

from .advantages import dr_grpo_advantages, group_advantages, groups_with_signal, overlong_penalty
from .checkpointing import Checkpoints
from .evaluation import eval_metrics
from .feed import PromptFeed
from .loggers import make_loggers
from .metrics import MetricsLog, SampleLog, response_metrics
from .refits import Refits
from .run_record import CoordinatorState, RunRecord
from .state import RunState

log = logging.getLogger(__name__)

MAX_REQUEUES = 3
"""Times a prompt is enqueued again after its group came back sampled by another policy version (a worker that
joined and had not received the current weights yet) before the step goes on without it."""


class StepFailed(RuntimeError):
    """A step could not complete; the message says which part and why."""


class GrpoLoop:
    def __init__(
        self,
        cfg: RunConfig,
        queue: WorkQueue,
        trainer: trainer_pb2_grpc.TrainerStub,
        feed: PromptFeed,
        run_dir: Path,
        state: RunState,
    ):
        self.cfg, self.queue, self.trainer, self.feed = cfg, queue, trainer, feed
        self.run_dir, self.state = run_dir, state
        loggers = make_loggers(cfg.run.loggers, run_dir, state.run_id, cfg.model_dump())
        self.metrics = MetricsLog(run_dir, loggers)
        self.samples = SampleLog(run_dir)
        self.train_s = 0.0
        """Seconds of the steps so far, evaluations excluded: what run.train_minutes budgets."""
        self.policy_version = state.policy_version
        """The version every engine holds after the last refit: the only one whose groups are used."""
        self.trained_step = state.step
        """The last step sent to the trainer: a checkpoint is consistent only while it equals the state's step."""
        self.record = RunRecord(run_dir)
        self.checkpoints = Checkpoints(cfg, trainer, self.record)
        self.refits = Refits(trainer, queue, cfg.coordinator.rpc_timeout_s)

    def restore(self) -> None:
        """Continue the run of this folder from its newest complete checkpoint (run.resume)."""
        saved = self.checkpoints.restore()
        self.feed.skip_to(saved.data_cursor)
        self.train_s, self.policy_version, self.trained_step = saved.train_s, saved.policy_version, saved.step
        self.metrics.start = time.time() - saved.wall_s
        # Work of the steps being redone may still sit in the prompt stream: a worker would generate it for nobody.
        self.queue.drop_run_work(self.state.run_id)
        with self.state.lock:
            self.state.step, self.state.policy_version = saved.step, saved.policy_version
            self.state.last_eval = saved.last_eval

    def checkpoint(self, step: int) -> None:
        """Save the run's whole state as of the end of `step` (the trainer's and ours), unless already saved."""
        if step in (0, self.checkpoints.last_step) or step != self.trained_step:
            return
        last_eval = self.state.last_eval
        if (row := self.metrics.last) is not None and row.get("step") == step and "eval/accuracy" in row:
            last_eval = {k: v for k, v in row.items() if k.startswith("eval/") or k == "step"}
        state = CoordinatorState(
            step=step,
            policy_version=self.policy_version,
            data_cursor=self.feed.cursor,
            train_s=self.train_s,
            wall_s=time.time() - self.metrics.start,
            last_eval=last_eval,
            offsets=self.record.offsets(),
        )
        self.checkpoints.save(state)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        cursor = self.queue.trajectories_tail()
        prompts = self.feed.take(self.cfg.coordinator.num_prompts)
        items = self.prompt_work(step, prompts)
        self.queue.enqueue(items)
        collected = self.collect(step, cursor, items)
        generation_s = time.perf_counter() - start
        kept = [i for i, g in enumerate(collected) if g is not None]
        if not kept:
            raise StepFailed(f"step {step}: every prompt was dropped (worker logs say why)")
        prompts, groups = [prompts[i] for i in kept], [collected[i] for i in kept]
        sequences = self.advantages(groups)
        train = self.train(step, sequences)
        refit = self.refit(step)
        m = self.step_metrics(step, start, generation_s, groups, train, refit)
        m["data/dropped_groups"] = float(len(collected) - len(groups))
        self.train_s += m["timing/total_s"]
        m["time/train_s"] = self.train_s
        budget_s = self.cfg.run.train_minutes * 60
        if budget_s and self.train_s >= budget_s:
            with self.state.lock:
                self.state.num_steps = step  # this step is the last: it evaluates and saves
        self.samples.write(step, prompts, groups, self.cfg.run.samples_per_step)
        if self.eval_due(step):
            m.update(self.evaluate(step))
        if self.save_due(step):
            m["checkpoint/policy_version"] = self.save(step)
        self.metrics.append(m)
        if self.checkpoints.due(step, self.state.num_steps):
            self.checkpoint(step)
        return m

    def sampling(self, step: int, index: int, temperature: float) -> queue_pb2.SamplingParams:
        c = self.cfg.coordinator
        return queue_pb2.SamplingParams(
            temperature=temperature,
            top_p=c.top_p,
            max_tokens=c.max_tokens,
            ignore_eos=c.ignore_eos,
            seed=(self.cfg.run.seed * 1_000_003 + step * 10_007 + index) % 2**63 + 1,
        )

    def prompt_work(self, step: int, prompts: list[Prompt]) -> list[queue_pb2.PromptWork]:
        c = self.cfg.coordinator
        return [
            queue_pb2.PromptWork(
                run_id=self.state.run_id,
                step=step,
                prompt_index=i,
                prompt_ids=self.feed.renderer.ids(p),
                num_samples=c.num_samples,
                sampling=self.sampling(step, i, c.temperature),
                policy_version=self.policy_version,
                task=self.feed.task_spec(p),
            )
            for i, p in enumerate(prompts)
        ]

    def collect(
        self, step: int, cursor: str, items: list[queue_pb2.PromptWork], held_out: bool = False
    ) -> list[queue_pb2.TrajectoryGroup | None]:
        """Read trajectory groups until every item has one, or None where its prompt was dropped: rejected by a
        worker (a bad item, or one that failed on every delivery), or sampled by another policy version more
        than MAX_REQUEUES times. A group of another version is never used; its item is enqueued again."""
        want = len(items)
        got: dict[int, queue_pb2.TrajectoryGroup | None] = {}
        requeued: Counter[int] = Counter()
        deadline = time.monotonic() + self.cfg.coordinator.batch_timeout_s
        what = "held-out groups" if held_out else "groups"
        while len(got) < want:
            if self.state.stop.is_set():
                raise StepFailed("run stopped while collecting trajectories")
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"step {step}: {len(got)}/{want} {what} after coordinator.batch_timeout_s="
                    f"{self.cfg.coordinator.batch_timeout_s}s; {self._who_works()}"
                )
            self.refits.catch_up_joiners(self.policy_version)
            cursor, groups = self.queue.read_trajectories(cursor, block_ms=500)
            for g in groups:
                i = g.prompt_index
                # A re-leased item can come back twice; its ids are deterministic, the first copy wins.
                if g.run_id != self.state.run_id or g.step != step or g.eval != held_out or i >= want or i in got:
                    continue
                if not g.trajectories:
                    log.warning("step %d: prompt %d dropped, rejected by %s: %s", step, i, g.worker_id, g.error)
                    got[i] = None
                elif g.policy_version != self.policy_version:
                    if requeued[i] == MAX_REQUEUES:
                        log.warning(
                            "step %d: prompt %d dropped: stale policies sampled it %d times", step, i, MAX_REQUEUES + 1
                        )
                        got[i] = None
                        continue
                    requeued[i] += 1
                    log.warning(
                        "step %d: prompt %d came back from %s sampled by policy version %d, not %d: enqueued again",
                        step, i, g.worker_id, g.policy_version, self.policy_version,
                    )  # fmt: skip
                    self.queue.enqueue([items[i]])
                else:
                    got[i] = g
        return [got[i] for i in range(want)]

    def _who_works(self) -> str:
        """The queue and the workers as the coordinator sees them, for an error that names the wait's peers."""
        depths, now = self.queue.depths(), time.time()
        beats = {w: now - b["ts"] for w, b in self.queue.workers().items()}
        live = sorted(w for w, age in beats.items() if age < 10) or "none"
        return f"prompt items pending {depths['prompts_pending']}; workers with a heartbeat in the last 10 s: {live}"

    def eval_due(self, step: int) -> bool:
        every = self.cfg.run.eval_every
        return bool(self.feed.eval_prompts) and (step == self.state.num_steps or bool(every and step % every == 0))

    def save_due(self, step: int) -> bool:
        every = self.cfg.run.save_every
        return step == self.state.num_steps or bool(every and step % every == 0)

    def evaluate(self, step: int) -> dict[str, float]:
        """The held-out prompts on the current weights: greedy, and k samples each for pass@k; never trained on."""
        start = time.perf_counter()
        prompts, k = self.feed.eval_prompts, self.cfg.run.eval_k
        n = len(prompts)
        items = []
        for i, p in enumerate(prompts):
            ids, task = self.feed.renderer.ids(p), self.feed.task_spec(p)
            runs = [(i, 1, 0.0)] + ([(n + i, k, self.cfg.coordinator.temperature)] if k else [])
            for index, num_samples, temperature in runs:
                items.append(
                    queue_pb2.PromptWork(
                        run_id=self.state.run_id,
                        step=step,
                        prompt_index=index,
                        prompt_ids=ids,
                        num_samples=num_samples,
                        sampling=self.sampling(step, index, temperature),
                        policy_version=self.policy_version,
                        task=task,
                        eval=True,
                    )
                )
        cursor = self.queue.trajectories_tail()
        self.queue.enqueue(items)
        groups = self.collect(step, cursor, items, held_out=True)
        greedy = [(p, g) for p, g in zip(prompts, groups[:n]) if g is not None]
        if not greedy:
            raise StepFailed(f"step {step}: every held-out prompt was dropped (worker logs say why)")
        self.samples.write(step, [p for p, _ in greedy], [g for _, g in greedy], self.cfg.run.samples_per_step, True)
        sampled = [g for g in groups[n:] if g is not None]
        m = eval_metrics([g for _, g in greedy], sampled, next(iter(self.cfg.task.reward_weights())))
        m["timing/eval_s"] = time.perf_counter() - start
        return m

    def evaluate_initial(self) -> dict[str, float] | None:
        """Step 0: the held-out score of the starting weights, as its own metrics row."""
        if not self.feed.eval_prompts:
            return None
        m = {"step": 0, "policy_version": self.state.policy_version, **self.evaluate(0)}
        self.metrics.append_eval(m)
        return m

    def save(self, step: int) -> int:
        """The policy as an HF folder (weights, config, tokenizer, chat template) under checkpoints/step_N."""
        path = self.run_dir / "checkpoints" / f"step_{step}"
        reply = self.trainer.Save(
            trainer_pb2.SaveRequest(path=str(path.resolve()), weights_only=True),
            timeout=self.cfg.coordinator.rpc_timeout_s,
        )
        with (self.run_dir / "checkpoints.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "policy_version": reply.policy_version, "path": reply.path}) + "\n")
        return reply.policy_version

    def advantages(self, groups: list[queue_pb2.TrajectoryGroup]) -> list[trainer_pb2.Sequence]:
        c = self.cfg.coordinator
        rewards_PG = [[t.reward + self._shaping(len(t.response_ids)) for t in g.trajectories] for g in groups]
        kept = groups_with_signal(rewards_PG) if c.dynamic_sampling else list(range(len(groups)))
        # If no group has signal the batch still trains (all advantages 0): the loop stays uniform.
        kept = kept or list(range(len(groups)))
        advantage_fn = dr_grpo_advantages if c.advantage == "dr_grpo" else group_advantages
        sequences = []
        for p in kept:
            g = groups[p]
            for t, a in zip(g.trajectories, advantage_fn(rewards_PG[p])):
                sequences.append(
                    trainer_pb2.Sequence(
                        prompt_ids=g.prompt_ids,
                        response_ids=t.response_ids,
                        rollout_logprobs=t.logprobs,
                        advantage=a,
                        trajectory_id=t.trajectory_id,
                    )
                )
        return sequences

    def _shaping(self, num_tokens: int) -> float:
        c = self.cfg.coordinator
        if not c.overlong_buffer_tokens:
            return 0.0
        return overlong_penalty(num_tokens, c.max_tokens, c.overlong_buffer_tokens, c.overlong_penalty)

    def train(self, step: int, sequences: list[trainer_pb2.Sequence]) -> trainer_pb2.TrainReply:
        with (self.run_dir / "batches.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "trajectory_ids": [s.trajectory_id for s in sequences]}) + "\n")
        self.trained_step = step
        c = self.cfg.coordinator
        request = trainer_pb2.TrainRequest(
            step=step, sequences=sequences, temperature=c.temperature, max_tokens=c.max_tokens
        )
        return self.trainer.Train(request, timeout=self.cfg.coordinator.rpc_timeout_s)

    def refit(self, step: int) -> tuple[trainer_pb2.PublishWeightsReply, float]:
        start = time.perf_counter()
        reply = self.refits.publish(f"step {step}")
        refit_s = time.perf_counter() - start
        self.policy_version = reply.policy_version
        with (self.run_dir / "refits.jsonl").open("a") as f:
            record = {
                "step": step,
                "policy_version": reply.policy_version,
                "checksum": reply.checksum,
                "received_checksums": dict(reply.received_checksums),
                "num_readback_verified": reply.num_readback_verified,
                "payload_bytes": reply.payload_bytes,
                # Where the refit's seconds went: the trainer's gather, its publish (send, the engines'
                # loads, verification), and each engine's LoadWeights.
                "refit_s": refit_s,
                "gather_s": reply.gather_s,
                "publish_s": reply.publish_s,
                "apply_s": dict(reply.apply_s),
            }
            f.write(json.dumps(record) + "\n")
        return reply, refit_s

    def step_metrics(self, step, start, generation_s, groups, train, refit) -> dict[str, float]:
        publish, refit_s = refit
        trajectories = [t for g in groups for t in g.trajectories]
        m = dict(train.metrics)  # the trainer's: loss, timings, mismatch, throughput/tokens_per_s_per_gpu
        m.update(
            {
                "step": step,
                "policy_version": publish.policy_version,
                "timing/generation_s": generation_s,
                "timing/refit_s": refit_s,
                "avg_generated_tokens": sum(len(t.response_ids) for t in trajectories) / len(trajectories),
                "reward/mean": sum(t.reward for t in trajectories) / len(trajectories),
                "refit/bytes": publish.payload_bytes,
                "refit/GBps": publish.payload_bytes / refit_s / 1e9,
                "rollout/peak_mem_GiB": max(g.peak_mem_GiB for g in groups),  # beside the trainer's peak_mem_GiB
                **response_metrics(trajectories),
                "data/cursor": self.feed.cursor,
                "timing/total_s": time.perf_counter() - start,
            }
        )
        return m
