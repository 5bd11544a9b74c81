"""gRPC health probe for container healthchecks: `python -m services.healthcheck`.

Asks `grpc.health.v1.Health/Check` of a server (by default this container's
own, 127.0.0.1 at the port of RUNIFOLD_LISTEN or PORT) and exits 0 when the
service is SERVING, 1 otherwise. Kubernetes uses its native gRPC probes
instead; this is for docker-compose, where no probe binary is in the image.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.settings import default_listen


def default_address() -> str:
    """127.0.0.1 at the port this container's server listens on."""
    listen = os.environ.get("RUNIFOLD_LISTEN") or default_listen(os.environ)
    return f"127.0.0.1:{listen.rpartition(':')[2]}"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m services.healthcheck", description=__doc__)
    parser.add_argument("address", nargs="?", default=None, help="host:port (default: own)")
    parser.add_argument("--service", default="", help="service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    address = args.address or default_address()
    with grpc.insecure_channel(address) as channel:
        # The published stub types declare no methods (see services/common/stubs.py).
        stub: Any = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as error:
            print(f"{address}: {error.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{address} {args.service or '(server)'}: {status}", file=sys.stderr)
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    raise SystemExit(main())
