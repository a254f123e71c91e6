"""CLI over the coordinator control API: `python -m services.coordinator.cli ADDRESS start|status|stop`, and
`python -m services.coordinator.cli RUN_DIR samples [--last N]` to print what the model wrote (samples.jsonl)."""

import argparse
import json
from pathlib import Path

from google.protobuf.json_format import MessageToDict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address", help="host:port of the coordinator's gRPC control API (samples: the run folder)")
    parser.add_argument("command", choices=["start", "status", "stop", "samples"])
    parser.add_argument("--num-steps", type=int, default=0, help="with start: steps to run (0 = configured)")
    parser.add_argument("--last", type=int, default=8, help="with samples: how many of the latest to print")
    args = parser.parse_args()
    if args.command == "samples":
        _print_samples(Path(args.address), args.last)
        return
    from .client import CoordinatorClient

    with CoordinatorClient(args.address) as client:
        if args.command == "start":
            reply = client.start_run(args.num_steps)
        elif args.command == "stop":
            reply = client.stop_run()
        else:
            reply = client.status()
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))


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
        print(f"completion: {s['completion']}")


if __name__ == "__main__":
    main()
