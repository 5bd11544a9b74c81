"""Fairness between tenants: per-namespace concurrency limits on the expensive calls.

A namespace may have at most a configured number of calls of each expensive kind
in flight in one process (`AdmissionLimits`, RUNIFOLD_NAMESPACE_MAX_*). Which
kind each RPC is, or why it has none, is its cost class (services/common/costs.py):

| kind | RPCs | what it costs |
|---|---|---|
| search | SearchMemories | an embedding of the query, an index search |
| turn | RunConversation, StreamConversation | a model call (and a search, a summary) |
| summarize | Summarize | model calls |
| upsert | UpsertMemory | a source check, a write, an embedding in the background |
| propose | ProposeMemories | a transcript read, an embedding batch, searches, a model call |
| curate | RequestCuration | a transcript read and an enqueue (its job's calls: the hourly budget) |

One call more is refused before any work with RESOURCE_EXHAUSTED /
`NAMESPACE_CONCURRENCY_LIMIT` and a `google.rpc.RetryInfo` delay (the mean
duration of that kind of call here), counted in `runifold_requests_shed_total`
(no namespace label). Other namespaces are not affected: the limit keeps one
namespace from filling the embedding queue or the model's concurrency, which
are shared. Calls one service makes to another for a turn (its memory search,
its summarization) count against the same namespace, as they are its work.

The guard (services/common/interceptors.py) takes the slot once the call is
authenticated and its request read (the namespace is known then) and gives it
back when the call ends.

A turn that waits for something which is not the process's to give (its lease,
behind another turn of the same conversation: CONCURRENCY_MODE_ENQUEUE, or a
repeat of a running `turn_id`, for minutes) does not hold its slot while it
waits: a queue of waiting turns must not starve the namespace's other
conversations. It `park`s instead: its slot becomes one of the namespace's
waiting places (RUNIFOLD_NAMESPACE_MAX_WAITING_TURNS; none left is
NAMESPACE_CONCURRENCY_LIMIT with kind `turn_wait`), and once its wait is over it
`resume`s: it waits, first come first served, for one of the namespace's slots
(a slot freed goes to a resuming call before any new call), so that the
namespace's limit holds even when many waits end together.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from typing import Any

from services.common import metrics
from services.common.costs import admission_kinds
from services.common.deadlines import deadline_exceeded
from services.common.errors import Code, DomainError
from services.common.settings import AdmissionLimits
from services.common.shedding import Mean, retry_delay

# The kind of each admission-controlled method (from the cost classes).
KINDS: dict[str, str] = admission_kinds()
# The kind of the places of calls of `kind` that wait without their slot.
WAITING_KIND = {"turn": "turn_wait"}

# The namespace of the call being served (set by the guard for every Runifold
# call): queues in front of shared resources take turns between namespaces by it.
namespace_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "namespace", default=None
)


def _limit_reached(kind: str, limit: int, retry_after_s: float) -> DomainError:
    metrics.REQUESTS_SHED.labels(kind, "NAMESPACE_CONCURRENCY_LIMIT").inc()
    what = "waiting turns" if kind in WAITING_KIND.values() else f"{kind} calls in flight"
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "NAMESPACE_CONCURRENCY_LIMIT",
        f"this namespace has {limit} {what}, its limit; retry after the delay in RetryInfo",
        metadata={"kind": kind, "limit": limit},
        retry_after_s=retry_delay(retry_after_s),
    )


class Slot:
    """One admitted call's place in its namespace's limit: its slot, or (parked) a
    waiting place, or nothing once released."""

    __slots__ = ("_admission", "_key", "_started", "held", "parked")

    def __init__(self, admission: Admission, key: tuple[str, str]) -> None:
        self._admission = admission
        self._key = key
        self._started = time.monotonic()
        self.held = True  # the slot
        self.parked = False  # a waiting place instead of the slot

    def release(self) -> None:
        """Give back what the call holds (idempotent)."""
        self._release_slot()
        if self.parked:
            self.parked = False
            self._admission._unpark(self._key)

    def park(self) -> None:
        """Trade the slot for a waiting place (NAMESPACE_CONCURRENCY_LIMIT, kind
        `turn_wait`, when the namespace has none left: the slot is kept then)."""
        if not self.held or self.parked:
            return
        self._admission._park(self._key)
        self.parked = True
        self._release_slot()

    def _release_slot(self) -> None:
        if self.held:
            self.held = False
            self._admission._leave(self._key, time.monotonic() - self._started)

    async def resume(self, timeout: float | None) -> None:
        """Take a slot again after a wait: at once when the namespace is under its
        limit, else the next one freed (before any new call); DEADLINE_EXCEEDED after
        `timeout`. The waiting place is given back once the slot is held."""
        if self.held or not self.parked:
            return
        await self._admission._resume(self._key, timeout)
        self.held = True
        self._started = time.monotonic()
        self.parked = False
        self._admission._unpark(self._key)


_slot_var: contextvars.ContextVar[Slot | None] = contextvars.ContextVar(
    "admission_slot", default=None
)


class Admission:
    """Counts each namespace's calls in flight by kind, and refuses beyond the limits."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._in_flight: dict[tuple[str, str], int] = {}
        # Calls waiting to take a slot back (Slot.resume), first come first served.
        self._resuming: dict[tuple[str, str], deque[asyncio.Future[None]]] = {}
        kinds = {*KINDS.values(), *WAITING_KIND.values()}
        self._durations = {kind: Mean(limits.retry_after_s) for kind in kinds}
        self._gauges = {kind: metrics.ADMITTED_IN_FLIGHT.labels(kind) for kind in kinds}

    def in_flight(self, kind: str, namespace: str) -> int:
        """Calls of `kind` in flight for `namespace` (tests and tools); for a waiting
        kind (`turn_wait`), the places taken."""
        return self._in_flight.get((kind, namespace), 0)

    def resuming(self, kind: str, namespace: str) -> int:
        """Calls of `kind` waiting to take a slot back (tests and tools)."""
        return len(self._resuming.get((kind, namespace), ()))

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
            raise _limit_reached(kind, limit, self._durations[kind].value)
        self._enter(key)
        _slot_var.set(Slot(self, key))

    def _enter(self, key: tuple[str, str]) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._gauges[key[0]].inc()

    def _leave(self, key: tuple[str, str], seconds: float) -> None:
        self._durations[key[0]].add(seconds)
        waiters = self._resuming.get(key)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: the count stays
                if not waiters:
                    del self._resuming[key]
                return
        self._resuming.pop(key, None)
        self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]  # bounded: only namespaces with calls in flight
        self._gauges[key[0]].dec()

    def _park(self, key: tuple[str, str]) -> None:
        kind = WAITING_KIND[key[0]]
        limit = self.limits.limit(kind)
        place = (kind, key[1])
        if limit and self._in_flight.get(place, 0) >= limit:
            raise _limit_reached(kind, limit, self._durations[key[0]].value)
        self._enter(place)

    def _unpark(self, key: tuple[str, str]) -> None:
        self._drop((WAITING_KIND[key[0]], key[1]))

    async def _resume(self, key: tuple[str, str], timeout: float | None) -> None:
        limit = self.limits.limit(key[0])
        if not limit or (self._in_flight.get(key, 0) < limit and not self._resuming.get(key)):
            self._enter(key)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resuming.setdefault(key, deque()).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException as error:
            if waiter.done() and not waiter.cancelled():
                self._leave(key, 0.0)  # granted as the caller gave up: pass it on
            else:
                waiter.cancel()
                waiters = self._resuming.get(key)
                if waiters is not None:
                    with contextlib.suppress(ValueError):
                        waiters.remove(waiter)
                    if not waiters:
                        del self._resuming[key]
            if isinstance(error, TimeoutError):
                raise deadline_exceeded(
                    "the turn's lease came, but no turn slot of its namespace before the deadline"
                ) from None
            raise


def current() -> Slot | None:
    """The admission of the call being served, if it has one."""
    return _slot_var.get()


def leave() -> None:
    """End the current call's admission (the guard calls this when the call ends)."""
    slot = _slot_var.get()
    if slot is not None:
        slot.release()
        _slot_var.set(None)
