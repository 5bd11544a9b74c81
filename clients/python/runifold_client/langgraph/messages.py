"""A LangGraph messages channel mirrored into the thread's transcript, and stored once.

A graph's `messages` channel (MessagesState, add_messages) holds the whole history;
stored whole at each new version, as LangGraph's PostgresSaver stores it, a thread's
storage grows with the square of its length. RunifoldSaver instead appends the messages
the transcript does not hold yet as entries of the thread's conversation (AppendEntries:
role, text and tool calls for views, summaries, curation, the console and
WatchConversation; the exact message as `native_json`, LangChain's own serialized form)
and stores for the channel's version only a reference: the entries' sequences in list
order, as ranges (a `runifold-entries` typed value). A message is in the transcript
when its id is in the parent version's reference with the same content; messages of the
parent gone from the new list (RemoveMessage) are retracted in the same append.
Reading a checkpoint turns the reference back into the exact list (ListEntries over
the ranges; a retracted entry keeps its content, which an older checkpoint still needs).

A list that cannot be mirrored keeps the plain blob (the serializer's bytes, as
before): correctness first, every round trip exact. See `MessageMirror.plan` for each
case and why. The put after a plain version finds the transcript's messages by id and
mirrors again; a run under a turn lease (whose puts stay plain) has its messages
appended when it releases the lease (`catch_up`).
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.load import dumpd, load
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import Checkpoint

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw
from runifold_client.client import AsyncClient
from runifold_client.errors import FailedPrecondition, InvalidArgument, VersionConflict

# The typed value a mirrored channel version is stored as: JSON {"ranges": [[first,
# last], ...]}, the entries' sequences in list order.
REFERENCE_TYPE = "runifold-entries"
# Messages (and retractions) per AppendEntries: RUNIFOLD_MAX_MESSAGES_PER_APPEND's default.
_PER_APPEND = fw.MAX_ITEMS_PER_APPEND
# Ranges closer than this are read with one ListEntries walk (the gap read and dropped):
# fewer calls for a list with a few removals, bounded waste.
_READ_GAP = 200
# Reads of the conversation's version for a retracting append that meets other writers.
_VERSION_ATTEMPTS = 5
# Threads whose last put the mirror remembers (so a chat loop never re-reads its parent).
_CACHED_THREADS = 256

# Runs a call on the thread's conversation (made on the thread's first write).
OnThread = Callable[[Callable[[str], Awaitable[Any]]], Awaitable[Any]]


@dataclass(frozen=True)
class Mirrored:
    """A message of a mirrored version: its entry, and the message as read back (a copy:
    a node that changes a message in place does not change what is compared)."""

    sequence: int
    message: BaseMessage
    retractable: bool  # standing, and neither tool calls nor a tool result


@dataclass
class _Known:
    """What a thread's last put (or read) left on its messages channel: the checkpoint,
    and its version's messages (None: a plain blob, whose messages the transcript may
    hold only in part)."""

    checkpoint_id: str
    items: list[Mirrored] | None
    gave_up: bool = False  # a plain version whose messages the transcript refused


@dataclass
class Plan:
    """What a put stores for the messages channel (`value`: the reference, or None for
    the plain blob) and what to remember once the checkpoint is stored."""

    channel: str
    value: transcript_pb.TypedValue | None = None
    items: list[Mirrored] | None = None
    remember: bool = False
    gave_up: bool = False


class MessageMirror:
    """Mirrors one channel (`channel`, "messages" by default) of a saver's threads."""

    def __init__(self, client: AsyncClient, namespace: str, channel: str = "messages") -> None:
        self.client = client
        self.namespace = namespace
        self.channel = channel
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()

    # -- put ---------------------------------------------------------------------------

    async def plan(
        self,
        thread_id: str,
        conversation_id: str,
        configurable: Mapping[str, Any],
        checkpoint: Checkpoint,
        new_versions: Mapping[str, Any],
        on_thread: OnThread,
    ) -> Plan:
        """Append the channel's new messages (and retract its removed ones) and return
        the reference to store; a Plan without value keeps the plain blob."""
        checkpoint_ns = str(configurable.get("checkpoint_ns", ""))
        parent_id = str(configurable.get("checkpoint_id") or "")
        known = self._known.get((thread_id, checkpoint_ns))
        if self.channel not in new_versions:
            # The channel is unchanged: the parent's messages are the new checkpoint's.
            if known is not None and known.checkpoint_id == parent_id:
                return Plan(self.channel, items=known.items, remember=True, gave_up=known.gave_up)
            return Plan(self.channel)
        value = checkpoint["channel_values"].get(self.channel)
        if checkpoint_ns:
            # A subgraph's messages are mostly its parent graph's: mirrored too, they
            # would stand twice in the one transcript.
            return Plan(self.channel, remember=True)
        if configurable.get("__runifold_fencing_token") is not None:
            # Under a thread_run lease an append without the lease is refused
            # (CONVERSATION_BUSY) and one with it ends the lease: a leased run keeps
            # the plain blob until PutCheckpoint can append under the lease itself.
            return Plan(self.channel, remember=True)
        if not isinstance(value, list) or not all(isinstance(m, BaseMessage) for m in value):
            return Plan(self.channel, remember=True)
        parent = await self._parent(conversation_id, checkpoint_ns, parent_id, known)
        if parent is None:
            # The parent is a plain blob (a run under a lease, a list the transcript
            # refused): which of its messages the transcript holds is read from the
            # transcript itself (by message id, once), and the version is mirrored again;
            # nothing is retracted (the transcript may hold entries of other writers).
            # When the transcript refused this thread's messages before, it stays plain
            # (no full read at every put).
            if known is not None and known.checkpoint_id == parent_id and known.gave_up:
                return Plan(self.channel, remember=True, gave_up=True)
            if not all(_mirrorable(m) for m in value):
                return Plan(self.channel, remember=True)
            standing = list((await self.standing(conversation_id)).values())
            plan = await self._mirror(
                conversation_id, checkpoint, value, standing, on_thread, retract=False
            )
            plan.gave_up = plan.value is None
            return plan
        return await self._mirror(conversation_id, checkpoint, value, parent, on_thread)

    async def catch_up(self, conversation_id: str, messages: list[Any], checkpoint_id: str) -> None:
        """Append the messages of a plain version (a run under a lease) the transcript
        does not hold, without retracting anything (after the lease is released)."""
        if not messages or not all(isinstance(m, BaseMessage) and _mirrorable(m) for m in messages):
            return
        standing = await self.standing(conversation_id)
        new = [m for m in messages if m.id not in standing or standing[str(m.id)].message != m]
        entries = [_entry(m) for m in new]
        if not new or any(e is None for e in entries):
            return
        for index in range(0, len(entries), _PER_APPEND):
            key = f"{checkpoint_id}\n{self.channel}\ncatch-up\n{index}"
            await self.client.append(
                conversation_id,
                [e[1] for e in entries[index : index + _PER_APPEND] if e is not None],
                namespace=self.namespace,
                request_id=fw.keyed_request_id(conversation_id, "langgraph-messages", key),
            )

    async def standing(self, conversation_id: str) -> dict[str, Mirrored]:
        """The transcript's LangChain messages by id (the last entry of each id)."""
        by_id: dict[str, Mirrored] = {}
        async for entry in self.client.entries(conversation_id, namespace=self.namespace):
            if not entry.message.native_json or entry.retracted_version:
                continue
            try:
                message = _load(entry.message.native_json)
            except Exception:  # noqa: S112  # another writer's JSON: not a message
                continue
            if message.id:
                by_id[str(message.id)] = Mirrored(entry.sequence, message, _retractable(message))
        return by_id

    def remember(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, plan: Plan) -> None:
        """After the put stored the checkpoint: its messages, for the next put."""
        key = (thread_id, checkpoint_ns)
        if not plan.remember:
            self._known.pop(key, None)
            return
        self._keep(key, _Known(checkpoint_id, plan.items, plan.gave_up))

    async def _mirror(
        self,
        conversation_id: str,
        checkpoint: Checkpoint,
        value: list[BaseMessage],
        parent: list[Mirrored],
        on_thread: OnThread,
        *,
        retract: bool = True,
    ) -> Plan:
        by_id = {item.message.id: item for item in parent}
        seen: set[str] = set()
        slots: list[Mirrored | None] = []
        new: list[tuple[BaseMessage, common_pb2.Message, BaseMessage]] = []
        for message in value:
            if not message.id or message.id in seen:
                # Identity is the id (add_messages gives every message one): without it,
                # or twice in a list, which entry a message is cannot be told.
                return Plan(self.channel, remember=True)
            seen.add(message.id)
            old = by_id.get(message.id)
            if old is not None and old.message == message:
                slots.append(old)
                continue
            entry = _entry(message)
            if entry is None:
                return Plan(self.channel, remember=True)
            new.append(entry)
            slots.append(None)
        kept = {item.sequence for item in slots if item is not None}
        # A removed (or replaced) message is retracted: recorded, its content kept. An
        # entry with tool calls or a tool result cannot be retracted (the transcript keeps
        # a tool exchange whole): it stays standing.
        retractions = [
            item.sequence
            for item in parent
            if retract and item.sequence not in kept and item.retractable
        ]
        sequences: list[int] = []
        chunks = max(
            (len(new) + _PER_APPEND - 1) // _PER_APPEND,
            (len(retractions) + _PER_APPEND - 1) // _PER_APPEND,
        )
        for index in range(chunks):
            part = new[index * _PER_APPEND : (index + 1) * _PER_APPEND]
            # Stable for the put (thread, checkpoint, channel, chunk): a retried put
            # appends nothing twice.
            key = f"{checkpoint['id']}\n{self.channel}\n{index}"
            request_id = fw.keyed_request_id(conversation_id, "langgraph-messages", key)
            retracts = retractions[index * _PER_APPEND : (index + 1) * _PER_APPEND]

            async def append(
                cid: str,
                part: Sequence[Any] = part,
                request_id: str = request_id,
                retracts: Sequence[int] = retracts,
            ) -> transcript_pb.AppendEntriesResponse:
                if not retracts:
                    return await self.client.append(
                        cid,
                        [entry for _, entry, _ in part],
                        namespace=self.namespace,
                        request_id=request_id,
                    )
                # A write that retracts names the version it read (the transcript
                # refuses a retraction made blind); another writer in between: read again.
                for attempt in range(_VERSION_ATTEMPTS):
                    read = await self.client.get_conversation(cid, namespace=self.namespace)
                    try:
                        return await self.client.append(
                            cid,
                            [entry for _, entry, _ in part],
                            namespace=self.namespace,
                            request_id=request_id,
                            retract_sequences=retracts,
                            expected_version=read.version,
                        )
                    except VersionConflict:
                        if attempt + 1 == _VERSION_ATTEMPTS:
                            raise
                raise AssertionError("unreachable")

            try:
                reply = await on_thread(append)
            except (InvalidArgument, FailedPrecondition):
                # The transcript refuses what a graph may hold (a tool result that answers
                # no call right before it, a user message without text, a message over
                # the size limit): the version keeps the plain blob.
                return Plan(self.channel, remember=True)
            if part:
                sequences.extend(range(reply.first_sequence, reply.last_sequence + 1))
        fresh = iter(zip(new, sequences, strict=True))
        items: list[Mirrored] = []
        for slot in slots:
            if slot is not None:
                items.append(slot)
                continue
            (message, _, copy), sequence = next(fresh)
            items.append(Mirrored(sequence, copy, _retractable(message)))
        return Plan(
            self.channel,
            value=transcript_pb.TypedValue(type=REFERENCE_TYPE, value=_reference(items)),
            items=items,
            remember=True,
        )

    async def _parent(
        self,
        conversation_id: str,
        checkpoint_ns: str,
        parent_id: str,
        known: _Known | None,
    ) -> list[Mirrored] | None:
        """The parent version's messages (read from its checkpoint unless the last put
        left them); None when it is a plain blob."""
        if not parent_id:
            return []
        if known is not None and known.checkpoint_id == parent_id:
            return known.items
        found = await self.client.get_checkpoint(
            conversation_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=parent_id,
            namespace=self.namespace,
        )
        if found is None:
            return None
        for value in found.channel_values:
            if value.channel != self.channel:
                continue
            if value.value.type == "empty":
                return []
            if value.value.type != REFERENCE_TYPE:
                return None
            return await self.read(conversation_id, value.value.value)
        return []

    # -- read --------------------------------------------------------------------------

    async def resolve(
        self, thread_id: str, conversation_id: str, found: transcript_pb.Checkpoint
    ) -> dict[str, list[BaseMessage]]:
        """The lists a read checkpoint's references stand for, by channel; remembered
        for the thread's next put."""
        lists: dict[str, list[BaseMessage]] = {}
        for value in found.channel_values:
            if value.value.type == REFERENCE_TYPE:
                known = self._known.get((thread_id, found.checkpoint_ns))
                if (
                    value.channel == self.channel
                    and known is not None
                    and known.checkpoint_id == found.checkpoint_id
                    and known.items is not None
                    and _reference(known.items) == value.value.value
                ):
                    # The thread's last put (a chat loop reads what it just wrote): copies
                    # of its messages, so a node that changes one in place changes neither
                    # what the next put compares with nor what it reads again.
                    lists[value.channel] = [
                        item.message.model_copy(deep=True) for item in known.items
                    ]
                    continue
                items = await self.read(conversation_id, value.value.value)
                lists[value.channel] = [item.message for item in items]
                if value.channel == self.channel:
                    key = (thread_id, found.checkpoint_ns)
                    self._keep(key, _Known(found.checkpoint_id, items))
        return lists

    async def read(self, conversation_id: str, reference: bytes) -> list[Mirrored]:
        """The messages a reference names, in its order (retracted entries included)."""
        ranges: list[list[int]] = json.loads(reference)["ranges"]
        wanted = {s for first, last in ranges for s in range(first, last + 1)}
        entries: dict[int, common_pb2.Entry] = {}
        for first, last in _spans(ranges):
            async for entry in self.client.entries(
                conversation_id,
                namespace=self.namespace,
                after_sequence=first - 1,
                through_sequence=last,
            ):
                if entry.sequence in wanted:
                    entries[entry.sequence] = entry
        items: list[Mirrored] = []
        for first, last in ranges:
            for sequence in range(first, last + 1):
                entry = entries[sequence]
                message = _load(entry.message.native_json)
                items.append(
                    Mirrored(
                        sequence,
                        message,
                        entry.retracted_version == 0 and _retractable(message),
                    )
                )
        return items

    def forget(self, thread_id: str) -> None:
        """Drop what the thread's puts left (its conversation is erased)."""
        for key in [key for key in self._known if key[0] == thread_id]:
            del self._known[key]

    def _keep(self, key: tuple[str, str], known: _Known) -> None:
        self._known[key] = known
        self._known.move_to_end(key)
        while len(self._known) > _CACHED_THREADS:
            self._known.popitem(last=False)


