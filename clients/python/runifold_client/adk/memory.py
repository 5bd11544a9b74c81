"""RunifoldMemoryService: ADK's memory service on Runifold's MemoryService."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC

from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client import _framework as fw
from runifold_client.adk.events import _text_of
from runifold_client.adk.scope import APP_LABEL, USER_LABEL, _Scope
from runifold_client.client import AsyncClient, source
from runifold_client.errors import NotFound

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionMemories:
    """What `add_session_to_memory` did with a session (counts, never content).

    `proposed` is what the proposer found in entries `from_sequence..through_sequence`;
    of it, `stored` were written (`superseded` of them replacing one of the user's
    memories) and `duplicates` were skipped (the user's memories say them already).
    `proposer` names who proposed ("offline", or the model's provider); `reason` says
    why nothing was stored ("" when something was)."""

    stored: int = 0
    superseded: int = 0
    duplicates: int = 0
    proposed: int = 0
    dropped: int = 0
    from_sequence: int = 0
    through_sequence: int = 0
    proposer: str = ""
    reason: str = ""

    def __str__(self) -> str:
        said = (
            f"stored {self.stored} memor{'y' if self.stored == 1 else 'ies'} of "
            f"{self.proposed} proposed ({self.superseded} superseding, "
            f"{self.duplicates} duplicates)"
        )
        return f"{said}: {self.reason}" if self.reason else said


def _why_nothing(
    proposed: int, duplicates: int, dropped: int, proposer: str, low: int, high: int
) -> str:
    """Why a session gave no memory, in words (no content)."""
    if proposed == 0:
        found = (
            "no durable first-person statement found (names, places, work, preferences, "
            "habits, decisions: docs/memory.md, Proposers)"
            if proposer == "offline"
            else "nothing durable proposed"
        )
        dropped_note = f"; {dropped} malformed proposals dropped" if dropped else ""
        return f"the {proposer} proposer read entries {low}..{high}: {found}{dropped_note}"
    if duplicates == proposed:
        return "every proposal is already one of this user's memories"
    return ""


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
        target: str | None = None,
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

    async def add_session_to_memory(self, session: Session) -> SessionMemories:
        """Remember a session: what the proposer finds in its last PROPOSE_ENTRIES
        entries, stored. Returns what it stored and, when nothing, why; logs the same
        (counts and reasons, never content) at INFO."""
        if not self.propose_sessions:
            return self._report(
                SessionMemories(reason="propose_sessions=False: curate with add_memory")
            )
        scope = _Scope(self.namespace, session.app_name)
        cid = scope.conversation_id(session.user_id, session.id)
        conversation = await self.client.get_conversation(cid, namespace=scope.namespace)
        high = conversation.last_sequence
        if high == 0:
            return self._report(SessionMemories(reason="the session has no events stored"))
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
        stored = superseded = duplicates = 0
        for proposal in reply.proposals:
            mine = [m for m in proposal.related_memory_ids if await self._owned(scope, m, tags)]
            if proposal.action == memory_pb.PROPOSAL_ACTION_DUPLICATE and mine:
                duplicates += 1
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
            stored += 1
            superseded += bool(supersedes)
        proposed = len(reply.proposals)
        return self._report(
            SessionMemories(
                stored=stored,
                superseded=superseded,
                duplicates=duplicates,
                proposed=proposed,
                dropped=reply.dropped_count,
                from_sequence=low,
                through_sequence=high,
                proposer=reply.proposer,
                reason=_why_nothing(
                    proposed, duplicates, reply.dropped_count, reply.proposer, low, high
                ),
            )
        )

    @staticmethod
    def _report(result: SessionMemories) -> SessionMemories:
        logger.info("RunifoldMemoryService.add_session_to_memory: %s", result)
        return result

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
