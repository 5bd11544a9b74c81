"""The local embedder's queue (services/memory/embeddings/local.py): each pass drops the
callers that left, a namespace over its share of the model is refused while others use
it, a long text waits without holding shorter ones back."""

from __future__ import annotations

import asyncio
import contextvars
import signal
from collections.abc import Callable
from typing import TypeVar

import pytest
from prometheus_client import REGISTRY

from services.common import admission
from services.common.errors import DomainError
from services.memory.embeddings.local import LocalEmbedder, _Pending
from tests.support.metrics import shed
from tests.support.waiting import holds, wait_for

T = TypeVar("T")


# Admission keeps each call's slot in a context variable: none left behind (conftest.py).
pytestmark = pytest.mark.usefixtures("own_context")


def _within(seconds: float, run: Callable[[], T]) -> T:
    """`run()` on this thread, interrupted with TimeoutError after `seconds` (a spin
    would hang the suite otherwise)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("the call did not return")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def test_a_pass_drops_callers_cancelled_since_the_last_one() -> None:
    embedder = LocalEmbedder()
    # No worker: the test builds the pass itself (no model is loaded).
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()
    before = sample_abandoned("cancelled")
    callers = [asyncio.ensure_future(embedder.embed([f"text {i}"])) for i in range(3)]
    await wait_for(holds(lambda: embedder.queued == 3))
    # Cancelled just now: their futures are done, their callbacks not yet run (they
    # run on the loop's next turn, after the pass is built).
    callers[0].cancel()
    callers[2].cancel()
    taken = _within(5, embedder._next_pass)
    assert [(item.texts, start, end) for item, start, end in taken] == [(["text 1"], 0, 1)]
    assert embedder.queued == 0
    assert sample_abandoned("cancelled") == before + 2
    embedder._worker.cancel()
    callers[1].cancel()
    await asyncio.gather(*callers, embedder._worker, return_exceptions=True)
    assert sample_abandoned("cancelled") == before + 2, "counted once"


def sample_abandoned(cause: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "runifold_work_abandoned_total", {"resource": "embeddings", "cause": cause}
        )
        or 0.0
    )


async def test_a_namespace_over_its_share_of_the_model_is_refused_only_while_others_use_it() -> (
    None
):
    embedder = LocalEmbedder(namespace_share=0.25)
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()

    def busy(namespace: str, seconds: float) -> None:
        # A pass that kept the model busy `seconds`, all of it for `namespace`.
        item = pending(namespace)
        embedder._charge([(item, 0, 1)], seconds)

    def embed_as(namespace: str) -> asyncio.Future[list[list[float]]]:
        context = contextvars.copy_context()
        context.run(admission.namespace_var.set, namespace)
        return context.run(asyncio.ensure_future, embedder.embed(["a query"]))

    busy("flood", 5.0)  # half of the 10 s window: over a quarter
    alone = embed_as("flood")  # alone, a namespace may use all of the model
    await wait_for(holds(lambda: embedder.queued == 1))
    busy("quiet", 0.2)
    alone_again = embed_as("flood")  # the other used it lately, but waits for nothing
    await wait_for(holds(lambda: embedder.queued == 2))
    served = embed_as("quiet")  # the other namespace waits now: it is not refused
    await wait_for(holds(lambda: embedder.queued == 3))
    before = shed("embeddings", "NAMESPACE_SHARE_EXCEEDED")
    with pytest.raises(DomainError) as refused:
        await asyncio.wait_for(embed_as("flood"), 5)  # refused at once, not queued
    assert refused.value.reason == "NAMESPACE_SHARE_EXCEEDED"
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.metadata == {"resource": "embeddings", "share": "0.25"}
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
    assert shed("embeddings", "NAMESPACE_SHARE_EXCEEDED") == before + 1
    # Over its share too (one call at a time keeps the model busy a good part of the
    # time), but less than the flood: the lighter namespace is never the one refused.
    busy("quiet", 3.0)
    also = embed_as("quiet")
    await wait_for(holds(lambda: embedder.queued == 4))
    with pytest.raises(DomainError):
        await asyncio.wait_for(embed_as("flood"), 5)
    pending_calls = (alone, alone_again, served, also, embedder._worker)
    for task in pending_calls:
        task.cancel()
    await asyncio.gather(*pending_calls, return_exceptions=True)


def pending(namespace: str) -> _Pending:
    future: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
    return _Pending(["x" * 1000], future, None, namespace)


async def test_a_long_text_that_does_not_fit_a_pass_lets_shorter_ones_through() -> None:
    embedder = LocalEmbedder(batch_tokens=256)
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()

    def embed_as(namespace: str, text: str) -> asyncio.Future[list[list[float]]]:
        context = contextvars.copy_context()
        context.run(admission.namespace_var.set, namespace)
        return context.run(asyncio.ensure_future, embedder.embed([text]))

    long, short = "x" * 4000, "where do we deploy?"
    callers: list[asyncio.Future[list[list[float]]]] = []

    def all_queued() -> bool:
        return embedder.queued == len(callers)

    # A namespace with nothing queued goes to the front: the line is q1, flood, q2.
    for namespace, text in (("q2", short), ("flood", long), ("q1", short)):
        callers.append(embed_as(namespace, text))
        await wait_for(holds(all_queued))
    first = [(item.namespace, item.texts[0]) for item, _, _ in embedder._next_pass()]
    second = [(item.namespace, item.texts[0]) for item, _, _ in embedder._next_pass()]
    # The long text waits one pass, at the front; the short ones behind it do not.
    assert first == [("q1", short), ("q2", short)]
    assert second == [("flood", long)]
    for caller in callers:
        caller.cancel()
    embedder._worker.cancel()
    await asyncio.gather(*callers, embedder._worker, return_exceptions=True)
