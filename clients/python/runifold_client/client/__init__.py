"""Python clients of the Runifold services: `AsyncClient` (grpc.aio) and `Client` (blocking).

`AsyncClient` is the one implementation: every RPC of the four services is a
method of it, one class of methods per service (agent, transcript, summary,
memory) on a shared connection (connection.py: the channel of each event loop,
the call, the paging of listings). `Client` (blocking.py) runs an `AsyncClient`
on an event loop of its own, in a background thread, and turns each method into
a blocking call (each async iterator into an iterator); it adds no logic of its own.

Both speak to one address (the all-in-one server, or a gateway in front of
the services), give every call a deadline, and make writes safe to retry:
`run_conversation` sends a `turn_id`, `append` and the memory writes a
`request_id`, `create_conversation` a conversation id (made for you when you
pass none), so a retry after a lost answer returns the first result instead
of writing twice. Retries are gRPC's own (a service-config `retryPolicy`:
UNAVAILABLE only, exponential backoff, within the call's deadline), on every
method but Summarize and ProposeMemories, which would spend model calls again.
"""

from runifold_client.client.agent import ConcurrencyMode, TurnResult
from runifold_client.client.aio import AsyncClient
from runifold_client.client.blocking import Client
from runifold_client.client.connection import DEFAULT_TARGET, PAGE_SIZE, channel_options
from runifold_client.client.memory import source
from runifold_client.client.transcript import TurnLeaseMode, new_conversation_id

__all__ = [
    "DEFAULT_TARGET",
    "PAGE_SIZE",
    "AsyncClient",
    "Client",
    "ConcurrencyMode",
    "TurnLeaseMode",
    "TurnResult",
    "channel_options",
    "new_conversation_id",
    "source",
]
