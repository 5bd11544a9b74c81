"""Erasure receipts: the records and their rules (no I/O).

A receipt belongs to one incarnation of one conversation of one namespace, and there is
never more than one: every call of the same erasure merges into it (`merge`). Counts
only grow (an erasure retried after a partial failure reports what every call erased,
or at least what this one did), and a part once erased never comes back into
`remaining`: a late, stale report cannot undo a later one. The receipt is complete when
nothing remains, and stays so.

TranscriptService keeps the counts by name and does not interpret the other services':
it adds its own ("entries", "appends") when it deletes the transcript.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from services.common.errors import DomainError, invalid_argument, not_found

# What one erasure reports: at most this many counts and remaining parts, each named by
# 1..32 characters of [a-z_].
MAX_NAMES = 32
_NAME = re.compile(r"[a-z_]{1,32}")

# The counts TranscriptService adds when it deletes a transcript.
ENTRIES = "entries"
APPENDS = "appends"
# The forks erased with the conversation (ForkConversation: they share its entries).
FORKS = "forks"
# The LangGraph checkpoints erased with it and its forks (checkpoints/: a thread is a
# conversation), their values and pending writes with them.
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True, slots=True)
class ErasureProgress:
    """What an erasure reports: per store, what it erased; the parts not yet erased."""

    counts: Mapping[str, int]
    remaining: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class ErasureReceipt:
    """The receipt of the erasure of one incarnation of a conversation: counts, never
    content; complete (`complete_time`) once nothing remains."""

    receipt_id: uuid.UUID
    namespace: str
    conversation_id: uuid.UUID
    incarnation: int
    counts: Mapping[str, int]
    remaining: Sequence[str]
    create_time: datetime
    complete_time: datetime | None = None


def check_progress(counts: Mapping[str, int], remaining: Sequence[str]) -> ErasureProgress:
    """A report as the store keeps it (remaining sorted, each once); INVALID_ARGUMENT /
    INVALID_ERASURE_PROGRESS naming the field for a bad name or a negative count."""
    for field, names in (("progress.counts", list(counts)), ("progress.remaining", remaining)):
        if len(names) > MAX_NAMES:
            raise invalid_argument(
                "INVALID_ERASURE_PROGRESS", f"{field} holds at most {MAX_NAMES} names", field=field
            )
        for name in names:
            if not _NAME.fullmatch(name):
                raise invalid_argument(
                    "INVALID_ERASURE_PROGRESS",
                    f"{field} names must be 1..32 characters of a-z and _",
                    field=field,
                )
    if any(value < 0 for value in counts.values()):
        raise invalid_argument(
            "INVALID_ERASURE_PROGRESS",
            "progress.counts must not be negative",
            field="progress.counts",
        )
    return ErasureProgress(dict(counts), sorted(set(remaining)))


def merge(
    kept: ErasureReceipt | None,
    progress: ErasureProgress,
    *,
    receipt_id: uuid.UUID,
    namespace: str,
    conversation_id: uuid.UUID,
    incarnation: int,
    now: datetime,
) -> ErasureReceipt:
    """The receipt after a report: the first report makes it (with `receipt_id`); a later
    one keeps the larger of each count and only the parts both still list. The
    PostgreSQL store applies the same rule in one statement (statements.RECORD)."""
    if kept is None:
        remaining = sorted(set(progress.remaining))
        return ErasureReceipt(
            receipt_id,
            namespace,
            conversation_id,
            incarnation,
            dict(progress.counts),
            remaining,
            now,
            None if remaining else now,
        )
    counts = dict(kept.counts)
    for name, value in progress.counts.items():
        counts[name] = max(counts.get(name, 0), value)
    remaining = sorted(set(kept.remaining) & set(progress.remaining))
    complete = kept.complete_time or (None if remaining else now)
    return ErasureReceipt(
        kept.receipt_id,
        kept.namespace,
        kept.conversation_id,
        kept.incarnation,
        counts,
        remaining,
        kept.create_time,
        complete,
    )


def receipt_not_found() -> DomainError:
    """NOT_FOUND: no such receipt in this namespace (never made, in another namespace, or
    past its retention); the same in every case."""
    return not_found("ERASURE_RECEIPT_NOT_FOUND", "erasure receipt not found")
