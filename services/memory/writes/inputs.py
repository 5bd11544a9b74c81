"""The checks and digests of MemoryService requests, before anything is read."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.memory.model import (
    ExternalSource,
    MemorySource,
    Source,
    invalid_validity,
    memory_id,
)
from services.memory.writes.model import Supersession, supersession_cycle

# The most memories one write supersedes.
MAX_SUPERSEDES = 32

# An absolute URI begins with its scheme (RFC 3986, 3.1) and a colon.
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
# What no URI holds: spaces and control characters (C0, DEL, C1); NUL among them.
_NOT_IN_URI = re.compile(r"[\x00-\x20\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class SourceInput:
    """A source as the caller sent it (validated by the service); `incarnation` 0: the
    conversation's current one. With `external_uri`, a source outside a transcript (the
    other fields empty)."""

    conversation_id: str
    from_sequence: int
    through_sequence: int
    incarnation: int = 0
    external_uri: str = ""


def external_uri(value: str, field: str, max_bytes: int) -> str:
    """An external source's URI: absolute (a scheme, a colon, then something), at most
    `max_bytes` in UTF-8, without spaces or control characters. Kept exactly as sent (no
    normalization): ForgetSource matches it byte for byte."""
    problem = ""
    if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        problem = f"is longer than {max_bytes} bytes"
    elif _NOT_IN_URI.search(value):
        problem = "holds a space or a control character"
    elif not (scheme := _URI_SCHEME.match(value)) or scheme.end() == len(value):
        problem = "is not an absolute URI (a scheme such as https: or urn:, then the rest)"
    if problem:
        raise invalid_argument("INVALID_EXTERNAL_URI", f"{field} {problem}", field=field)
    return value


@dataclass(frozen=True, slots=True)
class SupersedeInput:
    """A superseded memory as the caller named it (validated by the service)."""

    memory_id: str
    expected_revision: int | None = None


@dataclass(frozen=True, slots=True)
class ValidityInput:
    """The valid time of an UpsertMemory as sent; None where a field is absent."""

    valid_from_time: datetime | None = None
    valid_until_time: datetime | None = None
    supersedes: Sequence[SupersedeInput] = ()


def check_validity(valid_from: datetime | None, valid_until: datetime | None) -> None:
    """A validity given in full must end after it starts."""
    if valid_from is not None and valid_until is not None and valid_until <= valid_from:
        raise invalid_validity()


def parse_supersedes(
    items: Sequence[SupersedeInput], own_id: uuid.UUID | None
) -> list[Supersession]:
    """The memories a write supersedes: canonical ids, each once, never the memory itself
    (a one-memory cycle), at most MAX_SUPERSEDES."""
    if len(items) > MAX_SUPERSEDES:
        raise invalid_argument(
            "INVALID_SUPERSEDES",
            f"a write supersedes at most {MAX_SUPERSEDES} memories",
            field="supersedes",
        )
    parsed: list[Supersession] = []
    for i, item in enumerate(items):
        mid = memory_id(item.memory_id, f"supersedes[{i}].memory_id")
        if item.expected_revision is not None and item.expected_revision < 1:
            raise invalid_argument(
                "INVALID_EXPECTED_REVISION",
                "expected_revision must be at least 1",
                field=f"supersedes[{i}].expected_revision",
            )
        if mid == own_id:
            raise supersession_cycle(i)
        if any(p.memory_id == mid for p in parsed):
            raise invalid_argument(
                "INVALID_SUPERSEDES",
                f"supersedes[{i}] names a memory already named",
                field=f"supersedes[{i}].memory_id",
            )
        parsed.append(Supersession(mid, item.expected_revision))
    return parsed


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
    validity: ValidityInput | None = None,
) -> bytes:
    """A digest of an UpsertMemory request as sent (a ttl, not the expiry it makes),
    to tell a retry from another request under the same request id."""
    fields: list[object] = [
        memory_id_text.lower(),
        content,
        [
            # An external URI as an object: never equal to a range's list.
            {"u": s.external_uri}
            if s.external_uri
            # The incarnation only when stated: a request without one keeps its digest.
            else [s.conversation_id.lower(), s.from_sequence, s.through_sequence]
            + ([s.incarnation] if s.incarnation else [])
            for s in sources
        ],
        sorted(metadata.items()),
        expected_revision,
        expire_time.isoformat() if expire_time else None,
        ttl.total_seconds() if ttl else None,
    ]
    if validity is not None and (
        validity.valid_from_time or validity.valid_until_time or validity.supersedes
    ):
        # Only when given: a request without them keeps the digest it had before them.
        fields.append(
            [
                validity.valid_from_time.isoformat() if validity.valid_from_time else None,
                validity.valid_until_time.isoformat() if validity.valid_until_time else None,
                [[s.memory_id.lower(), s.expected_revision] for s in validity.supersedes],
            ]
        )
    document = json.dumps(
        fields,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(document.encode("utf-8", "surrogatepass")).digest()


def parse_sources(
    sources: Sequence[SourceInput], limit: int, max_uri_bytes: int = 2048
) -> list[Source]:
    """The sources as the domain records them: each range checked (not yet against the
    transcript: MemoryService does that through TranscriptService), each external URI
    checked for its form."""
    if not sources:
        raise invalid_argument(
            "NO_SOURCES",
            "a memory needs at least one source: a range of a transcript or an external URI",
            field="sources",
        )
    if len(sources) > limit:
        raise invalid_argument(
            "TOO_MANY_SOURCES", f"a memory has at most {limit} sources", field="sources"
        )
    parsed: list[Source] = []
    for i, source in enumerate(sources):
        field = f"sources[{i}]"
        if source.external_uri:
            if (
                source.conversation_id
                or source.from_sequence
                or source.through_sequence
                or source.incarnation
            ):
                raise invalid_argument(
                    "INVALID_EXTERNAL_URI",
                    f"{field} names an external URI and a transcript range: a source is "
                    "one or the other",
                    field=f"{field}.external_uri",
                )
            parsed.append(
                ExternalSource(
                    external_uri(source.external_uri, f"{field}.external_uri", max_uri_bytes)
                )
            )
            continue
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
        if source.incarnation < 0:
            raise invalid_argument(
                "INVALID_INCARNATION",
                "incarnation must not be negative (0: the conversation's current one)",
                field=f"{field}.incarnation",
            )
        parsed.append(
            MemorySource(cid, source.from_sequence, source.through_sequence, source.incarnation)
        )
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
