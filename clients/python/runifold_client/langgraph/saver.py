"""RunifoldSaver: LangGraph's checkpointer (`BaseCheckpointSaver`) on Runifold.

A LangGraph thread is a Runifold conversation (its id: the thread id when it is a UUID,
else a UUIDv5 of it, as the ADK adapter maps session ids), made on the thread's first
put. TranscriptService stores the checkpoints (PutCheckpoint and the other checkpoint
RPCs): each checkpoint without its channel values, as the serializer made it, and the
values once per (checkpoint_ns, channel, version), so a thread's storage grows with
what changed, not with its whole state at every step. Every value read back is the
serializer's exact (type, bytes).

delete_thread is an erasure (AgentService.EraseConversation): the checkpoints go with
the transcript, its summaries, its memories, and a WatchConversation open on it ends.
copy_thread forks the conversation (ForkConversation) and copies the checkpoints into
the fork on the server.

One run per thread, when asked: `thread_run(config, multitask_strategy="reject" |
"enqueue")` takes the conversation's turn lease (exclusive, or queued first come,
first served), renews it while the run lasts, and returns a config under which every
put is fenced by the lease: a run that lost its lease cannot put any more
(TurnLeaseLost), and puts from outside the lease are refused while it holds
(ConversationBusy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw
from runifold_client.client import AsyncClient, TurnLeaseMode
from runifold_client.errors import AlreadyExists, NotFound, RunifoldError, TurnLeaseLost
from runifold_client.langgraph.messages import REFERENCE_TYPE, MessageMirror

T = TypeVar("T")

# The configurable keys a thread_run's config carries: the lease its puts are fenced by.
# LangGraph keeps keys that start with "__" out of checkpoint metadata.
TURN_ID_KEY = "__runifold_turn_id"
FENCING_TOKEN_KEY = "__runifold_fencing_token"  # noqa: S105  # a config key
# Runs, conversations (one DeleteCheckpoints names at most 1000) and writes (one
# PutCheckpointWrites carries at most RUNIFOLD_CHECKPOINT_MAX_VALUES_PER_CALL, 256 by
# default) per call.
_IDS_PER_DELETE = 1000
_WRITES_PER_CALL = 256
# ListCheckpoints' page size when a list names no smaller limit.
_PAGE_SIZE = 20

MultitaskStrategy = Literal["reject", "enqueue"]


class RunifoldSaver(BaseCheckpointSaver[str]):  # type: ignore[misc]  # langgraph: untyped here
    """LangGraph's checkpointer on Runifold (see the module): sync and async.

    >>> saver = RunifoldSaver(namespace="support")
    >>> graph = builder.compile(checkpointer=saver)
    >>> graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "t-42"}})

    `client` is an AsyncClient to use (else one is made from target, token and the
    environment's RUNIFOLD_TARGET / RUNIFOLD_TOKEN, and closed by `close`); `namespace`
    is the Runifold namespace of every thread (else the client's). With
    `mirror_messages` (the default) the `messages_channel` of a graph's state is
    mirrored into the thread's transcript and stored once (messages.py). The sync
    methods run the async ones on a loop of the saver's own thread: call them from sync
    code, and the async ones from coroutines (a sync method called on a running loop
    blocks it).
    """

    def __init__(
        self,
        *,
        client: AsyncClient | None = None,
        target: str | None = None,
        namespace: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        serde: SerializerProtocol | None = None,
        mirror_messages: bool = True,
        messages_channel: str = "messages",
    ) -> None:
        super().__init__(serde=serde)
        self._owns_client = client is None
        self.client = client or AsyncClient(
            target, namespace=namespace, token=token, timeout=timeout
        )
        self.namespace = self.client.namespace if namespace is None else namespace
        self._mirror = (
            MessageMirror(self.client, self.namespace, messages_channel)
            if mirror_messages
            else None
        )
        # The sync methods run the async ones on a loop of their own, in a thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()

    # -- ids ---------------------------------------------------------------------------

    @staticmethod
    def conversation_id(thread_id: str) -> str:
        """The conversation of a thread: the thread id when it is a UUID, else a UUIDv5."""
        return fw.conversation_id_for(str(thread_id))

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """A channel's next version: its counter and a random part, as PostgresSaver makes
        them. Values are stored once per (channel, version): with bare counters a branch
        resumed from an older checkpoint (time travel) would name the versions of the
        abandoned branch, and read its values. Shorter than PostgresSaver's (49
        characters), since a checkpoint names every version it holds and has seen: the
        counter zero-padded to 12 digits (LangGraph compares versions as strings) and 48
        random bits."""
        if current is None:
            counter = 0
        elif isinstance(current, int):
            counter = current
        else:
            counter = int(str(current).split(".")[0])
        return f"{counter + 1:012}.{random.getrandbits(48):012x}"  # not a secret

    # -- async -------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        found = await self.client.get_checkpoint(
            self.conversation_id(thread_id),
            checkpoint_ns=configurable.get("checkpoint_ns", ""),
            checkpoint_id=configurable.get("checkpoint_id") or "",
            namespace=self.namespace,
        )
        if found is None:
            return None
        return self._tuple(thread_id, found, await self._resolved(thread_id, found))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None or "thread_id" not in config.get("configurable", {}):
            raise ValueError(
                "RunifoldSaver lists the checkpoints of one thread: give its thread_id"
            )
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        if limit is not None and limit <= 0:
            return
        count = 0
        items = self.client.list_checkpoints(
            self.conversation_id(thread_id),
            checkpoint_ns=configurable.get("checkpoint_ns"),
            filter_json=json.dumps(filter) if filter else "",
            before_checkpoint_id=(before or {}).get("configurable", {}).get("checkpoint_id") or "",
            namespace=self.namespace,
            page_size=min(limit, _PAGE_SIZE) if limit else _PAGE_SIZE,
        )
        try:
            async for found in items:
                yield self._tuple(thread_id, found, await self._resolved(thread_id, found))
                count += 1
                if limit is not None and count >= limit:
                    return
        finally:
            await items.aclose()  # type: ignore[attr-defined]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        # Only a thread's first checkpoint (no parent) makes its conversation: a put that
        # continues a thread erased meanwhile (delete_thread under a run in flight) must
        # not bring it back.
        first = not configurable.get("checkpoint_id")
        # The messages channel mirrored into the transcript: its version stored as a
        # reference to the entries (messages.py), or the plain blob when it cannot be.
        plan = (
            await self._mirror.plan(
                thread_id,
                self.conversation_id(thread_id),
                configurable,
                checkpoint,
                new_versions,
                lambda call: self._on_thread(thread_id, call, create=first),
            )
            if self._mirror is not None
            else None
        )
        mirrored = {plan.channel: plan.value} if plan is not None and plan.value else {}
        # The checkpoint without its values (they are stored once per version, apart).
        bare = {**checkpoint, "channel_values": {}}
        type_, data = self.serde.dumps_typed(bare)
        serializable = dict(get_serializable_checkpoint_metadata(config, metadata))
        request = transcript_pb.Checkpoint(
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=configurable.get("checkpoint_id") or "",
            checkpoint=transcript_pb.TypedValue(type=type_, value=data),
            metadata_json=json.dumps(serializable, ensure_ascii=False),
            channel_versions={
                channel: str(version) for channel, version in checkpoint["channel_versions"].items()
            },
            channel_values=[
                transcript_pb.ChannelValue(
                    channel=channel,
                    version=str(version),
                    value=mirrored.get(channel)
                    or (self._typed(values[channel]) if channel in values else _EMPTY),
                )
                for channel, version in new_versions.items()
            ],
        )
        run_id = serializable.get("run_id")
        await self._on_thread(
            thread_id,
            create=first,
            call=lambda cid: self.client.put_checkpoint(
                cid,
                request,
                namespace=self.namespace,
                run_id=str(run_id) if run_id is not None else "",
                **_fence(configurable),
            ),
        )
        if plan is not None and self._mirror is not None:
            self._mirror.remember(thread_id, checkpoint_ns, checkpoint["id"], plan)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        typed = [
            transcript_pb.CheckpointWrite(
                task_id=task_id,
                idx=WRITES_IDX_MAP.get(channel, idx),
                channel=channel,
                value=self._typed(value),
                task_path=task_path,
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        for start in range(0, len(typed), _WRITES_PER_CALL):
            chunk = typed[start : start + _WRITES_PER_CALL]
            await self._on_thread(
                thread_id,
                # LangGraph may write before the put of the checkpoint the writes name
                # lands (its puts are not awaited in order with them): a thread's first
                # writes may make its conversation.
                create=True,
                call=lambda cid, chunk=chunk: self.client.put_checkpoint_writes(
                    cid,
                    configurable.get("checkpoint_ns", ""),
                    configurable["checkpoint_id"],
                    chunk,
                    namespace=self.namespace,
                    **_fence(configurable),
                ),
            )

    async def adelete_thread(self, thread_id: str) -> None:
        """Erase the thread's conversation (AgentService.EraseConversation): its
        checkpoints, transcript, summaries and memories; its watches end."""
        if self._mirror is not None:
            self._mirror.forget(str(thread_id))
        with contextlib.suppress(NotFound):
            await self.client.erase_conversation(
                self.conversation_id(thread_id), namespace=self.namespace
            )

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        ids = [str(run_id) for run_id in run_ids]
        for start in range(0, len(ids), _IDS_PER_DELETE):
            await self.client.delete_checkpoints(
                run_ids=ids[start : start + _IDS_PER_DELETE], namespace=self.namespace
            )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        ids = [self.conversation_id(thread_id) for thread_id in thread_ids]
        for start in range(0, len(ids), _IDS_PER_DELETE):
            await self.client.delete_checkpoints(
                conversation_ids=ids[start : start + _IDS_PER_DELETE],
                keep_latest=strategy == "keep_latest",
                namespace=self.namespace,
            )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Fork the source's conversation into the target's (ForkConversation: the target
        shares the source's transcript) and copy every checkpoint into it. A missing
        source copies nothing; a repeat while the source has not grown is a no-op. A
        target made by an earlier copy of a source that has grown since is refused
        (ValueError; delete the target first): its transcript ends where the source's
        ended then, and the newer checkpoints' messages are entries past that point.
        Copy a thread at rest: a run putting on the source during the copy may have
        checkpoints copied whose messages the fork does not hold."""
        source = self.conversation_id(source_thread_id)
        target = self.conversation_id(target_thread_id)
        try:
            conversation = await self.client.get_conversation(source, namespace=self.namespace)
        except NotFound:
            return
        try:
            await self.client.fork_conversation(
                source,
                conversation.last_sequence,
                namespace=self.namespace,
                new_conversation_id=target,
                # A retry replays this fork; a later copy (the source grew) is another.
                request_id=fw.keyed_request_id(
                    source, "langgraph-copy", f"{target}@{conversation.last_sequence}"
                ),
            )
        except AlreadyExists:
            # Not this fork's replay (its request id names the source's length): the
            # target was made before, from a shorter source, or is another thread.
            raise ValueError(
                f"copy_thread: thread {target_thread_id!r} exists and is not a copy of "
                f"{source_thread_id!r} as it is now; delete it first"
            ) from None
        await self.client.copy_checkpoints(source, target, namespace=self.namespace)

    @contextlib.asynccontextmanager
    async def athread_run(
        self,
        config: RunnableConfig,
        *,
        multitask_strategy: MultitaskStrategy = "reject",
        ttl: float = 30.0,
        wait: float = 600.0,
    ) -> AsyncIterator[RunnableConfig]:
        """Run on the thread alone: take its turn lease (`reject`: ConversationBusy when
        another run holds or waits for it; `enqueue`: wait in line, at most `wait`
        seconds), renew it every ttl/3 while the block runs, release it after. The
        config it yields fences every put of the run by the lease."""
        if multitask_strategy not in ("reject", "enqueue"):
            raise ValueError("multitask_strategy is reject or enqueue")
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        cid = await self._ensure_thread(thread_id)
        turn_id = "langgraph-run-" + uuid.uuid4().hex
        reply = await self.client.acquire_turn_lease(
            cid,
            turn_id,
            namespace=self.namespace,
            mode=TurnLeaseMode.EXCLUSIVE
            if multitask_strategy == "reject"
            else TurnLeaseMode.QUEUED,
            ttl=ttl,
            timeout=wait if multitask_strategy == "enqueue" else None,
        )
        token = reply.lease.fencing_token
        renewal = asyncio.get_running_loop().create_task(self._renew(cid, turn_id, token, ttl))
        try:
            yield {
                **config,
                "configurable": {**configurable, TURN_ID_KEY: turn_id, FENCING_TOKEN_KEY: token},
            }
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
            with contextlib.suppress(Exception):
                await self.client.release_turn_lease(cid, turn_id, token, namespace=self.namespace)
            if self._mirror is not None:
                # The run's puts kept its messages plain (an append cannot commit under
                # the lease without ending it): append them now (messages.py).
                with contextlib.suppress(RunifoldError):
                    await self._catch_up(cid)

    async def aclose(self) -> None:
        """Close the client, if this saver made it."""
        if self._owns_client:
            await self.client.close()

    # -- sync --------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        items = self.alist(config, filter=filter, before=before, limit=limit)
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            self._run(items.aclose())  # type: ignore[attr-defined]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._run(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self.adelete_for_runs(run_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self.aprune(thread_ids, strategy=strategy))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self.acopy_thread(source_thread_id, target_thread_id))

    @contextlib.contextmanager
    def thread_run(
        self,
        config: RunnableConfig,
        *,
        multitask_strategy: MultitaskStrategy = "reject",
        ttl: float = 30.0,
        wait: float = 600.0,
    ) -> Iterator[RunnableConfig]:
        """athread_run for sync code: the lease is renewed on the saver's own loop while
        the block runs."""
        manager = self.athread_run(
            config, multitask_strategy=multitask_strategy, ttl=ttl, wait=wait
        )
        fenced = self._run(manager.__aenter__())
        try:
            yield fenced
        except BaseException as error:
            if not self._run(manager.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._run(manager.__aexit__(None, None, None))

    def close(self) -> None:
        """Close the client (if this saver made it) and the sync methods' loop."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            if self._owns_client:
                asyncio.run_coroutine_threadsafe(self.client.close(), loop).result()
            loop.call_soon_threadsafe(loop.stop)

    # -- internals ---------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the saver's own loop (started on first use) and wait."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="runifold-langgraph", daemon=True
                ).start()
                self._loop = loop
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def _typed(self, value: Any) -> transcript_pb.TypedValue:
        type_, data = self.serde.dumps_typed(value)
        return transcript_pb.TypedValue(type=type_, value=data or b"")

    async def _resolved(self, thread_id: str, found: transcript_pb.Checkpoint) -> dict[str, Any]:
        """The lists a checkpoint's mirrored channels stand for (messages.py)."""
        if self._mirror is None and not any(
            value.value.type == REFERENCE_TYPE for value in found.channel_values
        ):
            return {}
        mirror = self._mirror or MessageMirror(self.client, self.namespace)
        return await mirror.resolve(thread_id, self.conversation_id(thread_id), found)

    def _tuple(
        self, thread_id: str, found: transcript_pb.Checkpoint, resolved: Mapping[str, Any]
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(
            (found.checkpoint.type, found.checkpoint.value)
        )
        checkpoint["channel_values"] = {
            value.channel: resolved[value.channel]
            if value.channel in resolved
            else self.serde.loads_typed((value.value.type, value.value.value))
            for value in found.channel_values
            if value.value.type != "empty"
        }
        writes = sorted(
            found.pending_writes,
            key=lambda write: writes_sort_key(write.task_path, write.task_id, write.idx),
        )
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": found.checkpoint_ns,
                "checkpoint_id": found.checkpoint_id,
            }
        }
        parent: RunnableConfig | None = (
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": found.checkpoint_ns,
                    "checkpoint_id": found.parent_checkpoint_id,
                }
            }
            if found.parent_checkpoint_id
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=json.loads(found.metadata_json or "{}"),
            parent_config=parent,
            pending_writes=[
                (
                    write.task_id,
                    write.channel,
                    self.serde.loads_typed((write.value.type, write.value.value)),
                )
                for write in writes
            ],
        )

    async def _catch_up(self, cid: str) -> None:
        """Mirror the messages of the thread's latest checkpoint when it holds them plain."""
        assert self._mirror is not None
        found = await self.client.get_checkpoint(cid, namespace=self.namespace)
        if found is None:
            return
        for value in found.channel_values:
            if value.channel == self._mirror.channel and value.value.type not in (
                REFERENCE_TYPE,
                "empty",
            ):
                messages = self.serde.loads_typed((value.value.type, value.value.value))
                if isinstance(messages, list):
                    await self._mirror.catch_up(cid, messages, found.checkpoint_id)

    async def _ensure_thread(self, thread_id: str) -> str:
        """The thread's conversation, made when it does not exist (idempotent)."""
        cid = self.conversation_id(thread_id)
        await self.client.create_conversation(conversation_id=cid, namespace=self.namespace)
        return cid

    async def _on_thread(self, thread_id: str, call: Any, *, create: bool) -> Any:
        """`call(conversation_id)`; with `create` (a thread's first put), after making the
        thread's conversation when the first attempt finds none. Without, a thread that
        is gone (erased) stays gone: NotFound."""
        cid = self.conversation_id(thread_id)
        try:
            return await call(cid)
        except NotFound as missing:
            if not create or missing.reason != "CONVERSATION_NOT_FOUND":
                raise
        await self._ensure_thread(thread_id)
        return await call(cid)

    async def _renew(self, cid: str, turn_id: str, token: int, ttl: float) -> None:
        """Renew the lease every ttl/3 until cancelled; a lost lease stops renewing (the
        run's next put is refused: TurnLeaseLost)."""
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self.client.renew_turn_lease(
                    cid, turn_id, token, namespace=self.namespace, ttl=ttl
                )
            except (TurnLeaseLost, NotFound):
                return
            except RunifoldError:
                continue  # a transient failure: the next renewal may reach the server


_EMPTY = transcript_pb.TypedValue(type="empty", value=b"")


async def _next(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


def _fence(configurable: Mapping[str, Any]) -> dict[str, Any]:
    """The lease a thread_run's config carries, as the put calls take it."""
    token = configurable.get(FENCING_TOKEN_KEY)
    if token is None:
        return {}
    return {"turn_id": str(configurable[TURN_ID_KEY]), "fencing_token": int(token)}
