"""The rollout loop: claim prompt work, generate every claimed group in one engine call (multi-turn: one call per
round of turns), score, publish, ack."""

from __future__ import annotations

import json
import logging
import resource
import threading
import time
from dataclasses import dataclass

import torch

from protos.grpo.v1 import queue_pb2
from services.common.lifecycle import GcClock
from services.common.queue import WorkQueue
from services.common.rewards import RewardInput, RewardRunner
from services.common.tokenizer import Vocab

from .engine import EngineDead, Request, Sample
from .multiturn.loop import EpisodeResult
from .multiturn.runner import EpisodeRunner
from .servicer import EngineState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    max_num_seqs: int
    """Sequences (prompts x samples) handed to the engine together."""
    max_model_len: int
    """Prompt plus generated tokens the engine can hold."""
    lease_timeout_s: float


def trajectory_id(work: queue_pb2.PromptWork, sample_index: int) -> str:
    """Deterministic, so a re-leased item that comes back twice dedups; held-out items live apart."""
    step = f"eval{work.step}" if work.eval else str(work.step)
    return f"{work.run_id}/{step}/{work.prompt_index}/{sample_index}"


def check_work(work: queue_pb2.PromptWork, limits: WorkerLimits) -> str:
    """Why the engine cannot take this item ('' if it can), so one bad item never reaches, or kills, the engine."""
    if not work.prompt_ids:
        return "prompt has no tokens"
    if work.num_samples < 1:
        return "num_samples must be >= 1"
    total = len(work.prompt_ids) + work.sampling.max_tokens
    if total > limits.max_model_len:
        return (
            f"prompt is {len(work.prompt_ids)} tokens; with max_tokens {work.sampling.max_tokens} that is {total} > "
            f"rollout.max_model_len {limits.max_model_len}"
        )
    try:
        metadata = json.loads(work.task.metadata_json or "{}")
    except (ValueError, RecursionError) as e:  # not JSON, an integer past Python's digit limit, nesting too deep
        return f"task.metadata_json is not JSON: {type(e).__name__}: {str(e)[:200]}"
    return "" if isinstance(metadata, dict) else "task.metadata_json is not a JSON object"


def generate(state: EngineState, works: list[queue_pb2.PromptWork]) -> tuple[list[list[Sample] | str], int]:
    """Samples of each item (or why the engine refused it) and the policy version they were started with (with
    in-flight updates, each sample says which version made each token)."""
    requests = [Request(list(w.prompt_ids), w.num_samples, w.sampling) for w in works]
    between_steps = state.between_steps if state.inflight else None
    with state.lock:
        version = state.policy_version
        try:
            return state.engine.generate(requests, between_steps), version
        except EngineDead:
            raise
        except Exception as batch_error:  # one bad request fails the whole call: find it, keep the others
            if len(requests) == 1:
                return [f"engine refused the prompt: {type(batch_error).__name__}: {batch_error}"], version
        out: list[list[Sample] | str] = []
        for r in requests:
            try:
                out.append(state.engine.generate([r])[0])
            except Exception as e:
                out.append(f"engine refused the prompt: {type(e).__name__}: {e}")
        return out, version


def peak_mem_GiB() -> float:
    """This process's peak memory: torch's reserved memory on the GPU where there is one, else the max RSS."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _group(work: queue_pb2.PromptWork, version: int, state: EngineState) -> queue_pb2.TrajectoryGroup:
    return queue_pb2.TrajectoryGroup(
        run_id=work.run_id,
        step=work.step,
        prompt_index=work.prompt_index,
        prompt_ids=work.prompt_ids,
        policy_version=version,
        worker_id=state.worker_id,
        eval=work.eval,
        peak_mem_GiB=peak_mem_GiB(),
    )


def _reward_inputs(
    work: queue_pb2.PromptWork, texts: list[str], ends: list[tuple[str, int]], extra: list[dict] | None = None
) -> list[RewardInput]:
    """What the rewards score: each text, with its finish reason and token count (and extra) in the row's metadata."""
    metadata = json.loads(work.task.metadata_json or "{}")
    return [
        RewardInput(work.task.prompt, text, work.task.answer, {**metadata, "finish_reason": f, "num_tokens": n, **x})
        for text, (f, n), x in zip(texts, ends, extra or [{}] * len(texts))
    ]


