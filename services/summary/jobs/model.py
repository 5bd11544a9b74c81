"""The summary job queue's records: a job, its states, a queue's depth."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime


class JobState(enum.IntEnum):
    """State of a summary job. Values equal the protobuf enum's."""

    PENDING = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


# The job state as stored (its name in lower case, readable in SQL) and back.
STATES_BY_NAME = {state.name.lower(): state for state in JobState}


@dataclass(frozen=True, slots=True)
class Job:
    """A background summarization job of one conversation."""

    job_id: uuid.UUID
    namespace: str
    conversation_id: uuid.UUID
    window: int
    summary_batch: int
    state: JobState
    attempts: int
    failures: int
    create_time: datetime
    enqueue_time: datetime
    lease_token: uuid.UUID | None = None
    claimed_by: str = ""
    last_error: str = ""
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job as RequestSummary asks for it (already validated)."""

    job_id: uuid.UUID
    namespace: str
    conversation_id: uuid.UUID
    window: int
    summary_batch: int
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class JobQueue:
    """The summary job queue of one namespace (or of all, for the gauges): its depth,
    the age of its oldest waiting job, and its failed (parked) and running jobs."""

    depth: int = 0
    oldest_pending_age_s: float = 0.0
    failed_count: int = 0
    running_count: int = 0
