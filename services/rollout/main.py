"""Entrypoint of a rollout worker: `python -m services.rollout.main --worker-index I --config X k=v ...`."""

import argparse


def main() -> None:
    from services.common.config import config_from_cli

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-index", type=int, default=0, help="this worker's index among rollout.num_workers")
    cfg, args = config_from_cli(__doc__, parser)
    from .server import serve

    serve(cfg, args.worker_index)


if __name__ == "__main__":
    main()
