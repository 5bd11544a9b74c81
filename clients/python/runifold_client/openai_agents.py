"""Runifold as the session of the OpenAI Agents SDK.

Installed with `pip install 'runifold-client[openai-agents]'`.

>>> session = RunifoldSession("user-42-chat", namespace="tenant-42")  # $RUNIFOLD_TARGET
>>> result = await Runner.run(agent, "What did we decide?", session=session)

`OfflineModel` is a deterministic model that needs no network, for examples and tests.

The session is a Runifold conversation (its id: the session id when that is a UUID,
else a UUIDv5 of it). Each SDK item is one entry: the item itself, exactly as given,
in `Message.native_json`, and beside it a readable rendering (role and clipped text)
that summaries and memory read. What each guarantee becomes here: docs/integrations.md.

Branches (the SDK's `AdvancedSQLiteSession.create_branch_from_turn`) are Runifold forks:
`branch_from_turn(n)` and `fork(through_item=k)` return a new session on a fork that
shares the items before it without copying them; the session they came from is not
changed.

>>> turns = await session.get_conversation_turns()
>>> branch = await session.branch_from_turn(2)  # the items before the 2nd user message
>>> await Runner.run(agent, "the 2nd message, edited", session=branch)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseStreamEvent
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.testing import ScriptedModel, assistant_message
from agents.tool import Tool
from openai.types.responses.response_prompt_param import ResponsePromptParam

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw
from runifold_client.client import AsyncClient
from runifold_client.errors import NotFound, RunifoldError, VersionConflict

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
else:
    TResponseInputItem = Any

# Roles whose text is instructions: never stored (the transcript holds no system text).
_INSTRUCTION_ROLES = frozenset({"system", "developer"})
# The attribute of the SDK's per-run context in which a run keeps the version it read.
_RUN_VERSIONS = "_runifold_session_versions"
# The attribute of a run's context holding the run's writer id (see _framework.request_id_for).
_RUN_WRITER = "_runifold_session_writer"
# A pop that loses the compare-and-swap to another writer reads the session again and
# pops what is last then, at most this many times in all: each round some writer wins,
# so this bounds the writers one pop waits behind.
DEFAULT_CONFLICT_ATTEMPTS = 8


class SessionConflict(VersionConflict):
    """Another writer (another run, process or session object) changed the session since
    this run (or this session object) last read or wrote it: nothing of this call was
    saved. Read the session again (a new run does) and retry."""


def _text_of(content: Any) -> str:
    """The text parts of a message item's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, Mapping):
            text = part.get("text") or part.get("refusal")
            texts.append(str(text) if text else f"[{part.get('type', 'part')}]")
    return "\n".join(texts)


def item_to_message(item: TResponseInputItem) -> common_pb2.Message:
    """One SDK item as a Runifold message: the item verbatim in `native_json`, and the
    role and a readable (clipped) text for summaries and memory. System and developer
    items are refused: instructions travel with each run, never in the transcript."""
    native = fw.dumps(item)
    fields: Mapping[str, Any] = item if isinstance(item, Mapping) else json.loads(native)
    role = fields.get("role")
    kind = str(fields.get("type") or "message")
    if role in _INSTRUCTION_ROLES:
        raise ValueError(
            f"a {role} item cannot be stored in a Runifold session: instructions travel "
            "with each run (Agent.instructions) and never persist"
        )
    if role == "user":
        text = _text_of(fields.get("content")) or "[user input]"
        return common_pb2.Message(
            role=common_pb2.ROLE_USER,
            text=fw.clip(text),
            native_json=native,
            metadata={"openai_agents.type": kind},
        )
    if role == "assistant":
        text = _text_of(fields.get("content")) or "[assistant message]"
    elif kind == "function_call":
        text = f"[tool call {fields.get('name', '')}({fields.get('arguments', '')})]"
    elif kind == "function_call_output":
        text = f"[tool result: {_text_of(fields.get('output'))}]"
    elif kind == "reasoning":
        summary = fields.get("summary") or []
        text = "[reasoning] " + " ".join(
            str(s.get("text", "")) for s in summary if isinstance(s, Mapping)
        )
    else:
        text = f"[{kind}]"
    return common_pb2.Message(
        role=common_pb2.ROLE_ASSISTANT,
        text=fw.clip(text.strip() or f"[{kind}]"),
        native_json=native,
        metadata={"openai_agents.type": kind},
    )


