"""Entrypoint of one trainer rank: torchrun --standalone --nproc-per-node N -m services.trainer.main ..."""

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from services.common.config import load_config

    cfg = load_config(args.config, args.overrides)
    from .server import serve

    serve(cfg)


if __name__ == "__main__":
    main()