def _entry(message: BaseMessage) -> tuple[BaseMessage, common_pb2.Message, BaseMessage] | None:
    """A message as a transcript entry, with the copy read back from its native JSON;
    None when it cannot be one."""
    if isinstance(message, HumanMessage):
        role = common_pb2.ROLE_USER
    elif isinstance(message, AIMessage):
        role = common_pb2.ROLE_ASSISTANT
    elif isinstance(message, ToolMessage):
        role = common_pb2.ROLE_TOOL
    else:
        # A SystemMessage is never persisted by the transcript (instructions travel per
        # request); a ChatMessage or FunctionMessage has no transcript role.
        return None
    native = json.dumps(dumpd(message), ensure_ascii=False, separators=(",", ":"))
    copy = _load(native)
    if type(copy) is not type(message) or copy != message:
        # LangChain's serialized form does not give this message back exactly (a field
        # it does not serialize): the plain blob does.
        return None
    entry = common_pb2.Message(
        role=role,
        text=_text(message),
        native_json=native,  # the message's id is in it: no metadata repeats it
    )
    if isinstance(message, AIMessage):
        entry.tool_calls.extend(
            common_pb2.ToolCall(
                id=str(call.get("id") or ""),
                name=call["name"],
                arguments_json=json.dumps(call.get("args", {}), ensure_ascii=False),
            )
            for call in message.tool_calls
        )
    if isinstance(message, ToolMessage):
        entry.tool_call_id = message.tool_call_id
    return message, entry, copy


