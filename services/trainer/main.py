"""Entrypoint of one trainer rank: torchrun --standalone --nproc-per-node N -m services.trainer.main ..."""


def main() -> None:
    from services.common.config import config_from_cli

    cfg, _ = config_from_cli(__doc__)
    from .server import serve

    serve(cfg)


if __name__ == "__main__":
    main()
