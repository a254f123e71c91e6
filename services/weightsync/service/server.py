"""Serve the weightsync control plane and host the rendezvous store of transfer groups."""

from __future__ import annotations

import datetime
import logging

import torch.distributed as dist

from protos.grpo.v1 import weightsync_pb2_grpc
from services.common.config import WeightsyncSection
from services.common.grpcio import make_server
from services.common.lifecycle import serve_until_signal
from services.common.ports import listening_socket

from .servicer import WeightSyncServicer


def serve(cfg: WeightsyncSection) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s weightsync %(levelname)s %(message)s")
    # TCPStore alone listens on every interface whatever host it is given; on a socket bound here, on cfg.host only.
    listener = listening_socket(cfg.host, cfg.store_port)
    store = dist.TCPStore(
        cfg.host,
        listener.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=cfg.timeout_s),
        master_listen_fd=listener.fileno(),
    )
    server, port = make_server(cfg.host, cfg.grpc_port, "grpo.v1.WeightSync")
    servicer = WeightSyncServicer(cfg, store.port)
    weightsync_pb2_grpc.add_WeightSyncServicer_to_server(servicer, server)
    logging.info("serving on %s:%d, transfer store on port %d (%s)", cfg.host, port, store.port, servicer.transport)
    serve_until_signal(server)
