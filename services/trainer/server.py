"""One trainer rank: build the sharded engine; rank 0 serves gRPC and drives, the others follow."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from protos.grpo.v1 import trainer_pb2_grpc
from services.common.config import RunConfig
from services.common.grpcio import make_server
from services.common.lifecycle import freeze_startup_heap, stop_event

from .backends import build_engine
from .commands import Executor
from .driver import CommandChannel, Driver, follow
from .engine import Engine
from .servicer import TrainerServicer

log = logging.getLogger(__name__)

# Followers wait for commands inside a collective bounded by the process group's timeout (30 min).
_PING_S = 60.0
_GRACE_S = 2.0


def serve(cfg: RunConfig) -> None:
    device = _init_distributed(cfg.trainer.num_threads)
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s trainer[{rank}] %(levelname)s %(message)s")
    if world != cfg.trainer.num_ranks:
        raise ValueError(f"torchrun started {world} ranks but trainer.num_ranks={cfg.trainer.num_ranks}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per rank and model interleaves into unreadable logs
    # SIGTERM/SIGINT only set a flag on every rank: rank 0 finishes the running command and ends all.
    stop = stop_event()
    if rank == 0 and cfg.model.create:
        from services.common.tinymodel import create_tiny_model

        create_tiny_model(cfg.model, cfg.run.seed)
    dist.barrier()
    engine = build_engine(cfg, device)
    executor = Executor(engine, cfg.weightsync)
    channel = CommandChannel(dist.new_group(backend="gloo"))
    freeze_startup_heap()
    if rank == 0:
        _lead(cfg, Driver(channel, executor), engine, stop)
    elif not follow(channel, executor, stop):
        log.error("rank 0 is gone; exiting without a clean shutdown")
        # A broadcast is still pending; the process group's destructor would wait on it.
        os._exit(1)
    dist.destroy_process_group()
    log.info("stopped")


def _init_distributed(num_threads: int) -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    # Ranks and rollout workers share a small CPU machine: extra intra-op threads only fight over the cores.
    torch.set_num_threads(num_threads)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def _lead(cfg: RunConfig, driver: Driver, engine: Engine, stop: threading.Event) -> None:
    server, port = make_server(cfg.trainer.host, cfg.trainer.grpc_port, "grpo.v1.Trainer")
    trainer = cfg.trainer
    servicer = TrainerServicer(
        driver, engine.vocab_size, trainer.max_tokens_per_microbatch, trainer.minibatches, _checkpoint_roots(cfg)
    )
    trainer_pb2_grpc.add_TrainerServicer_to_server(servicer, server)
    server.start()
    log.info("trainer serving on %s:%d (%d ranks, %s)", cfg.trainer.host, port, engine.world, engine.device.type)
    while not stop.wait(_PING_S):
        driver.ping()
    server.stop(_GRACE_S).wait()
    driver.shutdown()


def _checkpoint_roots(cfg: RunConfig) -> list[Path]:
    """The folders Save and Load may use: the run's, and trainer.checkpoint_root where set."""
    roots = [Path(cfg.run.output_dir) / cfg.run.run_id]
    if cfg.trainer.checkpoint_root:
        roots.append(Path(cfg.trainer.checkpoint_root))
    return [root.resolve() for root in roots]
