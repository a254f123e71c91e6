"""CLI over the coordinator control API: `python -m services.coordinator.cli ADDRESS start|status|stop`."""

import argparse
import json

from google.protobuf.json_format import MessageToDict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address", help="host:port of the coordinator's gRPC control API")
    parser.add_argument("command", choices=["start", "status", "stop"])
    parser.add_argument("--num-steps", type=int, default=0, help="with start: steps to run (0 = configured)")
    args = parser.parse_args()
    from .client import CoordinatorClient

    with CoordinatorClient(args.address) as client:
        if args.command == "start":
            reply = client.start_run(args.num_steps)
        elif args.command == "stop":
            reply = client.stop_run()
        else:
            reply = client.status()
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))


if __name__ == "__main__":
    main()
