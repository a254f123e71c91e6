"""The rollout loop: claim prompt work, generate the group, score it, publish it, then ack."""

from __future__ import annotations

import logging
import threading
import time

from protos.grpo.v1 import queue_pb2
from services.common.queue import WorkQueue
from services.common.tasks import reward_fn
from services.common.tokenizer import Vocab

from .servicer import EngineState

log = logging.getLogger(__name__)


def score_group(work: queue_pb2.PromptWork, state: EngineState, vocab: Vocab) -> queue_pb2.TrajectoryGroup:
    start = time.perf_counter()
    with state.lock:
        samples = state.engine.generate([list(work.prompt_ids)], work.num_samples, work.sampling)[0]
        version = state.policy_version
    reward = reward_fn(work.task.name)
    group = queue_pb2.TrajectoryGroup(
        run_id=work.run_id,
        step=work.step,
        prompt_index=work.prompt_index,
        prompt_ids=work.prompt_ids,
        policy_version=version,
        worker_id=state.worker_id,
    )
    for i, s in enumerate(samples):
        group.trajectories.append(
            queue_pb2.Trajectory(
                trajectory_id=f"{work.run_id}/{work.step}/{work.prompt_index}/{i}",
                response_ids=s.token_ids,
                logprobs=s.logprobs,
                reward=reward(vocab.pieces(s.token_ids), work.task.answer),
                finish_reason=s.finish_reason,
            )
        )
    group.generation_s = time.perf_counter() - start
    return group


def run_worker(
    queue: WorkQueue, state: EngineState, vocab: Vocab, lease_timeout_s: float, stop: threading.Event
) -> None:
    queue.ensure_group()
    last_beat = 0.0
    while not stop.is_set():
        if time.monotonic() - last_beat > 1.0:
            queue.heartbeat(state.worker_id, policy_version=state.policy_version, groups_done=state.num_groups_done)
            last_beat = time.monotonic()
        claimed = queue.claim(state.worker_id, block_ms=500, lease_timeout_s=lease_timeout_s)
        if claimed is None:
            continue
        entry_id, work = claimed
        try:
            group = score_group(work, state, vocab)
        except ValueError as e:
            # A bad item (unknown reward, ids the engine rejects) is reported and acked, not retried forever.
            log.error("work item %s (step %d prompt %d) rejected: %s", entry_id, work.step, work.prompt_index, e)
            group = queue_pb2.TrajectoryGroup(
                run_id=work.run_id, step=work.step, prompt_index=work.prompt_index, worker_id=state.worker_id
            )
        queue.complete(entry_id, group)
        state.num_groups_done += 1
