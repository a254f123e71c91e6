"""Run one rollout worker: the engine, its gRPC service, registration with weightsync, the loop."""

from __future__ import annotations

import logging
import os
import socket

from protos.grpo.v1 import rollout_pb2_grpc, weightsync_pb2, weightsync_pb2_grpc
from services.common.config import RunConfig
from services.common.grpcio import channel, make_server
from services.common.lifecycle import freeze_startup_heap, stop_event
from services.common.queue import WorkQueue, connect
from services.common.rewards import RewardRunner
from services.common.tokenizer import Vocab

from .engine import EngineDead
from .multiturn.runner import EpisodeRunner
from .servicer import EngineState, RolloutServicer
from .worker import WorkerLimits, await_current_weights, beat, run_worker


def serve(cfg: RunConfig, worker_index: int) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rollout-{worker_index} %(levelname)s %(message)s")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.rollout.kv_cache_GiB))
    stop = stop_event()
    from .engines import make_engine

    engine = make_engine(cfg.rollout, cfg.model.path, cfg.run.seed + worker_index, cfg.model.lm_head_fp32)
    worker_id = f"rollout-{worker_index}@{socket.gethostname()}:{os.getpid()}"
    # Asynchronous GRPO loads a refit between decode steps of the running generation (vLLM's step loop).
    inflight = cfg.coordinator.max_staleness > 0 and cfg.rollout.engine == "vllm"
    state = EngineState(engine, worker_id, cfg.rollout.engine, inflight)
    port = cfg.rollout.grpc_port + worker_index if cfg.rollout.grpc_port else 0
    server, port = make_server(cfg.rollout.host, port, "grpo.v1.Rollout")
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
    beat(queue, state, stop)
    await_current_weights(state, registered.policy_version, stop)
    freeze_startup_heap()
    rewards = RewardRunner(cfg.task.reward_weights(), cfg.task.reward_timeout_s)
    limits = WorkerLimits(cfg.rollout.max_num_seqs, cfg.rollout.max_model_len, cfg.rollout.lease_timeout_s)
    vocab = Vocab.from_model_dir(cfg.model.path)
    episodes = EpisodeRunner(cfg.task.episode, cfg.model.path, vocab) if cfg.task.episode.multi_turn else None
    try:
        run_worker(queue, state, vocab, rewards, limits, stop, episodes)
    except EngineDead as e:  # one line, and the process exits for its supervisor to start a fresh one
        raise SystemExit(f"rollout-{worker_index}: {e}") from e
    finally:
        if episodes is not None:
            episodes.close()
        rewards.close()
        server.stop(1).wait()
