"""Run one rollout worker: the engine, its gRPC service, registration with weightsync, the loop."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from protos.grpo.v1 import rollout_pb2_grpc, weightsync_pb2, weightsync_pb2_grpc
from services.common.config import RunConfig
from services.common.grpcio import channel, make_server
from services.common.lifecycle import freeze_startup_heap, stop_event
from services.common.queue import WorkQueue, connect
from services.common.rewards import RewardRunner
from services.common.tokenizer import Vocab

from .servicer import EngineState, RolloutServicer
from .worker import WorkerLimits, run_worker


def serve(cfg: RunConfig, worker_index: int) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rollout-{worker_index} %(levelname)s %(message)s")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.rollout.kv_cache_GiB))
    stop = stop_event()
    from .engine import make_engine

    engine = make_engine(cfg.rollout, cfg.model.path, cfg.run.seed + worker_index, cfg.model.lm_head_fp32)
    worker_id = f"rollout-{worker_index}@{socket.gethostname()}:{os.getpid()}"
    state = EngineState(engine, worker_id, cfg.rollout.engine)
    port = cfg.rollout.grpc_port + worker_index if cfg.rollout.grpc_port else 0
    server, port = make_server(cfg.rollout.host, port)
    rollout_pb2_grpc.add_RolloutServicer_to_server(RolloutServicer(state), server)
    server.start()
    address = f"{cfg.rollout.host}:{port}"
    with channel(f"{cfg.weightsync.host}:{cfg.weightsync.grpc_port}") as ch:
        registered = weightsync_pb2_grpc.WeightSyncStub(ch).RegisterEndpoint(
            weightsync_pb2.Endpoint(
                endpoint_id=f"rollout-{worker_index}",
                grpc_address=address,
                dtype=str(engine.dtype).removeprefix("torch."),
            ),
            timeout=30,
        )
    logging.info("worker %s serving on %s with engine %s", worker_id, address, cfg.rollout.engine)
    queue = WorkQueue(
        connect(cfg.redis.url), cfg.redis.prompts_stream, cfg.redis.trajectories_stream, cfg.rollout.max_deliveries
    )
    await_current_weights(state, registered.policy_version, queue, stop)
    freeze_startup_heap()
    rewards = RewardRunner(cfg.task.reward_weights(), cfg.task.reward_timeout_s)
    limits = WorkerLimits(cfg.rollout.max_num_seqs, cfg.rollout.max_model_len, cfg.rollout.lease_timeout_s)
    try:
        run_worker(queue, state, Vocab.from_model_dir(cfg.model.path), rewards, limits, stop)
    finally:
        rewards.close()
        server.stop(1).wait()


JOIN_TIMEOUT_S = 600.0
"""How long a joining worker waits for the pull of the current version before it gives up (and exits)."""


def await_current_weights(state: EngineState, policy_version: int, queue: WorkQueue, stop: threading.Event) -> None:
    """Take no work until the engine holds the run's current version: a worker that joins mid-run (a restart, an
    added worker) starts on model.path's weights, and would hand the trainer samples of a policy long gone.

    Over a transport a joiner can pull from (ucxx) weightsync fans the latest version out to it when it registers.
    Over a collective one (gloo, NCCL) the sender must be in the group: the worker's heartbeat says it is joining,
    and the coordinator, seeing that, has the trainer publish its version again."""
    if policy_version == 0:  # no refit yet: the start-up weights are the current ones
        return
    logging.info("joining at policy version %d: waiting for its weights before taking work", policy_version)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while state.policy_version < policy_version and not stop.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {policy_version} did not arrive within {JOIN_TIMEOUT_S:.0f}s")
        queue.heartbeat(state.worker_id, policy_version=state.policy_version, joining=True, groups_done=0)
        stop.wait(0.5)
    logging.info("joined at policy version %d", state.policy_version)
