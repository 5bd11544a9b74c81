"""ByteBudget (services/common/byte_budget.py): bytes held per process and per namespace,
waiters served in order within a namespace and namespaces in turn."""

from __future__ import annotations

import asyncio

import pytest

from services.common.byte_budget import ByteBudget, Charge


async def _pending(budget: ByteBudget, key: str, size: int) -> asyncio.Task[Charge]:
    """A task acquiring `size` for `key`, run until it holds or waits."""
    task = asyncio.create_task(budget.acquire(key, size))
    await asyncio.sleep(0)  # one turn of the loop: the task asks (and maybe gets)
    return task


async def test_a_namespace_holds_at_most_its_share_and_waits_for_its_own_bytes() -> None:
    waiting: list[int] = []
    budget = ByteBudget(total=100, per_key=40, on_waiting=waiting.append)
    first = await budget.acquire("a", 30)
    assert not first.waited and budget.held == budget.held_by("a") == 30
    blocked = await _pending(budget, "a", 20)
    assert not blocked.done() and budget.waiting == 1 and waiting == [1]
    # Another namespace is not held back by the first's full share.
    other = await budget.acquire("b", 40)
    assert not other.waited and budget.held == 70
    first.release()
    charge = await blocked
    assert charge.waited and budget.held_by("a") == 20 and waiting == [1, -1]
    first.release()  # idempotent
    assert budget.held == 60


async def test_the_process_total_bounds_every_namespace_together() -> None:
    budget = ByteBudget(total=50, per_key=30)
    a = await budget.acquire("a", 30)
    b = await budget.acquire("b", 20)
    c = await _pending(budget, "c", 10)
    assert not c.done() and budget.held == 50
    b.resize(10)  # gives 10 back: c fits now
    assert (await c).size == 10 and budget.held == 50
    a.release()
    b.release()
    (await c).release()
    assert budget.held == 0 and budget.held_by("a") == 0


async def test_waiters_of_one_namespace_are_served_in_order() -> None:
    budget = ByteBudget(total=100, per_key=30)
    holder = await budget.acquire("a", 30)
    big = await _pending(budget, "a", 30)
    small = await _pending(budget, "a", 5)
    holder.resize(20)
    await asyncio.sleep(0)
    # 10 bytes are free, enough for the small one, but the big one came first.
    assert not big.done() and not small.done()
    holder.release()
    assert (await big).size == 30
    assert not small.done()
    (await big).release()
    assert (await small).size == 5


async def test_namespaces_take_turns_when_the_process_is_full() -> None:
    budget = ByteBudget(total=20, per_key=20)
    hog = await budget.acquire("a", 20)
    a_waiters = [await _pending(budget, "a", 10) for _ in range(3)]
    b_waiter = await _pending(budget, "b", 10)
    hog.release()  # room for two: one of a, then b (not a's whole queue first)
    await asyncio.sleep(0)
    assert a_waiters[0].done() and b_waiter.done()
    assert not a_waiters[1].done() and not a_waiters[2].done()
    for task in (a_waiters[0], b_waiter):
        (await task).release()
    for task in a_waiters[1:]:
        (await task).release()
    assert budget.held == 0


async def test_a_cancelled_waiter_takes_nothing_and_lets_the_next_one_in() -> None:
    budget = ByteBudget(total=100, per_key=30)
    holder = await budget.acquire("a", 25)
    gone = await _pending(budget, "a", 30)
    behind = await _pending(budget, "a", 5)
    assert not behind.done()  # behind the waiter of 30 bytes
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (await behind).size == 5 and budget.waiting == 0
    holder.release()
    (await behind).release()
    assert budget.held == 0


async def test_a_waiter_granted_as_it_is_cancelled_gives_the_bytes_back() -> None:
    budget = ByteBudget(total=100, per_key=30)
    holder = await budget.acquire("a", 30)
    task = await _pending(budget, "a", 30)
    holder.release()  # grants the waiter; it is cancelled before it resumes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.held == 0


async def test_a_charge_grows_past_the_limits_without_waiting_and_reports_changes() -> None:
    changes: list[int] = []
    budget = ByteBudget(total=100, per_key=40, on_change=changes.append)
    charge = await budget.acquire("a", 40)
    charge.resize(60)  # read already: an entry larger than the page reserved
    assert budget.held_by("a") == 60
    charge.resize(10)
    charge.release()
    assert changes == [40, 20, -50, -10] and budget.held == 0
    with pytest.raises(RuntimeError):
        charge.resize(1)


async def test_a_request_larger_than_a_namespace_share_is_refused() -> None:
    budget = ByteBudget(total=100, per_key=40)
    with pytest.raises(ValueError):
        await budget.acquire("a", 41)
    assert budget.held == 0 and budget.waiting == 0


def test_the_watch_budgets_are_checked_at_start() -> None:
    from services.common.settings import SettingsError
    from services.transcript.config import TranscriptLimits

    limits = TranscriptLimits.from_env({})
    assert limits.watch.page_charge == 512 * 1024 + 256 * 1024 + 256 * 1024
    assert limits.watch.max_buffered_bytes_per_namespace == 16 * 1024 * 1024
    # A larger message limit makes a page's reservation larger.
    larger = TranscriptLimits.from_env({"RUNIFOLD_MAX_MESSAGE_BYTES": str(1024 * 1024)})
    assert larger.watch.page_charge == limits.watch.page_charge + 768 * 1024
    with pytest.raises(SettingsError, match="RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE"):
        TranscriptLimits.from_env({"RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE": "65536"})
    with pytest.raises(SettingsError, match="RUNIFOLD_WATCH_MAX_BUFFERED_BYTES "):
        TranscriptLimits.from_env({"RUNIFOLD_WATCH_MAX_BUFFERED_BYTES": str(8 * 1024 * 1024)})
