"""The synchronous GRPO step of DESIGN.md: enqueue, collect, advantages, train, refit, record."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

from protos.grpo.v1 import queue_pb2, trainer_pb2, trainer_pb2_grpc
from services.common.config import RunConfig
from services.common.queue import WorkQueue
from services.common.tasks import Prompt
from services.common.tokenizer import Vocab

from .advantages import dr_grpo_advantages, group_advantages, groups_with_signal, overlong_penalty
from .metrics import MetricsLog
from .state import RunState


class StepFailed(RuntimeError):
    """A step could not complete; the message says which part and why."""


class GrpoLoop:
    def __init__(
        self,
        cfg: RunConfig,
        queue: WorkQueue,
        trainer: trainer_pb2_grpc.TrainerStub,
        prompts: Iterator[Prompt],
        vocab: Vocab,
        run_dir: Path,
        state: RunState,
    ):
        self.cfg, self.queue, self.trainer, self.prompts, self.vocab = cfg, queue, trainer, prompts, vocab
        self.run_dir, self.state = run_dir, state
        self.metrics = MetricsLog(run_dir)

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        cursor = self.queue.trajectories_tail()
        self.enqueue_prompts(step)
        groups = self.collect(step, cursor)
        generation_s = time.perf_counter() - start
        sequences = self.advantages(groups)
        train = self.train(step, sequences)
        refit = self.refit(step)
        return self.record(step, start, generation_s, groups, train, refit)

    def enqueue_prompts(self, step: int) -> None:
        c = self.cfg.coordinator
        items = []
        for i in range(c.num_prompts):
            p = next(self.prompts)
            sampling = queue_pb2.SamplingParams(
                temperature=c.temperature,
                top_p=c.top_p,
                max_tokens=c.max_tokens,
                ignore_eos=c.ignore_eos,
                seed=(self.cfg.run.seed * 1_000_003 + step * 10_007 + i) % 2**63 + 1,
            )
            items.append(
                queue_pb2.PromptWork(
                    run_id=self.state.run_id,
                    step=step,
                    prompt_index=i,
                    prompt_ids=self.vocab.encode(p.text),
                    num_samples=c.num_samples,
                    sampling=sampling,
                    policy_version=self.state.policy_version,
                    task=queue_pb2.TaskSpec(name=p.reward, answer=p.answer),
                )
            )
        self.queue.enqueue(items)

    def collect(self, step: int, cursor: str) -> list[queue_pb2.TrajectoryGroup]:
        """Read trajectory groups until every prompt of this step has one; duplicates are dropped."""
        want = self.cfg.coordinator.num_prompts
        got: dict[int, queue_pb2.TrajectoryGroup] = {}
        deadline = time.monotonic() + self.cfg.coordinator.batch_timeout_s
        while len(got) < want:
            if self.state.stop.is_set():
                raise StepFailed("run stopped while collecting trajectories")
            if time.monotonic() > deadline:
                raise StepFailed(f"step {step}: {len(got)}/{want} groups after {self.cfg.coordinator.batch_timeout_s}s")
            cursor, groups = self.queue.read_trajectories(cursor, block_ms=500)
            for g in groups:
                # A re-leased item can come back twice; its ids are deterministic, the first copy wins.
                if g.run_id == self.state.run_id and g.step == step and g.prompt_index not in got:
                    if not g.trajectories:
                        raise StepFailed(f"step {step}: prompt {g.prompt_index} was rejected by {g.worker_id}")
                    got[g.prompt_index] = g
        return [got[i] for i in range(want)]

    def advantages(self, groups: list[queue_pb2.TrajectoryGroup]) -> list[trainer_pb2.Sequence]:
        c = self.cfg.coordinator
        rewards_PG = [[t.reward + self._shaping(len(t.response_ids)) for t in g.trajectories] for g in groups]
        kept = groups_with_signal(rewards_PG) if c.dynamic_sampling else list(range(len(groups)))
        # If no group has signal the batch still trains (all advantages 0): the loop stays uniform.
        kept = kept or list(range(len(groups)))
        advantage_fn = dr_grpo_advantages if self.cfg.trainer.loss == "dr_grpo" else group_advantages
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
        request = trainer_pb2.TrainRequest(step=step, sequences=sequences)
        return self.trainer.Train(request, timeout=self.cfg.coordinator.rpc_timeout_s)

    def refit(self, step: int) -> tuple[trainer_pb2.PublishWeightsReply, float]:
        start = time.perf_counter()
        reply = self.trainer.PublishWeights(
            trainer_pb2.PublishWeightsRequest(timeout_s=self.cfg.weightsync.timeout_s),
            timeout=self.cfg.weightsync.timeout_s + 30,
        )
        refit_s = time.perf_counter() - start
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
                "publish_s": reply.refit_s,
                "apply_s": dict(reply.apply_s),
            }
            f.write(json.dumps(record) + "\n")
        return reply, refit_s

    def record(self, step, start, generation_s, groups, train, refit) -> dict[str, float]:
        publish, refit_s = refit
        trajectories = [t for g in groups for t in g.trajectories]
        m = dict(train.metrics)
        num_tokens = sum(len(g.prompt_ids) * len(g.trajectories) for g in groups)
        num_tokens += sum(len(t.response_ids) for t in trajectories)
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
                "throughput/tokens_per_s_per_gpu": num_tokens
                / max(m["timing/policy_training_s"], 1e-9)
                / self.cfg.trainer.num_ranks,
                "timing/total_s": time.perf_counter() - start,
            }
        )
        self.metrics.append(m)
        return m
