"""Runifold as the session and memory service of Google ADK.

Installed with `pip install 'runifold-client[adk]'`.

>>> sessions = RunifoldSessionService(target="127.0.0.1:50051")
>>> memory = RunifoldMemoryService(target="127.0.0.1:50051")
>>> runner = Runner(agent=agent, app_name="support", session_service=sessions,
...                 memory_service=memory)

Without `namespace`, each ADK `app_name` is the Runifold namespace (so it must be 1..128
characters of [A-Za-z0-9_.-]); with one, every app lives in it, apart. A session is a
conversation (a UUIDv5 of app, user and session id) of a Runifold user; each event is
one entry (the event exactly, in `Message.native_json`, beside a readable rendering);
the session's, the user's and the app's state are the conversation's, the user's and
the namespace's state, changed with the event's append under one compare-and-swap.
What each guarantee becomes here: docs/integrations.md.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

import grpc
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw
from runifold_client.client import DEFAULT_TARGET, AsyncClient, source
from runifold_client.errors import NotFound, RunifoldError, VersionConflict

logger = logging.getLogger(__name__)

# The conversation state key that holds the session's last update time (the last
# event's timestamp): a key no ADK state key is (it starts with a control character),
# left out of every state this service returns.
LAST_UPDATE_KEY = "\x1fadk.last_update_time"
# Separates the app from a key or a user id when several apps share one namespace.
_APP_SEPARATOR = "\x1f"
# GetState reads at most this many users at once.
_STATE_USERS_PER_CALL = 100
# Labels of an ADK session's conversation.
APP_LABEL, USER_LABEL, SESSION_LABEL = "adk.app", "adk.user", "adk.session"
_STALE = (
    "The session has been modified in storage since it was loaded "
    "(Runifold version {seen}, now {current}). Please reload the session before "
    "appending more events."
)


def _text_of(content: types.Content | None) -> str:
    """A readable rendering of an event's content for summaries and memory."""
    if content is None or not content.parts:
        return ""
    pieces = []
    for part in content.parts:
        if part.text:
            pieces.append(part.text)
        elif part.function_call:
            call = part.function_call
            pieces.append(f"[tool call {call.name}({json.dumps(call.args, default=str)})]")
        elif part.function_response:
            answer = part.function_response
            pieces.append(
                f"[tool result {answer.name}: {json.dumps(answer.response, default=str)}]"
            )
        elif part.inline_data:
            pieces.append(f"[{part.inline_data.mime_type or 'data'}]")
        else:
            pieces.append("[part]")
    return "\n".join(pieces)


def event_to_message(event: Event) -> common_pb2.Message:
    """One ADK event as a Runifold message: the event verbatim in `native_json`, its
    author's role and a readable (clipped) text beside it."""
    text = _text_of(event.content).strip()
    if not text:
        text = "[state change]" if event.content is None else "[event]"
    return common_pb2.Message(
        role=common_pb2.ROLE_USER if event.author == "user" else common_pb2.ROLE_ASSISTANT,
        text=fw.clip(text),
        native_json=event.model_dump_json(exclude_none=True),
        metadata={"adk.author": fw.clip(event.author, fw.MAX_LABEL_CHARS)},
    )


def entry_to_event(entry: common_pb2.Entry) -> Event:
    """The ADK event an entry holds, exactly as it was appended."""
    return Event.model_validate_json(entry.message.native_json)


