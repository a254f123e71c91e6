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
    await_current_weights(state, registered.policy_version, cfg.weightsync.transport, stop)
    queue = WorkQueue(
        connect(cfg.redis.url), cfg.redis.prompts_stream, cfg.redis.trajectories_stream, cfg.rollout.max_deliveries
    )
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


def await_current_weights(state: EngineState, policy_version: int, transport: str, stop: threading.Event) -> None:
    """Take no work until the engine holds the run's current version: a worker that joins mid-run (a restart)
    starts on model.path's weights, and would hand the trainer samples of a policy long gone.

    weightsync fans the latest version out to a joiner when it registers, over a transport a joiner can pull
    from (ucxx); a collective one (gloo, NCCL) needs the sender in the group, so there the joiner gets the
    weights with the next refit, and until then generates on its start-up weights (logged)."""
    if policy_version == 0:  # no refit yet: the start-up weights are the current ones
        return
    from services.weightsync.transports import choose, kind

    if not kind(choose(transport)).joinable:
        logging.warning(
            "joined at policy version %d over %s, which cannot hand a joiner the current version: generating on "
            "the start-up weights until the next refit",
            policy_version, choose(transport),
        )  # fmt: skip
        return
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while state.policy_version < policy_version and not stop.wait(0.1):
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {policy_version} did not arrive within {JOIN_TIMEOUT_S:.0f}s")
    logging.info("joined at policy version %d", state.policy_version)
