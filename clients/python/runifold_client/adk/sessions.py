"""RunifoldSessionService: ADK's session service on Runifold conversations."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw
from runifold_client.adk.events import entry_to_event, event_to_message
from runifold_client.adk.scope import (
    APP_LABEL,
    LAST_UPDATE_KEY,
    SESSION_LABEL,
    USER_LABEL,
    _merge,
    _Scope,
)
from runifold_client.client import AsyncClient
from runifold_client.errors import NotFound, RunifoldError, VersionConflict

# GetState reads at most this many users at once.
_STATE_USERS_PER_CALL = 100
_STALE = (
    "The session has been modified in storage since it was loaded "
    "(Runifold version {seen}, now {current}). Please reload the session before "
    "appending more events."
)


class RunifoldSessionService(BaseSessionService):  # type: ignore[misc]  # google.adk: untyped
    """ADK's BaseSessionService on Runifold conversations (see the module).

    A stale session (another writer appended since it was loaded) is refused with
    StaleSessionError by Runifold's compare-and-swap on the conversation version, and
    nothing of the refused event (entry or state) is stored.
    """

    def __init__(
        self,
        *,
        target: str | None = None,
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