def build_group(
    work: queue_pb2.PromptWork, samples: list[Sample], version: int, state: EngineState, vocab: Vocab, rewards
) -> queue_pb2.TrajectoryGroup:
    texts = [vocab.decode(s.token_ids) for s in samples]
    inputs = _reward_inputs(work, texts, [(s.finish_reason, len(s.token_ids)) for s in samples])
    # The oldest token's version, where a refit landed during the generation.
    group = _group(work, min((v for s in samples for v in s.versions), default=version), state)
    for i, (s, text, scored) in enumerate(zip(samples, texts, rewards.score(inputs))):
        group.trajectories.append(
            queue_pb2.Trajectory(
                trajectory_id=trajectory_id(work, i),
                response_ids=s.token_ids,
                logprobs=s.logprobs,
                reward=scored.total,
                finish_reason=s.finish_reason,
                text=text,
                reward_components=scored.components,
                reward_errors=scored.errors,
                # Only where a refit landed during the generation: otherwise every token is policy_version's.
                token_versions=s.versions if len(set(s.versions)) > 1 else [],
            )
        )
    return group


def episode_group(
    work: queue_pb2.PromptWork, results: list[EpisodeResult], version: int, state: EngineState, rewards
) -> queue_pb2.TrajectoryGroup:
    """One trajectory per episode: every turn's ids, the loss mask over the model's, the last model turn scored by
    the task's rewards (0 where the environment failed)."""
    if failed := next((r for r in results if r.end == "engine_error"), None):
        raise ValueError(failed.errors[0])
    finish = ["length" if r.end in ("length", "max_tokens") else "stop" for r in results]
    last_turn_tokens = [len(r.episode.response_ids) - _last_turn_start(r.episode.loss_mask) for r in results]
    episode = [{"env_reward": r.env_reward, "tool_calls": r.tool_calls, "tool_errors": r.tool_errors} for r in results]
    inputs = _reward_inputs(work, [r.answer for r in results], list(zip(finish, last_turn_tokens)), episode)
    group = _group(work, version, state)
    for i, (r, f, scored) in enumerate(zip(results, finish, rewards.score(inputs))):
        env_failed = r.end == "env_error"
        group.trajectories.append(
            queue_pb2.Trajectory(
                trajectory_id=trajectory_id(work, i),
                response_ids=r.episode.response_ids,
                logprobs=r.episode.logprobs,
                reward=0.0 if env_failed else scored.total,
                finish_reason=f,
                text=r.answer,
                reward_components={} if env_failed else scored.components,
                reward_errors=scored.errors,
                loss_mask=[bool(m) for m in r.episode.loss_mask] if 0 in r.episode.loss_mask else [],
                turns=r.episode.model_turns,
                tool_calls=r.tool_calls,
                tool_errors=r.tool_errors,
                env_s=r.env_s,
                episode_end=r.end,
                messages_json=json.dumps(r.episode.messages),
            )
        )
    return group


def _last_turn_start(loss_mask: list[int]) -> int:
    """Index where the last model turn starts (after the last environment token)."""
    return len(loss_mask) - loss_mask[::-1].index(0) if 0 in loss_mask else 0


def rejected(work: queue_pb2.PromptWork, state: EngineState, why: str) -> queue_pb2.TrajectoryGroup:
    log.error("work item (step %d prompt %d) rejected: %s", work.step, work.prompt_index, why)
    return queue_pb2.TrajectoryGroup(
        run_id=work.run_id,
        step=work.step,
        prompt_index=work.prompt_index,
        worker_id=state.worker_id,
        eval=work.eval,
        error=why,
    )


def process(
    claimed: list[tuple[str, queue_pb2.PromptWork]],
    state: EngineState,
    vocab: Vocab,
    rewards: RewardRunner,
    limits: WorkerLimits,
    episodes: EpisodeRunner | None = None,
) -> list[tuple[str, queue_pb2.TrajectoryGroup]]:
    start = time.perf_counter()
    done: list[tuple[str, queue_pb2.TrajectoryGroup]] = []
    ok: list[tuple[str, queue_pb2.PromptWork]] = []
    for entry_id, work in claimed:
        why = check_work(work, limits)
        if why:
            done.append((entry_id, rejected(work, state, why)))
        else:
            ok.append((entry_id, work))
    if ok:
        if episodes is None:
            outs, version = generate(state, [w for _, w in ok])
        else:
            outs, version = episodes.run(state, [w for _, w in ok])
        generation_s = time.perf_counter() - start
        for (entry_id, work), out in zip(ok, outs):
            if isinstance(out, str):
                done.append((entry_id, rejected(work, state, out)))
                continue
            try:
                if episodes is None:
                    group = build_group(work, out, version, state, vocab, rewards)
                else:
                    group = episode_group(work, out, version, state, rewards)
            except Exception as e:  # one item's failure is its own error group, never the worker's death: a dead
                # worker leaves the whole batch unacked, and the next worker to claim it would die the same way
                done.append((entry_id, rejected(work, state, f"building the group failed: {type(e).__name__}: {e}")))
                continue
            group.generation_s = generation_s
            done.append((entry_id, group))
    return done


IDLE_AFTER_WORK_MS = 50
"""How long a worker that just generated waits for more work before it counts as idle (and sleeps its engine)."""


