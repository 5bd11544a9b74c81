"""The error model of every service, independent of the transport.

Domain code raises `DomainError` (or one of its helpers); the gRPC layer turns
it into a canonical status code with a `google.rpc.ErrorInfo` detail carrying
the stable `reason` and `metadata` (AIP-193). Nothing here imports grpc.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

ERROR_DOMAIN = "runifold.io"


class Code(enum.Enum):
    """Canonical status codes used by the services (the gRPC names)."""

    CANCELLED = "CANCELLED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class DomainError(Exception):
    """An error with a canonical code and a stable UPPER_SNAKE reason.

    `message` is shown to clients: it must not contain message or memory
    content, SQL or stack traces. `field` names the request field at fault (it
    becomes a `google.rpc.BadRequest` field violation). `details` holds extra
    protobuf messages that the transport layer packs into the status.
    `retry_after_s`, when set, becomes a `google.rpc.RetryInfo` detail: a retry
    after that delay may succeed (overload, a full queue).
    """

    def __init__(
        self,
        code: Code,
        reason: str,
        message: str,
        *,
        metadata: Mapping[str, object] | None = None,
        field: str | None = None,
        details: tuple[Any, ...] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in (metadata or {}).items()}
        self.field = field
        self.details = details
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value}, {self.reason!r}, {self.message!r})"


def invalid_argument(
    reason: str, message: str, *, field: str | None = None, **metadata: object
) -> DomainError:
    """INVALID_ARGUMENT for a request that can never succeed as sent."""
    return DomainError(Code.INVALID_ARGUMENT, reason, message, field=field, metadata=metadata)


def not_found(reason: str, message: str, **metadata: object) -> DomainError:
    """NOT_FOUND; also what a resource of another namespace looks like."""
    return DomainError(Code.NOT_FOUND, reason, message, metadata=metadata)


def aborted(reason: str, message: str, **metadata: object) -> DomainError:
    """ABORTED: a compare-and-swap lost (AIP-154); re-read and retry."""
    return DomainError(Code.ABORTED, reason, message, metadata=metadata)


def failed_precondition(reason: str, message: str, **metadata: object) -> DomainError:
    """FAILED_PRECONDITION: the system is not in the state the call needs."""
    return DomainError(Code.FAILED_PRECONDITION, reason, message, metadata=metadata)


def already_exists(reason: str, message: str, **metadata: object) -> DomainError:
    """ALREADY_EXISTS."""
    return DomainError(Code.ALREADY_EXISTS, reason, message, metadata=metadata)


def resource_exhausted(
    reason: str, message: str, *, retry_after_s: float | None = None, **metadata: object
) -> DomainError:
    """RESOURCE_EXHAUSTED: a budget or quota ran out, or a queue is full (then with
    the delay after which a retry may succeed)."""
    return DomainError(
        Code.RESOURCE_EXHAUSTED, reason, message, metadata=metadata, retry_after_s=retry_after_s
    )


class StoreUnavailable(DomainError):
    """A backing store (PostgreSQL, the vector index, a peer service) is unreachable."""

    def __init__(self, store: str, message: str | None = None) -> None:
        super().__init__(
            Code.UNAVAILABLE,
            "STORE_UNAVAILABLE",
            message or f"the {store} store is unavailable; retry later",
            metadata={"store": store},
        )
        self.store = store


class VersionConflict(DomainError):
    """An append's expected version was not current."""

    def __init__(self, current_version: int, expected_version: int) -> None:
        super().__init__(
            Code.ABORTED,
            "VERSION_CONFLICT",
            f"conversation is at version {current_version}, not {expected_version}",
            metadata={"current_version": current_version, "expected_version": expected_version},
        )
        self.current_version = current_version
        self.expected_version = expected_version


class StreamStalled(DomainError):
    """`error`, ending a server stream whose reader stopped taking messages.

    The transport holds a message it cannot send, and would send the status only
    after it: the guard sets the status and lets the call end at once (grpc sends
    the status when the reader reads again, or drops it with the connection)
    rather than wait for a reader that may never come back.
    """

    def __init__(self, error: DomainError) -> None:
        super().__init__(
            error.code,
            error.reason,
            error.message,
            metadata=error.metadata,
            field=error.field,
            details=error.details,
            retry_after_s=error.retry_after_s,
        )
