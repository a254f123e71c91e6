"""Container healthcheck: exit 0 when the named service of $GRPO_CONFIG answers gRPC health checking."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def addresses(service: str, cfg) -> list[str]:
    if service == "rollout":
        return [f"{cfg.rollout.host}:{cfg.rollout.grpc_port + i}" for i in range(cfg.rollout.num_workers)]
    section = getattr(cfg, service)
    # A service bound to every interface is checked on loopback, from inside its own container.
    host = "127.0.0.1" if section.host == "0.0.0.0" else section.host
    return [f"{host}:{section.grpc_port}"]


def main() -> int:
    from services.common import tls
    from services.common.config import load_config
    from services.common.grpcio import wait_healthy

    cfg = load_config(os.environ["GRPO_CONFIG"])
    tls.load_for_run(Path(cfg.run.output_dir) / cfg.run.run_id)  # a run.tls run's services answer over TLS only
    try:
        for address in addresses(sys.argv[1], cfg):
            wait_healthy(address, timeout_s=3.0)
    except TimeoutError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
