"""Runifold's gRPC services (one package each) and the all-in-one server."""

import os

# gRPC's fork support would run its fork handlers around every subprocess this server
# starts (pg_ctl of the embedded PostgreSQL, at start and at shutdown), and log a warning
# whenever another thread is inside gRPC. No child of these processes uses gRPC: off,
# unless asked for. Read by grpc when it first loads, so it is set before any import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