def entry_to_item(entry: common_pb2.Entry) -> TResponseInputItem:
    """The SDK item an entry holds (exactly as it was added)."""
    return json.loads(entry.message.native_json)  # type: ignore[no-any-return]


class RunifoldSession:
    """The OpenAI Agents SDK's `Session` protocol on a Runifold conversation.

    - `get_items(limit)` reads the last `limit` standing items backwards (its cost does
      not grow with the session); with no limit (and no `session_settings.limit`), all.
    - `add_items` in a run that read the session is one compare-and-swap append at the
      version the run read or last wrote: a concurrent writer makes it raise
      `SessionConflict` and save nothing. Outside a run (or in a run that never read
      it) it appends at the end, as the SDK's own sessions do: adds at once all land,
      each whole, each its own write. A retry of a call (same object or run, same
      items, nothing else written by it between) replays instead of writing twice; the
      same items from another object or run are its own write. Up to 256 items are
      one atomic append; more are several.
    - `pop_item` retracts the last standing item (a recorded retraction: the transcript
      keeps it, ListEntries shows it retracted) and returns it; a pop that loses the
      compare-and-swap reads the session again and pops the item then last (at most
      `conflict_attempts` times), so pops at once (from objects, runs or processes)
      each return a different item.
    - `clear_session` erases the conversation (entries, summaries, derived memories),
      as an erasure does; the next `add_items` starts it afresh. It erases its branches
      (forks) with it: they share its items.
    - `branch_from_turn(n)`, `fork(through_item=k)`: a new session on a fork of this
      one (ForkConversation) holding the items before its n-th user message, or its first
      k items, shared, not copied; `get_conversation_turns()` numbers the user messages
      as the SDK's `AdvancedSQLiteSession` does, `branches()` lists the forks made of it.

    It may be made outside any event loop and used from any (`Runner.run_sync`,
    threads, one `asyncio.run` after another): its client opens a channel per loop.
    Pass `client=` to share an AsyncClient (this object then never closes it), or
    `target=` (and `token=`) to let it open its own. `session_settings` takes a
    `SessionSettings` or a dict of its fields (unknown keys are refused with TypeError,
    as the SDK's sessions do); by default `SessionSettings()`.
    """

    def __init__(
        self,
        session_id: str,
        *,
        target: str | None = None,
        namespace: str | None = None,
        token: str | None = None,
        client: AsyncClient | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        timeout: float = 30.0,
        conflict_attempts: int = DEFAULT_CONFLICT_ATTEMPTS,
    ) -> None:
        if not session_id:
            raise ValueError("session_id must not be empty")
        if conflict_attempts < 1:
            raise ValueError("conflict_attempts must be at least 1")
        self.session_id = session_id
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.conversation_id = fw.conversation_id_for(session_id)
        self._owns_client = client is None
        self.client = client or AsyncClient(
            target, namespace=namespace, token=token, timeout=timeout
        )
        self.namespace = namespace or self.client.namespace
        self.timeout = timeout
        self.conflict_attempts = conflict_attempts
        # Who writes, outside a run: this object (each run is a writer of its own).
        self._writer = fw.new_writer_id()
        self._in_flight = fw.InFlight()
        # The version this object last read or wrote.
        self._version: int | None = None

    async def close(self) -> None:
        """Close the client, if this session opened it."""
        if self._owns_client:
            await self.client.close()

    # -- versions and writers: per run (the SDK hands each run's context to these methods)

    def _run_version(self, wrapper: Any) -> int | None:
        """The version the run read or last wrote (None outside a run, or in a run that
        has not read this session)."""
        if wrapper is None:
            return None
        versions = getattr(wrapper, _RUN_VERSIONS, None) or {}
        found = versions.get(self.conversation_id)
        return None if found is None else int(found)

    def _writer_of(self, wrapper: Any) -> str:
        """The writer id of a run (made on its first write), or of this object."""
        if wrapper is None:
            return self._writer
        writer = getattr(wrapper, _RUN_WRITER, None)
        if writer is None:
            writer = fw.new_writer_id()
            setattr(wrapper, _RUN_WRITER, writer)
        return str(writer)

    def _remember(self, wrapper: Any, version: int) -> None:
        self._version = version
        if wrapper is not None:
            versions = getattr(wrapper, _RUN_VERSIONS, None)
            if versions is None:
                versions = {}
                setattr(wrapper, _RUN_VERSIONS, versions)
            versions[self.conversation_id] = version

    async def _head(self) -> tuple[int, int]:
        """The conversation's version and last sequence ((0, 0) when it does not exist)."""
        try:
            conversation = await self.client.get_conversation(
                self.conversation_id, namespace=self.namespace
            )
        except NotFound:
            return 0, 0
        return conversation.version, conversation.last_sequence

    async def _create(self) -> int:
        """Make the conversation (or find it): its version."""
        conversation = await self.client.create_conversation(
            namespace=self.namespace,
            conversation_id=self.conversation_id,
            labels={"openai_agents.session_id": fw.clip(self.session_id, fw.MAX_LABEL_CHARS)},
        )
        return conversation.version

    async def _append(
        self,
        writer: str,
        version: int,
        payload: list[str],
        messages: Sequence[common_pb2.Message] = (),
        retract: Sequence[int] = (),
        *,
        compare: bool = True,
    ) -> transcript_pb.AppendEntriesResponse:
        """One append, a compare-and-swap at `version` unless `compare` is false,
        idempotent for `writer`'s retry of a call made at `version`."""
        request_id = self._in_flight.claim(
            fw.request_id_for(self.conversation_id, version, payload, writer=writer)
        )
        try:
            return await self.client.append(
                self.conversation_id,
                list(messages),
                namespace=self.namespace,
                expected_version=version if compare else None,
                retract_sequences=retract,
                request_id=request_id,
            )
        finally:
            self._in_flight.release(request_id)

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: Any = None
    ) -> list[TResponseInputItem]:
        """The latest `limit` items in order (all with no limit), as they were added."""
        limit = resolve_session_limit(limit, self.session_settings)
        version, last = await self._head()
        self._remember(wrapper, version)
        if limit is None:
            return [
                entry_to_item(e)
                async for e in fw.standing_entries(
                    self.client, self.conversation_id, last, self.namespace
                )
            ]
        if limit <= 0:
            return []
        tail = await fw.standing_tail(
            self.client, self.conversation_id, last, limit, self.namespace
        )
        return [entry_to_item(e) for e in tail]

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Append the items atomically (see the class for what a concurrent writer does)."""
        if not items:
            return
        messages = [item_to_message(item) for item in items]
        writer = self._writer_of(wrapper)
        read = self._run_version(wrapper)
        # In a run that read the session, a compare-and-swap at what it read; else an
        # append at the end, as the SDK's sessions make. Either way the version (the one
        # the call starts from) names the call, so that its retry replays.
        version = read if read is not None else self._version
        for start in range(0, len(messages), fw.MAX_ITEMS_PER_APPEND):
            chunk = messages[start : start + fw.MAX_ITEMS_PER_APPEND]
            payload = [m.native_json for m in chunk]
            for attempt in (1, 2):
                if not version:
                    # Never read, or read while it did not exist: make it (idempotent).
                    current = await self._create()
                    if version is None:
                        version = self._version = current
                try:
                    reply = await self._append(
                        writer, version, payload, chunk, compare=read is not None
                    )
                except VersionConflict as error:
                    raise self._conflict(error, version) from None
                except NotFound as error:
                    if read is not None or attempt == 2:
                        raise self._conflict(error, version) from None
                    version = 0  # erased since this object saw it: the session starts afresh
                    continue
                version = reply.version
                self._remember(wrapper, reply.version)
                break

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Retract the most recent standing item and return it (None when there is none).
        A pop that loses the compare-and-swap to another writer pops the item then last."""
        writer = self._writer_of(wrapper)
        read = self._run_version(wrapper)
        version = 0
        for _ in range(self.conflict_attempts):
            version, last = await self._head()
            tail = await fw.standing_tail(
                self.client, self.conversation_id, last, 1, self.namespace
            )
            if not tail:
                self._settle(wrapper, read, version, version)
                return None
            entry = tail[0]
            try:
                reply = await self._append(
                    writer, version, [f"pop {entry.sequence}"], retract=[entry.sequence]
                )
            except (VersionConflict, NotFound):
                continue  # another writer came first: read again, pop what is last now
            self._settle(wrapper, read, version, reply.version)
            return entry_to_item(entry)
        raise self._conflict(None, version)

    def _settle(self, wrapper: Any, read: int | None, before: int, after: int) -> None:
        """After a pop: a run's version moves on only if the run was current (a run
        whose read is stale stays stale, so its next add_items still conflicts)."""
        if read is None or read == before:
            self._remember(wrapper, after)
        else:
            self._version = after

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Erase the session's conversation (and what was derived from it)."""
        try:
            await self.client.erase_conversation(self.conversation_id, namespace=self.namespace)
        except RunifoldError as error:
            if error.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            # A TranscriptService on its own: erase the transcript.
            await self.client.delete_conversation(self.conversation_id, namespace=self.namespace)
        self._remember(wrapper, 0)

    # -- branches: forks of the conversation (the SDK's AdvancedSQLiteSession branches) ----

    async def _standing(self) -> list[common_pb2.Entry]:
        """Every standing item's entry, in order."""
        _, last = await self._head()
        return [
            e
            async for e in fw.standing_entries(
                self.client, self.conversation_id, last, self.namespace
            )
        ]

    async def get_conversation_turns(self) -> list[dict[str, Any]]:
        """The session's user messages, numbered from 1 as the SDK's
        `AdvancedSQLiteSession.get_conversation_turns` numbers its turns: `turn`,
        `content` (at most 100 characters), `full_content`, `sequence` (the entry's), and
        `can_branch` (always True)."""
        turns: list[dict[str, Any]] = []
        for entry in await self._standing():
            if entry.message.role != common_pb2.ROLE_USER:
                continue
            item = entry_to_item(entry)
            content = _text_of(item.get("content")) if isinstance(item, Mapping) else ""
            turns.append(
                {
                    "turn": len(turns) + 1,
                    "content": content[:100],
                    "full_content": content,
                    "sequence": entry.sequence,
                    "can_branch": True,
                }
            )
        return turns

    async def branch_from_turn(
        self, turn_number: int, *, session_id: str | None = None, request_id: str | None = None
    ) -> RunifoldSession:
        """A new session on a fork holding the items before user message `turn_number`
        (1-based, as `get_conversation_turns` numbers them): run the edited message on it
        to regenerate from there, as after the SDK's `create_branch_from_turn`. ValueError
        when there is no such turn. See `fork` for `session_id` and `request_id`."""
        turns = await self.get_conversation_turns()
        if not 1 <= turn_number <= len(turns):
            raise ValueError(
                f"turn {turn_number} does not exist: session {self.session_id!r} has "
                f"{len(turns)} user message(s)"
            )
        # Every entry before the user message: a fork point that may cut the append the
        # message was written in (the server keeps that append's entries up to there).
        through = int(turns[turn_number - 1]["sequence"]) - 1
        return await self._fork_at(through, session_id, request_id)

    async def fork(
        self,
        through_item: int,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> RunifoldSession:
        """A new session on a fork holding this session's first `through_item` items
        (0: none), shared with it, not copied; this session is not changed, nor is the fork
        by what is done to this session afterwards.

        `session_id` names the new session (its conversation: that id when it is a UUID,
        else a UUIDv5 of it, as for any session); by default the fork's own id, a UUIDv7.
        The call is idempotent: by `request_id` when given, else, with a `session_id`, by
        that name (a retry returns the same fork; the name used for another fork point is
        a RunifoldError, REQUEST_ID_REUSED). The new session shares this one's client.
        """
        if through_item < 0:
            raise ValueError("through_item must not be negative")
        through = 0
        if through_item:
            standing = await self._standing()
            if through_item > len(standing):
                raise ValueError(
                    f"session {self.session_id!r} has {len(standing)} item(s), not {through_item}"
                )
            through = standing[through_item - 1].sequence
        return await self._fork_at(through, session_id, request_id)

    async def _fork_at(
        self, through: int, session_id: str | None, request_id: str | None
    ) -> RunifoldSession:
        # A popped item stays popped in the fork: pop_item retracts only the last standing
        # item, so no item before a standing one was retracted after that one was
        # written, and the fork point's version (the last append wholly before the fork
        # point) holds every retraction of the items the fork shares.
        new_id = fw.conversation_id_for(session_id) if session_id else ""
        if request_id is None and new_id:
            request_id = f"openai-agents-branch:{new_id}"
        forked = await self.client.fork_conversation(
            self.conversation_id,
            through,
            namespace=self.namespace,
            new_conversation_id=new_id,
            request_id=request_id,
        )
        return RunifoldSession(
            session_id or forked.conversation_id,
            namespace=self.namespace,
            client=self.client,
            session_settings=self.session_settings,
            timeout=self.timeout,
            conflict_attempts=self.conflict_attempts,
        )

    async def branches(self) -> list[str]:
        """The conversation ids of the forks made of this session (not of its forks), in
        the order they were made; `RunifoldSession(id, ...)` opens one."""
        forks = await self.client.list_forks(self.conversation_id, namespace=self.namespace)
        return [
            f.conversation_id for f in forks if f.source_conversation_id == self.conversation_id
        ]

    def _conflict(self, error: RunifoldError | None, expected: int | None) -> SessionConflict:
        if error is None:
            current: object = "?"
        else:
            current = error.metadata.get(
                "current_version", "0" if isinstance(error, NotFound) else "?"
            )
        return SessionConflict(
            grpc.StatusCode.ABORTED,
            "VERSION_CONFLICT",
            f"session {self.session_id!r} changed since it was read (at version {expected}; "
            f"now {current}): another run or process wrote to it, so nothing of this call "
            "was saved; read it again and retry",
            {"current_version": str(current), "expected_version": str(expected)},
        )


def items_of(entries: Sequence[common_pb2.Entry]) -> list[TResponseInputItem]:
    """The SDK items of entries read through the client (standing ones only)."""
    return [entry_to_item(e) for e in entries if not e.retracted_version and e.message.native_json]


class OfflineModel(Model):
    """An offline, deterministic `Model` of the Agents SDK, for examples and tests: no
    network, no key. It answers every call with one assistant message: how many
    messages came before the user's last one (so a session's history shows) and that
    message echoed, as Runifold's offline agent does ("Context: 2 earlier message(s).
    You said: ..."). It never calls a tool. Streamed runs get the SDK's own event
    sequence (its `agents.testing.ScriptedModel` makes both, one step per call).

    >>> agent = Agent(name="assistant", model=OfflineModel())

    Swap it for a real model (`model="gpt-4.1"`, or any `Model`) to get real answers.
    """

    def __init__(self, *, name: str = "runifold-offline") -> None:
        self.name = name

    def _scripted(self, input: str | list[TResponseInputItem]) -> ScriptedModel:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        said = [
            _text_of(item.get("content"))
            for item in items
            if isinstance(item, Mapping) and item.get("role") in {"user", "assistant"}
        ]
        return ScriptedModel([[assistant_message(fw.offline_answer(said))]])

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        return await self._scripted(input).get_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        events = self._scripted(input).stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        async for event in events:
            yield event
