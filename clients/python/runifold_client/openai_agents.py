"""Runifold as the session of the OpenAI Agents SDK.

Installed with `pip install 'runifold-client[openai-agents]'`.

>>> session = RunifoldSession("user-42-chat", target="127.0.0.1:50051", namespace="tenant-42")
>>> result = await Runner.run(agent, "What did we decide?", session=session)

The session is a Runifold conversation (its id: the session id when that is a UUID,
else a UUIDv5 of it). Each SDK item is one entry: the item itself, exactly as given,
in `Message.native_json`, and beside it a readable rendering (role and clipped text)
that summaries and memory read. What each guarantee becomes here: docs/integrations.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from runifold.common.v1 import common_pb2
from runifold_client import _framework as fw
from runifold_client.client import DEFAULT_TARGET, AsyncClient
from runifold_client.errors import NotFound, RunifoldError, VersionConflict

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings
else:
    TResponseInputItem = Any
    SessionSettings = Any

# Roles whose text is instructions: never stored (the transcript holds no system text).
_INSTRUCTION_ROLES = frozenset({"system", "developer"})
# The attribute of the SDK's per-run context in which a run keeps the version it read.
_RUN_VERSIONS = "_runifold_session_versions"


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
    - `add_items` is one compare-and-swap append at the version this run (or, outside a
      run, this object) last read or wrote, idempotent for a retry of the same call;
      a concurrent writer makes it raise `SessionConflict` and save nothing. Up to 256
      items are one atomic append; more are several, each compare-and-swap.
    - `pop_item` retracts the last standing item (a recorded retraction: the transcript
      keeps it, ListEntries shows it retracted) and returns it.
    - `clear_session` erases the conversation (entries, summaries, derived memories),
      as an erasure does; the next `add_items` starts it afresh.

    Pass `client=` to share an AsyncClient (this object then never closes it), or
    `target=` (and `token=`) to let it open its own.
    """

    def __init__(
        self,
        session_id: str,
        *,
        target: str = DEFAULT_TARGET,
        namespace: str = "",
        token: str | None = None,
        client: AsyncClient | None = None,
        session_settings: SessionSettings | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not session_id:
            raise ValueError("session_id must not be empty")
        self.session_id = session_id
        self.session_settings = session_settings
        self.conversation_id = fw.conversation_id_for(session_id)
        self._owns_client = client is None
        self.client = client or AsyncClient(target, namespace=namespace, token=token)
        self.namespace = namespace or self.client.namespace
        self.timeout = timeout
        # The version this object last read or wrote, when used outside a run.
        self._version: int | None = None

    async def close(self) -> None:
        """Close the client, if this session opened it."""
        if self._owns_client:
            await self.client.close()

    # -- versions: per run (the SDK hands each run's context to these methods) ----------

    def _seen(self, wrapper: Any) -> int | None:
        if wrapper is not None:
            versions = getattr(wrapper, _RUN_VERSIONS, None) or {}
            if self.conversation_id in versions:
                return int(versions[self.conversation_id])
        return self._version

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

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: Any = None
    ) -> list[TResponseInputItem]:
        """The latest `limit` items in order (all with no limit), as they were added."""
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
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
        """Append the items atomically at the version last seen (see the class)."""
        if not items:
            return
        messages = [item_to_message(item) for item in items]
        expected = self._seen(wrapper)
        if not expected:
            # Never read, or read while it did not exist: make it (idempotent).
            await self.client.create_conversation(
                namespace=self.namespace,
                conversation_id=self.conversation_id,
                labels={"openai_agents.session_id": fw.clip(self.session_id, fw.MAX_LABEL_CHARS)},
            )
        for start in range(0, len(messages), fw.MAX_ITEMS_PER_APPEND):
            chunk = messages[start : start + fw.MAX_ITEMS_PER_APPEND]
            request_id = (
                fw.request_id_for(self.conversation_id, expected, (m.native_json for m in chunk))
                if expected is not None
                else None
            )
            try:
                reply = await self.client.append(
                    self.conversation_id,
                    chunk,
                    namespace=self.namespace,
                    expected_version=expected,
                    request_id=request_id,
                )
            except VersionConflict as error:
                raise self._conflict(error, expected) from None
            except NotFound as error:  # cleared (erased) since this run read it
                raise self._conflict(error, expected) from None
            expected = reply.version
            self._remember(wrapper, reply.version)

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Retract the most recent standing item and return it (None when there is none)."""
        version, last = await self._head()
        tail = await fw.standing_tail(self.client, self.conversation_id, last, 1, self.namespace)
        if not tail:
            self._remember(wrapper, version)
            return None
        entry = tail[0]
        try:
            reply = await self.client.append(
                self.conversation_id,
                [],
                namespace=self.namespace,
                expected_version=version,
                retract_sequences=[entry.sequence],
                request_id=fw.request_id_for(
                    self.conversation_id, version, [f"pop {entry.sequence}"]
                ),
            )
        except (VersionConflict, NotFound) as error:
            raise self._conflict(error, version) from None
        self._remember(wrapper, reply.version)
        return entry_to_item(entry)

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

    def _conflict(self, error: RunifoldError, expected: int | None) -> SessionConflict:
        current = error.metadata.get("current_version", "0" if isinstance(error, NotFound) else "?")
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
