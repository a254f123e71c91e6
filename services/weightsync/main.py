"""Entrypoint of the weightsync control service."""


def main() -> None:
    from services.common.config import config_from_cli

    cfg, _ = config_from_cli(__doc__)
    from .service.server import serve

    serve(cfg.weightsync)


if __name__ == "__main__":
    main()
