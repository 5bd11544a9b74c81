"""LangGraph checkpoints of a conversation (a LangGraph thread is a conversation): what
PutCheckpoint, PutCheckpointWrites, GetCheckpoint, ListCheckpoints, DeleteCheckpoints
and CopyCheckpoints hand the store and get back, their limits, and the errors of their
rules. Pure rules: no I/O.

A checkpoint is stored as LangGraph's serializer made it, without its channel values:
a (type, bytes) pair kept verbatim, so every read returns exactly what was put. Its
channel values are stored once per (checkpoint_ns, channel, version): a put carries
the values of the channels whose version is new, and a checkpoint names the versions
it holds, so a thread's storage grows with what changed at each step, not with its
whole state at every step; a value that mostly repeats the channel's value at the
parent checkpoint (a message list that grew) is stored as a delta of it (`delta_of`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from services.common.errors import DomainError, invalid_argument

# LangGraph's checkpoint namespaces, ids, channels, task ids and paths are short names;
# these bound what one request may name.
MAX_NAME_BYTES = 1024
# Runs or conversations one DeleteCheckpoints may name.
MAX_IDS_PER_DELETE = 1000
# ListCheckpoints' page size when the request says 0 (AIP-158).
DEFAULT_PAGE_SIZE = 10
# A value at least this long is stored as a delta of the channel's value at the parent
# checkpoint when it shares at least half its bytes with it (a message list that grew by
# a message: LangGraph's messages channel is the whole list at every version); a chain
# of deltas is at most this deep, then a value is stored whole again. Reading a value
# reads at most that many small rows and one whole value.
DELTA_MIN_BYTES = 1024
DELTA_MAX_DEPTH = 32
# The headers a grown list's bytes may start with before the old items' (msgpack:
# fixarray, array16, array32; JSON: "["), skipped when looking for the shared block.
_HEADER_SKIPS = (0, 1, 3, 5)


@dataclass(frozen=True)
class CheckpointLimits:
    """The limits of checkpoints (RUNIFOLD_CHECKPOINT_*; docs/production.md)."""

    # One serialized value: the checkpoint itself, a channel value, a pending write.
    max_blob_bytes: int = 2 * 1024 * 1024
    # A checkpoint's metadata (JSON).
    max_metadata_bytes: int = 64 * 1024
    # Channel values one put carries, and writes one PutCheckpointWrites carries.
    max_values_per_call: int = 256
    # A whole checkpoint as read back: its serialized form, every channel value it names
    # and its pending writes; a put beyond it is refused (a read could not return it),
    # and a ListCheckpoints page ends once it holds this much (never before its first).
    # Below the transport's send cap (RUNIFOLD_MAX_SEND_MESSAGE_BYTES, 16 MiB).
    max_checkpoint_bytes: int = 8 * 1024 * 1024
    # ListCheckpoints' largest page.
    max_page_size: int = 100


@dataclass(frozen=True, slots=True)
class TypedValue:
    """A serialized value: the serializer's type tag and bytes, verbatim (None: none)."""

    type: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class ChannelValue:
    """The value of one channel at one version."""

    channel: str
    version: str
    value: TypedValue


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    """A pending write of a task against a checkpoint."""

    task_id: str
    idx: int
    channel: str
    value: TypedValue
    task_path: str = ""


@dataclass(frozen=True, slots=True)
class Fence:
    """The turn lease a write commits under (LangGraph's `thread_run`)."""

    turn_id: str
    fencing_token: int


@dataclass(frozen=True, slots=True)
class NewCheckpoint:
    """A checkpoint as PutCheckpoint hands it to the store (validated)."""

    namespace: str
    conversation_id: uuid.UUID
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: TypedValue
    metadata_json: str
    run_id: str | None
    channel_versions: dict[str, str]
    channel_values: tuple[ChannelValue, ...]
    fence: Fence | None
    max_checkpoint_bytes: int


@dataclass(frozen=True, slots=True)
class NewWrites:
    """Pending writes as PutCheckpointWrites hands them to the store (validated)."""

    namespace: str
    conversation_id: uuid.UUID
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    writes: tuple[CheckpointWrite, ...]
    fence: Fence | None
    # What the checkpoint with all its writes may weigh (a read returns them all).
    max_checkpoint_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as reads return it: with its channel values and pending writes."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: TypedValue
    metadata_json: str
    channel_versions: dict[str, str]
    channel_values: tuple[ChannelValue, ...]
    pending_writes: tuple[CheckpointWrite, ...]
    create_time: datetime


