"""`AsyncClient`: the methods of the four services on one connection."""

from __future__ import annotations

from runifold_client.client.agent import AgentCalls
from runifold_client.client.memory import MemoryCalls
from runifold_client.client.summary import SummaryCalls
from runifold_client.client.transcript import TranscriptCalls


class AsyncClient(AgentCalls, TranscriptCalls, SummaryCalls, MemoryCalls):
    """asyncio client of every Runifold service.

    >>> async with AsyncClient(namespace="tenant-42") as client:
    ...     result = await client.run_conversation(
    ...         "What did we decide?", conversation_id=cid,
    ...         policy=ConversationContextPolicy(window=16).with_semantic_memory(8))

    `target` is the server's host:port; `namespace` is the default of every call (each
    method takes `namespace=` too); `token` is sent as a bearer token. What it is not
    given it reads from RUNIFOLD_TARGET (else 127.0.0.1:50051), RUNIFOLD_NAMESPACE and
    RUNIFOLD_TOKEN, as the `runifold` command does. `timeout` (seconds) is each call's deadline
    unless the call says otherwise; `max_attempts` bounds gRPC's retries of UNAVAILABLE.
    It may be made outside any event loop and used from several (a channel per loop,
    opened on the loop's first call): threads, `asyncio.run` after `asyncio.run`.
    """
