"""The synchronous GRPO step (docs/architecture.md, "One GRPO step"): enqueue, collect, advantages, train, refit,
evaluate, save, record."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from protos.grpo.v1 import queue_pb2, trainer_pb2, trainer_pb2_grpc
from services.common.config import RunConfig
from services.common.queue import WorkQueue
from services.common.tasks import Prompt

from .advantages import dr_grpo_advantages, group_advantages, groups_with_signal, overlong_penalty
from .async_batches import AsyncBatches
from .batches import Batch, StepFailed, SyncBatches
from .checkpointing import Checkpoints
from .evaluation import eval_metrics
from .feed import PromptFeed
from .loggers import make_loggers
from .metrics import MetricsLog, SampleLog, env_seconds, response_metrics
from .refits import Refit, Refits
from .run_record import CoordinatorState, RunRecord
from .state import RunState


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
        self.trained_step = state.step
        """The last step sent to the trainer: a checkpoint is consistent only while it equals the state's step."""
        self.data_cursor = feed.cursor if feed else 0
        """The feed's cursor at the end of the last completed step: a step cut short has taken its prompts already,
        and a checkpoint taken then (a stopped run) must hand them out again when the step is redone."""
        self.record = RunRecord(run_dir)
        self.checkpoints = Checkpoints(cfg, trainer, self.record)
        self.refits = Refits(trainer, queue, cfg.coordinator.rpc_timeout_s)
        source = AsyncBatches if cfg.coordinator.max_staleness else SyncBatches
        self.batches = source(cfg, queue, feed, state, self.refits)
        if cfg.coordinator.dynamic_sampling:
            self.batches.has_signal = lambda g: bool(groups_with_signal([self._rewards(g)]))
        self.pending: list[Prompt] = []
        """Prompts taken from the feed but not trained at the end of the last completed step (asynchronous GRPO's
        pipeline): a checkpoint hands them out again."""

    def restore(self) -> None:
        """Continue the run of this folder from its newest complete checkpoint (run.resume)."""
        saved = self.checkpoints.restore()
        self.feed.skip_to(saved.data_cursor)
        self.train_s, self.trained_step, self.data_cursor = saved.train_s, saved.step, saved.data_cursor
        self.batches.policy_version = saved.policy_version
        self.pending = self.batches.resumed = [Prompt(**p) for p in saved.pending_prompts]
        self.metrics.start = time.time() - saved.wall_s
        # Work of the steps being redone may still sit in the prompt stream: a worker would generate it for nobody.
        self.queue.drop_run_work(self.state.run_id)
        with self.state.lock:
            self.state.step, self.state.policy_version = saved.step, saved.policy_version
            self.state.last_eval = saved.last_eval
            self.state.num_rollout_workers = saved.num_rollout_workers or self.state.num_rollout_workers

    def checkpoint(self, step: int) -> None:
        """Save the run's whole state as of the end of `step` (the trainer's and ours), unless already saved."""
        if step in (0, self.checkpoints.last_step) or step != self.trained_step:
            return
        last_eval = self.state.last_eval
        if (row := self.metrics.last) is not None and row.get("step") == step and "eval/accuracy" in row:
            last_eval = {k: v for k, v in row.items() if k.startswith("eval/") or k == "step"}
        state = CoordinatorState(
            step=step,
            policy_version=self.batches.policy_version,
            data_cursor=self.data_cursor,
            train_s=self.train_s,
            wall_s=time.time() - self.metrics.start,
            last_eval=last_eval,
            offsets=self.record.offsets(),
            num_rollout_workers=self.state.num_rollout_workers,
            pending_prompts=[dataclasses.asdict(p) for p in self.pending],
        )
        self.checkpoints.save(state)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        batch = self.batches.take(step)
        train = self.train(step, self.advantages(batch.groups))
        refit = self.refit(step)
        m = self.step_metrics(step, start, batch, train, refit)
        self.train_s += m["timing/total_s"]
        m["time/train_s"] = self.train_s
        budget_s = self.cfg.run.train_minutes * 60
        if budget_s and self.train_s >= budget_s:
            with self.state.lock:
                self.state.num_steps = step  # this step is the last: it evaluates and saves
        self.samples.write(step, batch.prompts, batch.groups, self.cfg.run.samples_per_step)
        if self.eval_due(step):
            m.update(self.evaluate(step))
        if self.save_due(step):
            m["checkpoint/policy_version"] = self.save(step)
        self.metrics.append(m)
        self.queue.trim(self.batches.read_cursor())  # what this step used: Redis memory stays flat over a long run
        self.data_cursor, self.pending = self.feed.cursor, self.batches.pending()
        if self.checkpoints.due(step, self.state.num_steps):
            self.checkpoint(step)
        return m

    def eval_due(self, step: int) -> bool:
        every = self.cfg.run.eval_every
        return bool(self.feed.eval_prompts) and (step == self.state.num_steps or bool(every and step % every == 0))

    def save_due(self, step: int) -> bool:
        every = self.cfg.run.save_every
        return step == self.state.num_steps or bool(every and step % every == 0)

    def evaluate(self, step: int) -> dict[str, float]:
        """The held-out prompts on the current weights: greedy, and k samples each for pass@k; never trained on."""
        start = time.perf_counter()
        prompts, n = self.feed.eval_prompts, len(self.feed.eval_prompts)
        groups = self.batches.held_out(step, prompts, self.cfg.run.eval_k)
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
        path = self.record.export_dir(step)
        reply = self.trainer.Save(
            trainer_pb2.SaveRequest(path=str(path.resolve()), weights_only=True),
            timeout=self.cfg.coordinator.rpc_timeout_s,
        )
        self.record.note_checkpoint({"step": step, "policy_version": reply.policy_version, "path": reply.path})
        return reply.policy_version

    def advantages(self, groups: list[queue_pb2.TrajectoryGroup]) -> list[trainer_pb2.Sequence]:
        c = self.cfg.coordinator
        rewards_PG = [self._rewards(g) for g in groups]
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
                        loss_mask=t.loss_mask,
                    )
                )
        return sequences

    def _rewards(self, group: queue_pb2.TrajectoryGroup) -> list[float]:
        """Each trajectory's reward with DAPO's overlong shaping: what the advantages are computed from."""
        return [t.reward + self._shaping(len(t.response_ids)) for t in group.trajectories]

    def _shaping(self, num_tokens: int) -> float:
        c = self.cfg.coordinator
        if not c.overlong_buffer_tokens:
            return 0.0
        return overlong_penalty(num_tokens, c.max_tokens, c.overlong_buffer_tokens, c.overlong_penalty)

    def train(self, step: int, sequences: list[trainer_pb2.Sequence]) -> trainer_pb2.TrainReply:
        self.record.note_batch(step, [s.trajectory_id for s in sequences])
        self.trained_step = step
        c = self.cfg.coordinator
        request = trainer_pb2.TrainRequest(
            step=step, sequences=sequences, temperature=c.temperature, max_tokens=c.max_tokens
        )
        return self.trainer.Train(request, timeout=self.cfg.coordinator.rpc_timeout_s)

    def refit(self, step: int) -> Refit:
        refit = self.refits.publish(f"step {step}")
        self.batches.policy_version = refit.reply.policy_version
        self.record.note_refit(step, refit)
        return refit

    def step_metrics(
        self, step: int, start: float, batch: Batch, train: trainer_pb2.TrainReply, refit: Refit
    ) -> dict[str, float]:
        publish, refit_s, groups = refit.reply, refit.seconds, batch.groups
        trajectories = [t for g in groups for t in g.trajectories]
        m = dict(train.metrics)  # the trainer's: loss, timings, mismatch, throughput/tokens_per_s_per_gpu
        m.update(
            {
                "step": step,
                "policy_version": publish.policy_version,
                "timing/generation_s": batch.generation_s,
                "timing/refit_s": refit_s,
                "avg_generated_tokens": sum(len(t.response_ids) for t in trajectories) / len(trajectories),
                "reward/mean": sum(t.reward for t in trajectories) / len(trajectories),
                "refit/bytes": publish.payload_bytes,
                "refit/GBps": publish.payload_bytes / refit_s / 1e9,
                "rollout/peak_mem_GiB": max(g.peak_mem_GiB for g in groups),  # beside the trainer's peak_mem_GiB
                **response_metrics(trajectories),
                "data/cursor": self.feed.cursor,
                "data/dropped_groups": float(batch.num_dropped),
                "data/forged_entries": float(self.queue.forged),  # unsigned or forged groups dropped so far
                "timing/total_s": time.perf_counter() - start,
            }
        )
        if self.cfg.task.episode.multi_turn:
            m["timing/env_s"] = env_seconds(groups)
        if self.cfg.coordinator.dynamic_sampling:
            m["data/refill_groups"] = float(batch.num_refilled)
        if self.cfg.coordinator.max_staleness:
            m.update(self.batches.async_metrics(batch))
        return m