@dataclass(frozen=True, slots=True)
class CheckpointQuery:
    """What ListCheckpoints reads: a page of a conversation's checkpoints, newest first."""

    namespace: str
    conversation_id: uuid.UUID
    checkpoint_ns: str | None
    filter_json: str | None
    before_checkpoint_id: str | None
    # The page continues after this (checkpoint_id, checkpoint_ns), from its token.
    after: tuple[str, str] | None
    limit: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class CheckpointPage:
    """A page of checkpoints, and whether more follow."""

    checkpoints: list[StoredCheckpoint]
    more: bool
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointDeletion:
    """What DeleteCheckpoints deleted."""

    checkpoints: int = 0
    channel_values: int = 0
    writes: int = 0


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """What DeleteCheckpoints deletes (validated): the runs', or the conversations'."""

    namespace: str
    run_ids: tuple[str, ...] = ()
    conversation_ids: tuple[uuid.UUID, ...] = ()
    keep_latest: bool = False


@dataclass(frozen=True, slots=True)
class Delta:
    """A value as a delta of its base: its bytes are
    blob[:head_length] + base[base_offset : base_offset + base_length] + blob[head_length:]."""

    blob: bytes
    head_length: int
    base_offset: int
    base_length: int


def delta_of(value: bytes, base: bytes) -> Delta | None:
    """`value` as a delta of `base`: the block of base's bytes after its header (a list
    that grew keeps its old items' bytes, in order) found whole in value; None when that
    block is less than half of value (then the value is stored whole)."""
    for skip in _HEADER_SKIPS:
        block = base[skip:]
        if len(block) * 2 < len(value):
            return None
        at = value.find(block)
        if at >= 0:
            return Delta(value[:at] + value[at + len(block) :], at, skip, len(block))
    return None


def apply_delta(delta: Delta, base: bytes) -> bytes:
    """The bytes of a value stored as `delta` of `base` (exactly the bytes put)."""
    block = base[delta.base_offset : delta.base_offset + delta.base_length]
    return delta.blob[: delta.head_length] + block + delta.blob[delta.head_length :]


def name(value: str, field_name: str, *, required: bool = False) -> str:
    """A checkpoint namespace, id, channel, task id or path: at most MAX_NAME_BYTES of
    UTF-8 without NUL (PostgreSQL's text refuses it); empty only when not required."""
    if required and not value:
        raise invalid_argument("INVALID_CHECKPOINT", f"{field_name} is required", field=field_name)
    if len(value.encode()) > MAX_NAME_BYTES or "\x00" in value:
        raise invalid_argument(
            "INVALID_CHECKPOINT",
            f"{field_name} is at most {MAX_NAME_BYTES} bytes, without NUL",
            field=field_name,
        )
    return value


def typed_value(value: TypedValue, field_name: str, limits: CheckpointLimits) -> TypedValue:
    """A serialized value within RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES, with a type tag."""
    name(value.type, f"{field_name}.type", required=True)
    if value.value is not None and len(value.value) > limits.max_blob_bytes:
        raise invalid_argument(
            "CHECKPOINT_VALUE_TOO_LARGE",
            f"{field_name} is larger than {limits.max_blob_bytes} bytes "
            "(RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES)",
            field=field_name,
            limit_bytes=limits.max_blob_bytes,
        )
    return value


def too_many_values(field_name: str, limit: int) -> DomainError:
    """INVALID_ARGUMENT: more values or writes than one call may carry."""
    return invalid_argument(
        "TOO_MANY_CHECKPOINT_VALUES",
        f"{field_name} holds more than {limit} items (RUNIFOLD_CHECKPOINT_MAX_VALUES_PER_CALL)",
        field=field_name,
        limit=limit,
    )


def put_too_large(field_name: str, limit: int) -> DomainError:
    """INVALID_ARGUMENT: one put's bytes (the checkpoint, its new values, its metadata; or
    one call's writes) beyond an append's (RUNIFOLD_MAX_APPEND_BYTES): what the
    transport's receive cap is made for."""
    return invalid_argument(
        "CHECKPOINT_PUT_TOO_LARGE",
        f"{field_name} carry more than {limit} bytes (RUNIFOLD_MAX_APPEND_BYTES)",
        field=field_name,
        limit_bytes=limit,
    )


def checkpoint_too_large(limit: int) -> DomainError:
    """INVALID_ARGUMENT: the checkpoint with every value it names would exceed what a read
    may return (nothing is written)."""
    return invalid_argument(
        "CHECKPOINT_TOO_LARGE",
        f"the checkpoint with its channel values is larger than {limit} bytes "
        "(RUNIFOLD_CHECKPOINT_MAX_BYTES)",
        field="checkpoint",
        limit_bytes=limit,
    )


def fence(turn_id: str, fencing_token: int | None) -> Fence | None:
    """The lease a write quotes: both the turn id and its fencing token, or neither."""
    if fencing_token is None:
        if turn_id:
            raise invalid_argument(
                "INVALID_FENCING_TOKEN",
                "turn_id is given without its lease's fencing_token",
                field="fencing_token",
            )
        return None
    if not turn_id:
        raise invalid_argument(
            "INVALID_TURN_ID", "a fenced write names its lease's turn_id", field="turn_id"
        )
    return Fence(name(turn_id, "turn_id"), fencing_token)