class _Scope:
    """Where an app's sessions, users and app state live in Runifold."""

    def __init__(self, fixed_namespace: str | None, app_name: str) -> None:
        self.app_name = app_name
        self.shared = bool(fixed_namespace)
        self.namespace = fixed_namespace or app_name

    def user(self, user_id: str) -> str:
        """The Runifold user of an ADK user of this app."""
        return f"{self.app_name}{_APP_SEPARATOR}{user_id}" if self.shared else user_id

    def app_key(self, key: str) -> str:
        return f"{self.app_name}{_APP_SEPARATOR}{key}" if self.shared else key

    def app_state(self, namespace_state: Mapping[str, Any]) -> dict[str, Any]:
        """This app's keys of the namespace's state."""
        if not self.shared:
            return dict(namespace_state)
        prefix = self.app_name + _APP_SEPARATOR
        return {k[len(prefix) :]: v for k, v in namespace_state.items() if k.startswith(prefix)}

    def conversation_id(self, user_id: str, session_id: str) -> str:
        return fw.conversation_id_for(self.app_name, user_id, session_id)

    def delta(self, state: Mapping[str, Any], timestamp: float) -> transcript_pb.StateDelta:
        """ADK's prefixed state delta as Runifold's three scopes (temp: never stored)."""
        parts = _session_util.extract_json_safe_state_delta(dict(state))
        session_part = {**parts["session"], LAST_UPDATE_KEY: timestamp}
        return transcript_pb.StateDelta(
            conversation_json=fw.dumps(session_part),
            user_json=fw.dumps(parts["user"]) if parts["user"] else "",
            namespace_json=(
                fw.dumps({self.app_key(k): v for k, v in parts["app"].items()})
                if parts["app"]
                else ""
            ),
        )


def _merge(
    session_state: Mapping[str, Any],
    app_state: Mapping[str, Any],
    user_state: Mapping[str, Any],
) -> dict[str, Any]:
    merged = {k: v for k, v in session_state.items() if k != LAST_UPDATE_KEY}
    merged.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
    return merged