JOIN_TIMEOUT_S = 600.0
"""How long a worker that is behind waits for the run's current version before it gives up (and exits)."""
HEARTBEAT_EVERY_S = 1.0


def await_current_weights(state: EngineState, policy_version: int, stop: threading.Event) -> None:
    """Take no work until the engine holds the run's current version: a worker that joins mid-run (a restart, an
    added worker) starts on model.path's weights, and one left out of a refit (it did not answer: stopped, wedged)
    holds an old version; either would hand the trainer samples of a policy long gone.

    Over a transport a joiner can pull from (ucxx) weightsync fans the latest version out to it when it registers.
    Otherwise the sender must include it: the worker's heartbeat says it is joining, and the coordinator, seeing
    that, has the trainer publish its version again."""
    state.wanted_version = max(state.wanted_version, policy_version)
    if not state.behind:  # no refit yet, or nothing missed: the weights held are the current ones
        return
    log.info("behind at policy version %d: waiting for version %d before taking work",
             state.policy_version, state.wanted_version)  # fmt: skip
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while state.behind and not stop.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {state.wanted_version} did not arrive within {JOIN_TIMEOUT_S:.0f}s")
        stop.wait(0.2)
    log.info("joined at policy version %d", state.policy_version)


def beat(queue: WorkQueue, state: EngineState, stop: threading.Event) -> threading.Thread:
    """The worker's heartbeat, every HEARTBEAT_EVERY_S from a thread of its own, so that a long generation is not
    a missed beat: the coordinator reads from it who is alive and who is joining (behind the run's version)."""

    def loop() -> None:
        while not stop.is_set():
            try:
                queue.heartbeat(state.worker_id, policy_version=state.policy_version, joining=state.behind,
                                groups_done=state.num_groups_done, idle_s=round(state.idle_s, 3),
                                pause_s=round(state.pause_s, 4))  # fmt: skip
            except Exception as e:  # Redis restarting: the next beat reconnects
                log.warning("heartbeat failed: %s", e)
            stop.wait(HEARTBEAT_EVERY_S)

    thread = threading.Thread(target=loop, name="heartbeat", daemon=True)
    thread.start()
    return thread


def run_worker(
    queue: WorkQueue,
    state: EngineState,
    vocab: Vocab,
    rewards: RewardRunner,
    limits: WorkerLimits,
    stop: threading.Event,
    episodes: EpisodeRunner | None = None,
) -> None:
    queue.ensure_group()
    just_worked, gc_clock = False, GcClock()
    while not stop.is_set():
        # Right after a generation a short wait says whether the step's work is done: the coordinator enqueues a
        # step's prompts at once, so nothing more within it means the trainer trains now (a 500 ms wait outlasted
        # a 1.5B step's training and refit on an H200, and the engine never slept during one).
        waiting_since = time.perf_counter()
        claimed = queue.claim_batch(
            state.worker_id,
            max_sequences=limits.max_num_seqs,
            block_ms=IDLE_AFTER_WORK_MS if just_worked else 500,
            lease_timeout_s=limits.lease_timeout_s,
        )
        state.idle_s += time.perf_counter() - waiting_since  # blocked in the claim: no work to do
        newest = max((w.policy_version for _, w in claimed), default=0)
        if newest > state.policy_version:
            # Work of a version this engine missed (it was left out of a refit): back to the queue for the others,
            # and no work until the version arrives.
            queue.give_back(claimed)
            log.warning("claimed work of policy version %d while holding %d: gave back %d items",
                        newest, state.policy_version, len(claimed))  # fmt: skip
            await_current_weights(state, newest, stop)
            continue
        just_worked = bool(claimed)
        if not claimed:  # no work: the trainer is training; the engine frees what rollout.gpu.sleep_level says
            slept_since = time.perf_counter()
            with state.weights_lock, state.lock:  # the order a refit's read-back takes them in
                state.engine.sleep()
            state.idle_s += time.perf_counter() - slept_since
            continue
        started, gc_s, gc_full = time.perf_counter(), gc_clock.seconds, gc_clock.full_collections
        done = process(claimed, state, vocab, rewards, limits, episodes)
        processed = time.perf_counter()
        # Each group goes to Redis, then its prompt is acked: a crash before the ack re-leases the prompt.
        for entry_id, group in done:
            queue.complete(entry_id, group)
            state.num_groups_done += 1
        generation_s = max((g.generation_s for _, g in done), default=0.0)
        log.info(
            "%d groups (%d sequences): generation %.3fs, decoding and rewards %.3fs, publishing %.3fs; "
            "garbage collector %.3fs of it (%d full collections)",
            len(done), sum(w.num_samples for _, w in claimed), generation_s, processed - started - generation_s,
            time.perf_counter() - processed, gc_clock.seconds - gc_s, gc_clock.full_collections - gc_full,
        )  # fmt: skip
