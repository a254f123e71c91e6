"""Wire the coordinator: Redis queue, trainer client, loop, gRPC control API, HTTP status."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import uvicorn

from protos.grpo.v1 import coordinator_pb2_grpc, trainer_pb2_grpc
from services.common.config import RunConfig
from services.common.grpcio import channel, make_server
from services.common.lifecycle import freeze_startup_heap, stop_event
from services.common.queue import WorkQueue, connect
from services.common.tasks import load_task

from .feed import PromptFeed
from .loop import GrpoLoop
from .runner import Runner
from .servicer import CoordinatorServicer
from .state import RunState
from .status import make_app

STOP_GRACE_S = 120.0
"""How long a stopping coordinator waits for its run to end its step and save a checkpoint."""


def serve(cfg: RunConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(levelname)s %(message)s")
    stop = stop_event()
    run_dir = Path(cfg.run.output_dir) / cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    queue = WorkQueue(connect(cfg.redis.url), cfg.redis.prompts_stream, cfg.redis.trajectories_stream)
    queue.ensure_group()
    feed = PromptFeed(cfg, load_task(cfg.task))
    trainer = trainer_pb2_grpc.TrainerStub(channel(f"{cfg.trainer.host}:{cfg.trainer.grpc_port}"))
    state = RunState(run_id=cfg.run.run_id, num_steps=cfg.run.num_steps, num_rollout_workers=cfg.rollout.num_workers)
    loop = GrpoLoop(cfg, queue, trainer, feed, run_dir, state)
    if cfg.run.resume:
        loop.restore()
    runner = Runner(loop)

    server, port = make_server(cfg.coordinator.host, cfg.coordinator.grpc_port, "grpo.v1.Coordinator")
    freeze_startup_heap()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(runner, cfg.run.num_steps), server)
    server.start()
    http = uvicorn.Server(
        uvicorn.Config(
            make_app(state, queue), host=cfg.coordinator.host, port=cfg.coordinator.http_port, log_level="warning"
        )
    )
    http.install_signal_handlers = lambda: None  # signals stay with stop_event
    threading.Thread(target=http.run, name="http", daemon=True).start()
    logging.info(
        "control on %s:%d, status on http://%s:%d/status",
        cfg.coordinator.host,
        port,
        cfg.coordinator.host,
        cfg.coordinator.http_port,
    )
    stop.wait()
    runner.stop()
    runner.join(timeout_s=STOP_GRACE_S)
    runner.loop.metrics.close()  # the trackers' last rows (a run can be started again until the service stops)
    http.should_exit = True
    server.stop(1).wait()