class RunifoldSessionService(BaseSessionService):  # type: ignore[misc]  # google.adk: untyped
    """ADK's BaseSessionService on Runifold conversations (see the module).

    A stale session (another writer appended since it was loaded) is refused with
    StaleSessionError by Runifold's compare-and-swap on the conversation version, and
    nothing of the refused event (entry or state) is stored.
    """

    def __init__(
        self,
        *,
        target: str = DEFAULT_TARGET,
        namespace: str | None = None,
        token: str | None = None,
        client: AsyncClient | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._owns_client = client is None
        self.client = client or AsyncClient(target, token=token, timeout=timeout)
        self.namespace = namespace

    async def close(self) -> None:
        """Close the client, if this service opened it."""
        if self._owns_client:
            await self.client.close()

    def _scope(self, app_name: str) -> _Scope:
        return _Scope(self.namespace, app_name)

    async def _states(
        self, scope: _Scope, user_ids: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The app's state and these users' (by ADK user id)."""
        users = list(dict.fromkeys(user_ids))
        app_state: dict[str, Any] = {}
        by_user: dict[str, dict[str, Any]] = {}
        for start in range(0, max(len(users), 1), _STATE_USERS_PER_CALL):
            chunk = users[start : start + _STATE_USERS_PER_CALL]
            reply = await self.client.get_state(
                [scope.user(u) for u in chunk], namespace=scope.namespace
            )
            app_state = scope.app_state(json.loads(reply.namespace_state.state_json or "{}"))
            for user_id, state in zip(chunk, reply.user_states, strict=True):
                by_user[user_id] = json.loads(state.state_json or "{}")
        return app_state, by_user

    def _session(
        self,
        scope: _Scope,
        user_id: str,
        session_id: str,
        conversation: transcript_pb.Conversation,
        app_state: Mapping[str, Any],
        user_state: Mapping[str, Any],
        events: list[Event],
    ) -> Session:
        state = json.loads(conversation.state_json or "{}")
        updated = state.get(LAST_UPDATE_KEY)
        session = Session(
            id=session_id,
            app_name=scope.app_name,
            user_id=user_id,
            state=_merge(state, app_state, user_state),
            events=events,
            last_update_time=(
                float(updated)
                if updated is not None
                else conversation.create_time.ToMicroseconds() / 1e6
            ),
        )
        session._storage_update_marker = str(conversation.version)
        return session

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        scope = self._scope(app_name)
        sid = session_id or str(uuid.uuid4())
        reply = await self.client.create_conversation_reply(
            namespace=scope.namespace,
            conversation_id=scope.conversation_id(user_id, sid),
            labels={
                APP_LABEL: fw.clip(app_name, fw.MAX_LABEL_CHARS),
                USER_LABEL: fw.clip(user_id, fw.MAX_LABEL_CHARS),
                SESSION_LABEL: fw.clip(sid, fw.MAX_LABEL_CHARS),
            },
            user_id=scope.user(user_id),
            state=scope.delta(state or {}, time.time()),
        )
        if not reply.created:
            raise AlreadyExistsError(f"Session {sid} already exists.")
        app_state, users = await self._states(scope, [user_id])
        return self._session(scope, user_id, sid, reply.conversation, app_state, users[user_id], [])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        scope = self._scope(app_name)
        cid = scope.conversation_id(user_id, session_id)
        try:
            conversation = await self.client.get_conversation(cid, namespace=scope.namespace)
        except NotFound:
            return None
        events = await self._events(scope, cid, conversation.last_sequence, config)
        app_state, users = await self._states(scope, [user_id])
        return self._session(
            scope, user_id, session_id, conversation, app_state, users[user_id], events
        )

    async def _events(
        self, scope: _Scope, cid: str, last: int, config: GetSessionConfig | None
    ) -> list[Event]:
        """The events GetSessionConfig asks for, read from the end backwards: the cost
        grows with what is returned, never with the session's length. `after_timestamp`
        keeps the suffix of events at or after it (events are appended in time order)."""
        recent = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        if recent == 0:
            return []
        if after is None:
            if recent is None:
                return [
                    entry_to_event(e)
                    async for e in fw.standing_entries(self.client, cid, last, scope.namespace)
                ]
            tail = await fw.standing_tail(self.client, cid, last, recent, scope.namespace)
            return [entry_to_event(e) for e in tail]
        found: list[Event] = []
        through, step = last, recent or 64
        while through > 0 and (recent is None or len(found) < recent):
            page = await fw.standing_tail(self.client, cid, through, step, scope.namespace)
            if not page:
                break
            for entry in reversed(page):
                event = entry_to_event(entry)
                if event.timestamp < after or (recent is not None and len(found) == recent):
                    return found[::-1]
                found.append(event)
            through = page[0].sequence - 1
        return found[::-1]

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        scope = self._scope(app_name)
        found = [
            c
            async for c in self.client.list_conversations(
                namespace=scope.namespace,
                user_id=scope.user(user_id) if user_id is not None else "",
                with_state=True,
                page_size=50,
            )
            if c.labels.get(APP_LABEL) == app_name and SESSION_LABEL in c.labels
        ]
        app_state, users = await self._states(scope, [c.labels[USER_LABEL] for c in found])
        sessions = [
            self._session(
                scope,
                c.labels[USER_LABEL],
                c.labels[SESSION_LABEL],
                c,
                app_state,
                users[c.labels[USER_LABEL]],
                [],
            )
            for c in found
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Erase the session's conversation (and what was derived from it)."""
        scope = self._scope(app_name)
        cid = scope.conversation_id(user_id, session_id)
        try:
            await self.client.erase_conversation(cid, namespace=scope.namespace)
        except RunifoldError as error:
            if error.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            await self.client.delete_conversation(cid, namespace=scope.namespace)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        scope = self._scope(app_name)
        _, users = await self._states(scope, [user_id])
        return users[user_id]

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        scope = self._scope(session.app_name)
        cid = scope.conversation_id(session.user_id, session.id)
        expected = await self._expected_version(scope, cid, session)
        message = event_to_message(event)
        delta = event.actions.state_delta if event.actions and event.actions.state_delta else {}
        # The event's id is the write's idempotency key: an event delivered again (a
        # retry after a lost reply, a re-delivery, from this session object or another)
        # is stored once, whatever version its session was loaded at.
        request_id = (
            fw.keyed_request_id(cid, "adk.event", event.id)
            if event.id
            else fw.request_id_for(cid, expected, [message.native_json])
        )
        try:
            reply = await self.client.append(
                cid,
                [message],
                namespace=scope.namespace,
                expected_version=expected,
                request_id=request_id,
                state_delta=scope.delta(delta, event.timestamp),
            )
        except VersionConflict as error:
            raise StaleSessionError(
                _STALE.format(seen=expected, current=error.current_version)
            ) from None
        except NotFound:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        if reply.replayed and (
            expected >= reply.version or any(e.id == event.id for e in session.events)
        ):
            # Stored already, and this session holds it (or was loaded after it): as
            # ADK's in-memory service does with an equal re-delivery, nothing changes.
            return event
        if not reply.replayed or expected == reply.version - 1:
            # A replay here is a retry whose first reply was lost: the session takes the
            # event as that first call would have. Were there writes between, its marker
            # stays where it was, and its next append is refused as stale.
            session._storage_update_marker = str(reply.version)
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    async def _expected_version(self, scope: _Scope, cid: str, session: Session) -> int:
        """The version the session was loaded at; for a session this service did not
        load (no marker), the current one unless it was updated after the session's
        last_update_time."""
        if session._storage_update_marker is not None:
            return int(session._storage_update_marker)
        try:
            conversation = await self.client.get_conversation(cid, namespace=scope.namespace)
        except NotFound:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        stored = json.loads(conversation.state_json or "{}").get(LAST_UPDATE_KEY, 0.0)
        if float(stored) > session.last_update_time + 1e-3:
            raise StaleSessionError(_STALE.format(seen="?", current=conversation.version))
        return conversation.version


class RunifoldMemoryService(BaseMemoryService):  # type: ignore[misc]  # google.adk: untyped
    """ADK's BaseMemoryService on Runifold's MemoryService.

    Memories live in the app's namespace (or the fixed one), tagged with the app and
    user (`adk.app`, `adk.user` metadata) that search filters by. Every memory points
    back to the transcript range it came from: `add_memory` needs the session it was
    learnt in (`custom_metadata={"session_id": ...}`) and records that session's range.

    `add_session_to_memory` (ADK's explicit "remember this session") runs
    ProposeMemories over the session's last PROPOSE_ENTRIES entries and stores what
    it proposes, each with its exact source range: a DUPLICATE of one of this user's
    memories is skipped, a SUPERSEDE of one of them supersedes it; a match with
    another user's memory of a shared namespace counts for nothing (stored as new).
    With `propose_sessions=False` it stores nothing (curate with `add_memory` alone).
    """

    # ProposeMemories reads at most this many entries (RUNIFOLD_MEMORY_PROPOSE_MAX_ENTRIES).
    PROPOSE_ENTRIES = 200

    def __init__(
        self,
        *,
        target: str = DEFAULT_TARGET,
        namespace: str | None = None,
        token: str | None = None,
        client: AsyncClient | None = None,
        search_limit: int = 8,
        timeout: float = 30.0,
        propose_sessions: bool = True,
    ) -> None:
        self._owns_client = client is None
        self.client = client or AsyncClient(target, token=token, timeout=timeout)
        self.namespace = namespace
        self.search_limit = search_limit
        self.propose_sessions = propose_sessions

    async def close(self) -> None:
        """Close the client, if this service opened it."""
        if self._owns_client:
            await self.client.close()

    def _tags(self, app_name: str, user_id: str) -> dict[str, str]:
        return {
            APP_LABEL: fw.clip(app_name, fw.MAX_LABEL_CHARS),
            USER_LABEL: fw.clip(user_id, fw.MAX_LABEL_CHARS),
        }

    async def add_session_to_memory(self, session: Session) -> None:
        if not self.propose_sessions:
            logger.info(
                "RunifoldMemoryService.add_session_to_memory stores nothing "
                "(propose_sessions=False: curate with add_memory)"
            )
            return
        scope = _Scope(self.namespace, session.app_name)
        cid = scope.conversation_id(session.user_id, session.id)
        conversation = await self.client.get_conversation(cid, namespace=scope.namespace)
        high = conversation.last_sequence
        if high == 0:
            return
        low = max(1, high - self.PROPOSE_ENTRIES + 1)
        tags = self._tags(session.app_name, session.user_id)
        # Only this user's memories are matched and shown to the proposer.
        reply = await self.client.propose_memories(
            cid,
            from_sequence=low,
            through_sequence=high,
            namespace=scope.namespace,
            metadata_filter=tags,
        )
        for proposal in reply.proposals:
            mine = [m for m in proposal.related_memory_ids if await self._owned(scope, m, tags)]
            if proposal.action == memory_pb.PROPOSAL_ACTION_DUPLICATE and mine:
                continue
            supersedes = mine[:1] if proposal.action == memory_pb.PROPOSAL_ACTION_SUPERSEDE else []
            # The sources go as proposed: they name the incarnation read, so a session erased
            # meanwhile (and perhaps made again under its id) is refused, not written into.
            # The request id names it too: the same fact of a session made again is another
            # write, not a retry of the erased session's.
            incarnation = proposal.sources[0].incarnation if proposal.sources else 0
            await self.client.upsert_memory(
                proposal.content,
                sources=proposal.sources,
                namespace=scope.namespace,
                metadata=tags,
                valid_from=proposal.valid_from_time.ToDatetime(tzinfo=UTC)
                if proposal.HasField("valid_from_time")
                else None,
                supersedes=supersedes,
                request_id=fw.request_id_for(f"{cid}/{incarnation}", high, [proposal.content]),
            )

    async def _owned(self, scope: _Scope, memory_id: str, tags: Mapping[str, str]) -> bool:
        """Whether a memory is this app's user's (a shared namespace holds others')."""
        try:
            memory = await self.client.get_memory(memory_id, namespace=scope.namespace)
        except NotFound:
            return False
        return all(memory.metadata.get(k) == v for k, v in tags.items())

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        scope = _Scope(self.namespace, app_name)
        for memory in memories:
            extra = {**(custom_metadata or {}), **memory.custom_metadata}
            session_id = extra.get("session_id")
            if not session_id:
                raise ValueError(
                    "a Runifold memory points back to the transcript it came from: pass "
                    'custom_metadata={"session_id": ...} (the ADK session it was learnt in)'
                )
            cid = scope.conversation_id(user_id, str(session_id))
            conversation = await self.client.get_conversation(cid, namespace=scope.namespace)
            low = int(str(extra.get("from_sequence", 1)))
            high = int(str(extra.get("through_sequence", conversation.last_sequence)))
            text = _text_of(memory.content).strip()
            tags = self._tags(app_name, user_id)
            if memory.author:
                tags["adk.author"] = fw.clip(memory.author, fw.MAX_LABEL_CHARS)
            await self.client.upsert_memory(
                text,
                sources=[source(cid, low, high)],
                namespace=scope.namespace,
                memory_id=memory.id or "",
                metadata=tags,
                request_id=fw.request_id_for(cid, high, [text]),
            )

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        scope = _Scope(self.namespace, app_name)
        reply = await self.client.search_memories(
            query,
            namespace=scope.namespace,
            limit=self.search_limit,
            metadata_filter=self._tags(app_name, user_id),
        )
        return SearchMemoryResponse(
            memories=[
                MemoryEntry(
                    content=types.Content(role="user", parts=[types.Part(text=hit.memory.content)]),
                    id=hit.memory.memory_id,
                    author=hit.memory.metadata.get("adk.author"),
                    timestamp=hit.memory.create_time.ToDatetime().isoformat() + "Z",
                    custom_metadata={
                        "score": hit.score,
                        "sources": [
                            {
                                "conversation_id": s.conversation_id,
                                "from_sequence": s.from_sequence,
                                "through_sequence": s.through_sequence,
                            }
                            for s in hit.memory.sources
                        ],
                    },
                )
                for hit in reply.results
            ]
        )

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        if not memory_id:
            return
        namespace = _Scope(self.namespace, app_name).namespace
        try:
            found = await self.client.get_memory(memory_id, namespace=namespace)
        except NotFound:
            return
        # Only the app's and user's own memory: another user's id deletes nothing.
        if dict(found.metadata).items() >= self._tags(app_name, user_id).items():
            await self.client.delete_memory(memory_id, namespace=namespace)
