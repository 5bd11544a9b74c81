"""The blocking client: the methods of AsyncClient, run on an event loop of its own.

`Client` runs an `AsyncClient` on a loop in a background thread and turns each method
into a blocking call (each async iterator into an iterator); it adds no logic of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc

from runifold_client.client.aio import AsyncClient

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Client, P], R]:
    """The blocking form of an AsyncClient coroutine method."""

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(method(self.aio, *args, **kwargs))

    return call


def _iterating(
    method: Callable[Concatenate[AsyncClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[Client, P], Iterator[T]]:
    """The blocking form of an AsyncClient async-iterator method."""

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(method(self.aio, *args, **kwargs))

    return call


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, aio: AsyncClient) -> None:
    """Close the channel, stop the loop and its thread (close(), or a forgotten client)."""
    if loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(aio.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    loop.close()


class Client:
    """Blocking client with the methods of AsyncClient (and the same arguments).

    >>> client = Client(namespace="tenant-42")  # the target: $RUNIFOLD_TARGET, else 127.0.0.1:50051
    >>> result = client.run_conversation("What did we decide?", conversation_id=cid,
    ...     policy=ConversationContextPolicy(window=16).with_semantic_memory(8))

    It owns an AsyncClient (`aio`) on an event loop in a background thread: calls from
    several threads share one channel, and a Client works inside an async program too.
    What it is not given (target, namespace, token) it reads from RUNIFOLD_TARGET,
    RUNIFOLD_NAMESPACE and RUNIFOLD_TOKEN, as AsyncClient does.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        namespace: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="runifold-client", daemon=True
        )
        self._thread.start()

        self.aio = AsyncClient(  # used only on the client's own loop
            target,
            namespace=namespace,
            token=token,
            credentials=credentials,
            timeout=timeout,
            max_attempts=max_attempts,
        )
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, self.aio)

    @property
    def namespace(self) -> str:
        """The default namespace of every call."""
        return self.aio.namespace

    @namespace.setter
    def namespace(self, value: str) -> None:
        self.aio.namespace = value

    @property
    def target(self) -> str:
        return self.aio.target

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel and stop the client's thread."""
        self._finalizer()

    def _run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async iterator, each fetched on the client's loop.

        Leaving early (a `break`, an exception, Ctrl-C while an item is awaited) closes
        it: a fetch still running on the loop is cancelled and waited for first, as an
        async generator cannot be closed while it runs (`aclose(): asynchronous
        generator is already running`)."""
        fetching: list[asyncio.Task[Any]] = []

        async def step() -> tuple[bool, T | None]:
            task = asyncio.current_task()
            assert task is not None
            fetching[:] = [task]
            try:
                return True, await anext(items)
            except StopAsyncIteration:
                return False, None
            finally:
                fetching.clear()

        async def close() -> None:
            for task in fetching:  # a fetch the caller stopped waiting for
                task.cancel()
                await asyncio.wait([task])
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

        pending: concurrent.futures.Future[tuple[bool, T | None]] | None = None
        try:
            while True:
                pending = asyncio.run_coroutine_threadsafe(step(), self._loop)
                more, item = pending.result()
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            if pending is not None:
                # Interrupted before the fetch began on the loop (a loaded machine):
                # it never begins; begun, close() cancels it and waits for it.
                pending.cancel()
            if not self._loop.is_closed():
                self._run(close())

    run_conversation = _blocking(AsyncClient.run_conversation)
    stream_conversation = _iterating(AsyncClient.stream_conversation)
    erase_conversation = _blocking(AsyncClient.erase_conversation)
    erasure_receipt = _blocking(AsyncClient.erasure_receipt)
    create_conversation = _blocking(AsyncClient.create_conversation)
    create_conversation_reply = _blocking(AsyncClient.create_conversation_reply)
    get_state = _blocking(AsyncClient.get_state)
    get_conversation = _blocking(AsyncClient.get_conversation)
    list_conversations = _iterating(AsyncClient.list_conversations)
    list_namespaces = _iterating(AsyncClient.list_namespaces)
    append = _blocking(AsyncClient.append)
    entries = _iterating(AsyncClient.entries)
    fork_conversation = _blocking(AsyncClient.fork_conversation)
    list_forks = _blocking(AsyncClient.list_forks)
    appends = _iterating(AsyncClient.appends)
    verify_conversation = _blocking(AsyncClient.verify_conversation)
    watch_conversation = _iterating(AsyncClient.watch_conversation)
    load_view = _blocking(AsyncClient.load_view)
    delete_conversation = _blocking(AsyncClient.delete_conversation)
    record_erasure_receipt = _blocking(AsyncClient.record_erasure_receipt)
    mark_curated = _blocking(AsyncClient.mark_curated)
    acquire_turn_lease = _blocking(AsyncClient.acquire_turn_lease)
    renew_turn_lease = _blocking(AsyncClient.renew_turn_lease)
    release_turn_lease = _blocking(AsyncClient.release_turn_lease)
    put_checkpoint = _blocking(AsyncClient.put_checkpoint)
    put_checkpoint_writes = _blocking(AsyncClient.put_checkpoint_writes)
    get_checkpoint = _blocking(AsyncClient.get_checkpoint)
    list_checkpoints = _iterating(AsyncClient.list_checkpoints)
    delete_checkpoints = _blocking(AsyncClient.delete_checkpoints)
    copy_checkpoints = _blocking(AsyncClient.copy_checkpoints)
    get_summary = _blocking(AsyncClient.get_summary)
    commit_summary = _blocking(AsyncClient.commit_summary)
    summarize = _blocking(AsyncClient.summarize)
    request_summary = _blocking(AsyncClient.request_summary)
    backlog = _blocking(AsyncClient.backlog)
    erase_summaries = _blocking(AsyncClient.erase_summaries)
    upsert_memory = _blocking(AsyncClient.upsert_memory)
    remember = _blocking(AsyncClient.remember)
    get_memory = _blocking(AsyncClient.get_memory)
    list_memories = _iterating(AsyncClient.list_memories)
    search_memories = _blocking(AsyncClient.search_memories)
    delete_memory = _blocking(AsyncClient.delete_memory)
    forget_source = _blocking(AsyncClient.forget_source)
    memory_erasure = _blocking(AsyncClient.memory_erasure)
    propose_memories = _blocking(AsyncClient.propose_memories)
    confirm_proposal = _blocking(AsyncClient.confirm_proposal)
    request_curation = _blocking(AsyncClient.request_curation)
    curation_backlog = _blocking(AsyncClient.curation_backlog)
    memory_revisions = _iterating(AsyncClient.memory_revisions)
    watch_memories = _iterating(AsyncClient.watch_memories)
