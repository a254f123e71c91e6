"""CLI over the coordinator control API: `python -m services.coordinator.cli ADDRESS start|status|stop`,
`... ADDRESS workers [--set N]` to list the live rollout workers or set how many the launcher keeps, and
`... RUN_DIR samples [--last N]` to print what the model wrote (samples.jsonl). ADDRESS is host:port, or the run
folder (its config.toml names the coordinator, its run.secret the secret that start, stop and workers --set need;
with host:port the secret comes from --secret-file or GRPO_RUN_SECRET)."""

import argparse
import json
from pathlib import Path

from google.protobuf.json_format import MessageToDict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address", help="host:port of the coordinator's gRPC control API (samples: the run folder)")
    parser.add_argument("command", choices=["start", "status", "stop", "workers", "samples"])
    parser.add_argument("--num-steps", type=int, default=0, help="with start: steps to run (0 = configured)")
    parser.add_argument("--last", type=int, default=8, help="with samples: how many of the latest to print")
    parser.add_argument("--set", type=int, help="with workers: the number of rollout workers the launcher keeps")
    parser.add_argument("--secret-file", type=Path, help="the run's run.secret, where ADDRESS is host:port")
    parser.add_argument("--run-dir", type=Path, help="the run folder whose tls/ to use, where ADDRESS is host:port "
                        "of a run.tls run (its run.secret too, unless --secret-file)")  # fmt: skip
    args = parser.parse_args()
    if args.set is not None and args.set < 0:
        parser.error(f"--set must be a count of workers, got {args.set}")
    if args.command == "samples":
        _print_samples(Path(args.address), args.last)
        return
    import grpc

    try:
        with _client(args.address, args.secret_file, args.run_dir) as client:
            if args.command == "workers":
                if args.set is not None:
                    client.scale_rollout(args.set)
                _print_workers(client.status(with_workers=True))
                return
            if args.command == "start":
                reply = client.start_run(args.num_steps)
            elif args.command == "stop":
                reply = client.stop_run()
            else:
                reply = client.status()
    except grpc.RpcError as e:
        raise SystemExit(f"error: {args.command}: {e.code().name}: {e.details()}") from None
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))


def _client(address: str, secret_file: Path | None, run_dir: Path | None):
    """The client of the run folder at address, or of the coordinator at host:port."""
    from services.common import auth, tls

    from .client import CoordinatorClient

    if (Path(address) / "config.toml").exists():
        return CoordinatorClient.for_run(address)
    try:
        secret = auth.read_secret(secret_file) if secret_file else None
        if run_dir is not None:
            return CoordinatorClient(address, secret=secret or auth.run_secret(run_dir), creds=tls.load(run_dir))
    except (auth.SecretError, tls.TLSError) as e:
        raise SystemExit(f"error: {e}") from None
    return CoordinatorClient(address, secret=secret or auth.env_secret())


def _print_workers(status) -> None:
    live = status.rollout_workers
    print(f"rollout workers: {status.num_rollout_workers} wanted, {len(live)} with a heartbeat in the last 10 s")
    for w in live:
        doing = f"joining (holds v{w.policy_version})" if w.joining else f"policy v{w.policy_version}"
        print(f"  {w.worker_id}  {doing}  {w.groups_done} groups  heartbeat {w.heartbeat_age_s:.1f}s ago")


def _print_samples(run_dir: Path, last: int) -> None:
    from .metrics import read_samples

    path = run_dir / "samples.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist (is {run_dir} a run folder?)")
    for s in read_samples(path, last):
        kind = "eval" if s["eval"] else "train"
        head = f"step {s['step']} ({kind}, policy v{s['policy_version']})"
        print(f"--- {head} reward {s['reward']:.3f} [{s['finish_reason']}]")
        print(f"prompt:     {s['prompt']}")
        print(f"answer:     {s['answer']}")
        for m in s.get("messages", []):  # a multi-turn episode: every turn, the environment's included
            print(f"{m['role'] + ':':<11} {m['content']}")
        if "messages" not in s:
            print(f"completion: {s['completion']}")


if __name__ == "__main__":
    main()
