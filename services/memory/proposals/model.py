"""Proposals and their rules: what a checked proposal is, and `check_proposals`, which
keeps only what a proposer answered well formed, inside the range that was read, and
naming a related memory it was shown (the others are dropped and counted). What a
proposer answers is untrusted. No I/O."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from services.common.domain import Entry
from services.common.errors import DomainError, not_found
from services.memory.model import Memory, MemorySource

ADD, SUPERSEDE, DUPLICATE = "ADD", "SUPERSEDE", "DUPLICATE"
ACTIONS = (ADD, SUPERSEDE, DUPLICATE)

# A proposal's reason is clipped to this (UTF-8 bytes).
MAX_REASON_BYTES = 512


@dataclass(frozen=True, slots=True)
class RelatedMemory:
    """A stored memory shown to the proposer under a short alias ("m1")."""

    alias: str
    memory: Memory
    score: float


@dataclass(frozen=True, slots=True)
class Proposal:
    """A checked proposal: what the application may confirm with UpsertMemory."""

    content: str
    sources: Sequence[MemorySource]
    valid_from_time: datetime
    action: str
    related_memory_ids: Sequence[uuid.UUID]
    reason: str


def normalised(text: str) -> str:
    """Text compared for sameness: case, spacing and end punctuation ignored."""
    return " ".join(re.sub(r"[.!?]+$", "", text.strip()).lower().split())


def valid_from_of(memory: Memory) -> datetime:
    """When a memory's fact became true (its create time unless it says)."""
    return memory.valid_from_time or memory.create_time


# --- checking what a proposer answered ----------------------------------------------


@dataclass(frozen=True, slots=True)
class ProposalLimits:
    """What a proposal must respect to be returned (and the incarnation of the conversation
    that was read, which every source of a proposal names)."""

    conversation_id: uuid.UUID
    from_sequence: int
    through_sequence: int
    max_content_bytes: int
    max_sources: int
    max_proposals: int
    incarnation: int = 0


def _integer(value: Any) -> int | None:
    # JSON booleans are ints in Python: not a sequence number.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _clip_bytes(text: str, limit: int) -> str:
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore")


def _checked(
    item: Any,
    limits: ProposalLimits,
    entry_times: Mapping[int, datetime],
    related: Mapping[str, RelatedMemory],
) -> Proposal | None:
    """One proposal if every part of it holds, else None (dropped)."""
    if not isinstance(item, Mapping):
        return None
    content = item.get("content")
    if not isinstance(content, str) or not content.strip() or "\x00" in content:
        return None
    content = content.strip()
    if len(content.encode("utf-8", "surrogatepass")) > limits.max_content_bytes:
        return None
    raw_sources = item.get("sources")
    if not isinstance(raw_sources, list) or not 1 <= len(raw_sources) <= limits.max_sources:
        return None
    sources: list[MemorySource] = []
    for raw in raw_sources:
        low = _integer(raw.get("from_sequence")) if isinstance(raw, Mapping) else None
        high = _integer(raw.get("through_sequence")) if isinstance(raw, Mapping) else None
        if low is None or high is None:
            return None
        if not limits.from_sequence <= low <= high <= limits.through_sequence:
            return None  # out of the range that was read: not a provenance we checked
        if low not in entry_times:
            return None
        sources.append(MemorySource(limits.conversation_id, low, high, limits.incarnation))
    earliest = entry_times[min(s.from_sequence for s in sources)]
    raw_valid = item.get("valid_from_time")
    if raw_valid is None:
        valid_from = earliest
    elif isinstance(raw_valid, str):
        try:
            valid_from = datetime.fromisoformat(raw_valid)
        except ValueError:
            return None
        if valid_from.tzinfo is None:
            return None  # an instant needs its offset
    else:
        return None
    action = item.get("action")
    if action not in ACTIONS:
        return None
    reason = item.get("reason")
    reason = (
        _clip_bytes(reason.replace("\x00", ""), MAX_REASON_BYTES) if isinstance(reason, str) else ""
    )
    related_ids: list[uuid.UUID] = []
    if action != ADD:
        alias = item.get("related_memory")
        target = related.get(alias) if isinstance(alias, str) else None
        if target is None:
            return None  # names no memory it was shown
        if action == SUPERSEDE and not (
            target.memory.valid_until_time is None and valid_from_of(target.memory) < valid_from
        ):
            return None  # UpsertMemory would refuse it: only an older, open fact is replaced
        related_ids.append(target.memory.memory_id)
    else:
        same = next(
            (r for r in related.values() if normalised(r.memory.content) == normalised(content)),
            None,
        )
        if same is not None:
            # Worded exactly like a stored memory: nothing new to add.
            action, related_ids = DUPLICATE, [same.memory.memory_id]
    return Proposal(content, sources, valid_from, action, related_ids, reason)


def check_proposals(
    items: Sequence[Any],
    limits: ProposalLimits,
    entries: Sequence[Entry],
    related: Sequence[RelatedMemory],
) -> tuple[list[Proposal], int]:
    """The well-formed, in-range proposals (in the order given, each content once, at most
    `limits.max_proposals`) and how many were dropped as malformed or out of range."""
    entry_times = {e.sequence: e.created_at for e in entries}
    by_alias = {r.alias: r for r in related}
    kept: list[Proposal] = []
    seen: set[str] = set()
    dropped = 0
    for item in items:
        proposal = _checked(item, limits, entry_times, by_alias)
        if proposal is None:
            dropped += 1
            continue
        if normalised(proposal.content) in seen or len(kept) >= limits.max_proposals:
            continue
        seen.add(normalised(proposal.content))
        kept.append(proposal)
    return kept, dropped


# -- the errors of ProposeMemories ---------------------------------------------------


def conversation_erased() -> DomainError:
    """NOT_FOUND: the conversation was erased (or erased and created again under the same
    id) while ProposeMemories read it: nothing read from it is proposed."""
    return not_found(
        "CONVERSATION_ERASED",
        "the conversation was erased while its proposals were made; nothing is proposed",
    )


def conversation_not_found() -> DomainError:
    """NOT_FOUND: the conversation to read is not in this namespace (TranscriptService's
    reason, the same whether it never existed or is elsewhere)."""
    return not_found("CONVERSATION_NOT_FOUND", "conversation not found")
