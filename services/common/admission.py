"""Fairness between tenants: per-namespace concurrency limits on the expensive calls.

A namespace may have at most a configured number of calls of each expensive kind
in flight in one process (`AdmissionLimits`, RUNIFOLD_NAMESPACE_MAX_*):

| kind | RPCs | what it costs |
|---|---|---|
| search | SearchMemories | an embedding of the query, an index search |
| turn | RunConversation, StreamConversation | a model call (and a search, a summary) |
| summarize | Summarize | model calls |
| upsert | UpsertMemory | a source check, a write, an embedding in the background |
| propose | ProposeMemories | a transcript read, an embedding batch, searches, a model call |

One call more is refused before any work with RESOURCE_EXHAUSTED /
`NAMESPACE_CONCURRENCY_LIMIT` and a `google.rpc.RetryInfo` delay (the mean
duration of that kind of call here), counted in `runifold_requests_shed_total`
(no namespace label). Other namespaces are not affected: the limit keeps one
namespace from filling the embedding queue or the model's concurrency, which
are shared. Calls one service makes to another for a turn (its memory search,
its summarization) count against the same namespace, as they are its work.

The guard (services/common/interceptors.py) takes the slot once the call is
authenticated and its request read (the namespace is known then) and gives it
back when the call ends. A call that waits for something which is not the
process's to give, a turn waiting for its lease behind another turn of the same
conversation (CONCURRENCY_MODE_ENQUEUE, for minutes), does not hold its slot
while it waits (`released`): a queue of waiting turns must not starve the
namespace's other conversations.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

from services.common import metrics
from services.common.errors import Code, DomainError
from services.common.settings import AdmissionLimits
from services.common.shedding import Mean, retry_delay

# The kind of each admission-controlled method.
KINDS: dict[str, str] = {
    "/runifold.memory.v1.MemoryService/SearchMemories": "search",
    "/runifold.memory.v1.MemoryService/UpsertMemory": "upsert",
    "/runifold.memory.v1.MemoryService/ProposeMemories": "propose",
    "/runifold.agent.v1.AgentService/RunConversation": "turn",
    "/runifold.agent.v1.AgentService/StreamConversation": "turn",
    "/runifold.summary.v1.SummaryService/Summarize": "summarize",
}

# The namespace of the call being served (set by the guard for every Runifold
# call): queues in front of shared resources take turns between namespaces by it.
namespace_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "namespace", default=None
)


class Slot:
    """One admitted call's place in its namespace's limit."""

    __slots__ = ("_admission", "_key", "_started", "held")

    def __init__(self, admission: Admission, key: tuple[str, str]) -> None:
        self._admission = admission
        self._key = key
        self._started = time.monotonic()
        self.held = True

    def release(self) -> None:
        """Give the place back (idempotent)."""
        if self.held:
            self.held = False
            self._admission._leave(self._key, time.monotonic() - self._started)

    def retake(self) -> None:
        """Take the place back after a wait, over the limit if need be: a call that
        was admitted and waited its turn is not refused after the wait."""
        if not self.held:
            self.held = True
            self._started = time.monotonic()
            self._admission._enter(self._key)


_slot_var: contextvars.ContextVar[Slot | None] = contextvars.ContextVar(
    "admission_slot", default=None
)


class Admission:
    """Counts each namespace's calls in flight by kind, and refuses beyond the limits."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._in_flight: dict[tuple[str, str], int] = {}
        self._durations = {kind: Mean(limits.retry_after_s) for kind in set(KINDS.values())}
        self._gauges = {kind: metrics.ADMITTED_IN_FLIGHT.labels(kind) for kind in self._durations}

    def in_flight(self, kind: str, namespace: str) -> int:
        """Calls of `kind` in flight for `namespace` (tests and tools)."""
        return self._in_flight.get((kind, namespace), 0)

    def enter(self, method: str, request: Any) -> None:
        """Admit the call being served (its slot goes to the call's context), or raise
        NAMESPACE_CONCURRENCY_LIMIT. Calls of other methods pass untouched."""
        namespace = getattr(request, "namespace", "")
        namespace_var.set(namespace)
        kind = KINDS.get(method)
        if kind is None:
            return
        limit = self.limits.limit(kind)
        if limit == 0:  # no limit configured for this kind
            return
        key = (kind, namespace)
        if self._in_flight.get(key, 0) >= limit:
            metrics.REQUESTS_SHED.labels(kind, "NAMESPACE_CONCURRENCY_LIMIT").inc()
            raise DomainError(
                Code.RESOURCE_EXHAUSTED,
                "NAMESPACE_CONCURRENCY_LIMIT",
                f"this namespace has {limit} {kind} calls in flight, its limit; "
                "retry after the delay in RetryInfo",
                metadata={"kind": kind, "limit": limit},
                retry_after_s=retry_delay(self._durations[kind].value),
            )
        self._enter(key)
        _slot_var.set(Slot(self, key))

    def _enter(self, key: tuple[str, str]) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._gauges[key[0]].inc()

    def _leave(self, key: tuple[str, str], seconds: float) -> None:
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]  # bounded: only namespaces with calls in flight
        self._gauges[key[0]].dec()
        self._durations[key[0]].add(seconds)


def leave() -> None:
    """End the current call's admission (the guard calls this when the call ends)."""
    slot = _slot_var.get()
    if slot is not None:
        slot.release()
        _slot_var.set(None)


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Free the current call's slot for the block (a wait that is not this process's
    work), and take it back after it, over the limit if need be."""
    slot = _slot_var.get()
    if slot is None or not slot.held:
        yield
        return
    slot.release()
    try:
        yield
    finally:
        slot.retake()