def _mirrorable(message: BaseMessage) -> bool:
    """Whether a message can be an entry at all (its type, its id): checked before a read."""
    return bool(message.id) and isinstance(message, HumanMessage | AIMessage | ToolMessage)


def _text(message: BaseMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return str(message.text)


def _load(native: str) -> BaseMessage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # load() is "beta"; messages only are allowed
        loaded = load(json.loads(native), allowed_objects="messages")
    if not isinstance(loaded, BaseMessage):
        raise ValueError("a mirrored entry does not hold a LangChain message")
    return loaded


def _retractable(message: BaseMessage) -> bool:
    if isinstance(message, ToolMessage):
        return False
    return not (isinstance(message, AIMessage) and message.tool_calls)


def _reference(items: Sequence[Mirrored]) -> bytes:
    """A version's reference: its entries' sequences in list order, as ranges."""
    return json.dumps({"ranges": _ranges([item.sequence for item in items])}).encode()


def _ranges(sequences: Sequence[int]) -> list[list[int]]:
    """Sequences as [first, last] runs, in their order."""
    ranges: list[list[int]] = []
    for sequence in sequences:
        if ranges and ranges[-1][1] + 1 == sequence:
            ranges[-1][1] = sequence
        else:
            ranges.append([sequence, sequence])
    return ranges


def _spans(ranges: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The sequence spans to read for these ranges: sorted, near ones merged."""
    spans: list[tuple[int, int]] = []
    for first, last in sorted((r[0], r[1]) for r in ranges):
        if spans and first <= spans[-1][1] + _READ_GAP:
            spans[-1] = (spans[-1][0], max(spans[-1][1], last))
        else:
            spans.append((first, last))
    return spans
