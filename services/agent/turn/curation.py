"""The curation request after a committed turn (CURATION_MODE_AUTO).

The turn only asks: MemoryService.RequestCuration queues a durable job (one per
conversation), whose workers curate every entry after the conversation's
`curated_through`. The request is sent in the background once the append committed, so
the turn's answer never waits for it: what a turn adds is the scheduling of a task
(bench/curation.py measures it). A request that cannot be sent (MemoryService down
through the retries, this process stopping, too many requests in flight) is counted and
let go: nothing is lost but time, as the conversation's next AUTO turn (or an operator's
RequestCuration) asks again, and a job curates everything after `curated_through`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from services.agent import metrics
from services.agent.ports import Memories
from services.common.deadlines import deadline_var
from services.common.errors import Code, DomainError

log = logging.getLogger(__name__)

# Attempts of one request, the pause before each retry, and the deadline of each.
_ATTEMPTS = 3
_RETRY_AFTER_S = (0.2, 1.0)
_CALL_S = 10.0


class CurationRequests:
    """The curation requests of one process, sent in the background and bounded."""

    def __init__(self, memories: Memories, max_in_flight: int) -> None:
        self.memories = memories
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Requests not finished yet (tests, tools)."""
        return len(self._tasks)

    def request(self, namespace: str, conversation_id: str) -> None:
        """Ask for the curation of a conversation whose turn just committed, without
        waiting. The request acts with the turn caller's identity (copied with the
        context), under its own deadline."""
        if len(self._tasks) >= self.max_in_flight:
            metrics.CURATION_REQUESTS.labels("dropped").inc()
            return
        task = asyncio.get_running_loop().create_task(
            self._send(namespace, conversation_id), name="curation-request"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, namespace: str, conversation_id: str) -> None:
        for attempt in range(_ATTEMPTS):
            # Not the turn's deadline, which may be all but spent once it committed.
            deadline_var.set(time.monotonic() + _CALL_S)
            try:
                await self.memories.request_curation(namespace, conversation_id)
            except DomainError as error:
                # A namespace's requests in flight at their limit is "later" (a burst of
                # turns); its queue full is "no" (its jobs already cover its backlog).
                later = error.reason == "NAMESPACE_CONCURRENCY_LIMIT"
                if error.code is Code.RESOURCE_EXHAUSTED and (
                    not later or attempt == _ATTEMPTS - 1
                ):
                    metrics.CURATION_REQUESTS.labels("refused").inc()
                    return
                transient = later or error.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
                if not transient or attempt == _ATTEMPTS - 1:
                    metrics.CURATION_REQUESTS.labels("failed").inc()
                    log.warning("curation not requested", extra={"reason": error.reason})
                    return
                await asyncio.sleep(max(_RETRY_AFTER_S[attempt], error.retry_after_s or 0.0))
            else:
                metrics.CURATION_REQUESTS.labels("requested").inc()
                return

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let the requests in flight finish (at most `timeout_s`), then cancel the rest."""
        pending = set(self._tasks)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
