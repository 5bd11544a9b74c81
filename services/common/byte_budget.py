"""A budget of bytes held at once, per process and per namespace, with fair waiting.

A stream that buffers what it sends (WatchConversation's pages, and later
WatchMemories') charges the bytes it holds to the budget before it reads them and
gives them back once the transport took them. One that finds no room waits (holding
nothing else: no database connection, no page) until there is:

- per namespace, at most `per_key` bytes are held at once: one namespace's readers
  that stop reading use up only their namespace's share, never the process's;
- per process, at most `total` bytes;
- waiters are served first come, first served within a namespace, and the
  namespaces in turn: when room frees up it goes to the next namespace in the
  rotation whose first waiter fits its namespace's room, so one namespace's queue
  never keeps another's waiters waiting for the process's room.

Knows nothing of streams, gRPC or SQL. Single event loop; no locks.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Charge:
    """Bytes a holder has of the budget, until `release` (idempotent)."""

    __slots__ = ("_budget", "key", "size", "waited")

    def __init__(self, budget: ByteBudget, key: str, size: int, waited: bool) -> None:
        self._budget: ByteBudget | None = budget
        self.key = key
        self.size = size
        # Whether the holder had to wait for room.
        self.waited = waited

    @property
    def released(self) -> bool:
        return self._budget is None

    def resize(self, size: int) -> None:
        """Hold `size` bytes instead: less gives the rest back at once; more is taken
        without waiting (the holder has read them already), even past the limits."""
        budget = self._budget
        if budget is None:
            raise RuntimeError("the charge was released")
        size = max(0, size)
        delta, self.size = size - self.size, size
        budget._move(self.key, delta)

    def release(self) -> None:
        """Give every byte back (nothing when released already)."""
        budget, self._budget = self._budget, None
        if budget is not None and self.size:
            budget._move(self.key, -self.size)


@dataclass(eq=False, slots=True)
class _Waiter:
    size: int
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ByteBudget:
    """At most `total` bytes held at once, and `per_key` per key (a namespace).

    `on_change(delta)` is told of every change of the bytes held, `on_waiting(delta)` of
    every change of the number of holders waiting for room (+1 as one starts to wait).
    """

    def __init__(
        self,
        total: int,
        per_key: int,
        on_change: Callable[[int], None] | None = None,
        on_waiting: Callable[[int], None] | None = None,
    ) -> None:
        if total < 1 or per_key < 1:
            raise ValueError("a byte budget needs room for at least one byte")
        self.total = total
        self.per_key = min(per_key, total)
        self._on_change = on_change
        self._on_waiting = on_waiting
        self._held = 0
        self._held_by: dict[str, int] = {}  # bounded: keys that hold bytes
        # Keys with waiters, in the order they are served (the rotation).
        self._queues: OrderedDict[str, deque[_Waiter]] = OrderedDict()

    @property
    def held(self) -> int:
        """Bytes held now."""
        return self._held

    def held_by(self, key: str) -> int:
        """Bytes one key holds now."""
        return self._held_by.get(key, 0)

    @property
    def waiting(self) -> int:
        """Holders waiting for room."""
        return sum(len(queue) for queue in self._queues.values())

    async def acquire(self, key: str, size: int) -> Charge:
        """Take `size` bytes for `key`, waiting (cancellably) for room: after every
        earlier waiter of `key`, and in turn with the other keys."""
        if not 0 <= size <= self.per_key:
            raise ValueError(f"{size} bytes do not fit a budget of {self.per_key} per key")
        waiter = _Waiter(size)
        self._queues.setdefault(key, deque()).append(waiter)
        self._grant()
        waited = not waiter.granted.done()
        if waited and self._on_waiting is not None:
            self._on_waiting(1)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                # Granted as it was cancelled: give the bytes back.
                self._move(key, -size)
            else:
                self._forget(key, waiter)
                self._grant()  # the waiters behind it may fit now
            raise
        finally:
            if waited and self._on_waiting is not None:
                self._on_waiting(-1)
        return Charge(self, key, size, waited)

    def _forget(self, key: str, waiter: _Waiter) -> None:
        queue = self._queues.get(key)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self._queues[key]

    def _move(self, key: str, delta: int) -> None:
        if not delta:
            return
        self._held += delta
        left = self._held_by.get(key, 0) + delta
        if left > 0:
            self._held_by[key] = left
        else:
            self._held_by.pop(key, None)
        if self._on_change is not None:
            self._on_change(delta)
        if delta < 0:
            self._grant()

    def _grant(self) -> None:
        """Grant the first waiter of each key in turn while each fits; stop at the first
        one that fits its key's room but not the process's (it is served first when
        room frees up: a large request is not starved by smaller ones of other keys)."""
        progress = True
        while progress and self._queues:
            progress = False
            for key in list(self._queues):
                queue = self._queues[key]
                waiter = queue[0]
                if waiter.granted.done():  # cancelled, not yet forgotten
                    queue.popleft()
                elif self.held_by(key) + waiter.size > self.per_key:
                    continue  # its own namespace is full: others may go
                elif self._held + waiter.size > self.total:
                    return
                else:
                    queue.popleft()
                    self._held += waiter.size
                    self._held_by[key] = self._held_by.get(key, 0) + waiter.size
                    if self._on_change is not None:
                        self._on_change(waiter.size)
                    waiter.granted.set_result(None)
                    progress = True
                if queue:
                    self._queues.move_to_end(key)  # served once: the others' turn
                else:
                    del self._queues[key]
