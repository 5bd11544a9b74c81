"""The checks and digests of MemoryService requests, before anything is read."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from services.common import validation
from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.memory.model import MemorySource


@dataclass(frozen=True, slots=True)
class SourceInput:
    """A source as the caller sent it (validated by the service)."""

    conversation_id: str
    from_sequence: int
    through_sequence: int


def memory_id(value: str, field: str = "memory_id") -> uuid.UUID:
    """A memory id: a UUID in canonical text form."""
    return validation.uuid_id(value, field, "INVALID_MEMORY_ID")


def check_expected_revision(expected_revision: int | None) -> None:
    """Revisions start at 1: an expected revision below that can never match."""
    if expected_revision is not None and expected_revision < 1:
        raise invalid_argument(
            "INVALID_EXPECTED_REVISION",
            "expected_revision must be at least 1",
            field="expected_revision",
        )


def request_digest(
    memory_id_text: str,
    content: str,
    sources: Sequence[SourceInput],
    metadata: Mapping[str, str],
    expected_revision: int | None,
    expire_time: datetime | None,
    ttl: timedelta | None,
) -> bytes:
    """A digest of an UpsertMemory request as sent (a ttl, not the expiry it makes),
    to tell a retry from another request under the same request id."""
    document = json.dumps(
        [
            memory_id_text.lower(),
            content,
            [[s.conversation_id.lower(), s.from_sequence, s.through_sequence] for s in sources],
            sorted(metadata.items()),
            expected_revision,
            expire_time.isoformat() if expire_time else None,
            ttl.total_seconds() if ttl else None,
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(document.encode("utf-8", "surrogatepass")).digest()


def parse_sources(sources: Sequence[SourceInput], limit: int) -> list[MemorySource]:
    """The sources as the domain records them, each range checked (not yet against the
    transcript: MemoryService does that through TranscriptService)."""
    if not sources:
        raise invalid_argument(
            "NO_SOURCES",
            "a memory needs at least one source range of a transcript",
            field="sources",
        )
    if len(sources) > limit:
        raise invalid_argument(
            "TOO_MANY_SOURCES", f"a memory has at most {limit} sources", field="sources"
        )
    parsed = []
    for i, source in enumerate(sources):
        field = f"sources[{i}]"
        cid = conversation_id(source.conversation_id, f"{field}.conversation_id")
        if source.from_sequence < 1:
            raise invalid_argument(
                "INVALID_SOURCE_RANGE",
                "from_sequence must be at least 1",
                field=f"{field}.from_sequence",
            )
        if source.through_sequence < source.from_sequence:
            raise invalid_argument(
                "INVALID_SOURCE_RANGE",
                "through_sequence must not be before from_sequence",
                field=f"{field}.through_sequence",
            )
        parsed.append(MemorySource(cid, source.from_sequence, source.through_sequence))
    return parsed


def expiry(
    now: datetime,
    expire_time: datetime | None,
    ttl: timedelta | None,
    default_ttl: timedelta | None,
) -> datetime | None:
    """When a memory expires: `expire_time` or `ttl` (not both), else the namespace's
    default TTL, else never."""
    if expire_time is not None and ttl is not None:
        raise invalid_argument(
            "INVALID_EXPIRY", "set expire_time or ttl, not both", field="expire_time"
        )
    if expire_time is not None:
        if expire_time <= now:
            raise invalid_argument(
                "INVALID_EXPIRY", "expire_time must be in the future", field="expire_time"
            )
        return expire_time
    if ttl is not None:
        if ttl <= timedelta(0):
            raise invalid_argument("INVALID_EXPIRY", "ttl must be positive", field="ttl")
        try:
            return now + ttl
        except OverflowError:  # beyond year 9999
            raise invalid_argument(
                "INVALID_EXPIRY", "ttl ends after the year 9999", field="ttl"
            ) from None
    return now + default_ttl if default_ttl else None
