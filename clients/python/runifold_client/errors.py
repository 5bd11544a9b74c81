"""Typed exceptions that carry what the server said (status, ErrorInfo reason, details)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from runifold.agent.v1 import agent_service_pb2


@dataclass(frozen=True)
class Usage:
    """Model usage of a turn."""

    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0


@dataclass(frozen=True)
class Outcome:
    """What a turn produced: the model's messages and what they cost."""

    messages: list[Any] = field(default_factory=list)  # runifold.common.v1.Message
    usage: Usage = field(default_factory=Usage)

    @property
    def text(self) -> str:
        """The text of the model's messages, joined."""
        return "\n".join(m.text for m in self.messages if m.text)

    @classmethod
    def from_proto(cls, pb: agent_service_pb2.TurnOutcome) -> Outcome:
        """The outcome of a runifold.agent.v1.TurnOutcome."""
        usage = pb.usage
        return cls(
            list(pb.output), Usage(usage.input_tokens, usage.output_tokens, usage.model_calls)
        )


class RunifoldError(Exception):
    """A failed call. `code` is the gRPC status, `reason` the stable ErrorInfo reason,
    `metadata` its metadata, `details` the other status details (BadRequest, RetryInfo,
    TurnConflict, ...). Works for calls of your own stubs too: see `from_rpc_error`."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
        details: tuple[Any, ...] = (),
    ) -> None:
        # A reason that only repeats the code (no ErrorInfo) is said once.
        status = code.name if reason == code.name else f"{code.name} {reason}"
        super().__init__(f"{status}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.details = details


class InvalidArgument(RunifoldError):
    """The request can never succeed as sent (see `reason` and `field`)."""

    @property
    def field(self) -> str:
        """The request field at fault ("namespace", "messages[2].role"), or ""."""
        for detail in self.details:
            if isinstance(detail, error_details_pb2.BadRequest):
                for violation in detail.field_violations:
                    return str(violation.field)
        return ""


class NotFound(RunifoldError):
    """No such resource in this namespace."""


class AlreadyExists(RunifoldError):
    """The resource exists."""


class PermissionDenied(RunifoldError):
    """The caller's identity does not grant the namespace."""


class Unauthenticated(RunifoldError):
    """Missing or invalid credentials."""


class Unavailable(RunifoldError):
    """A store or service is unavailable; retry later (the client already retried).

    One that never reached a Runifold server (reason UNAVAILABLE: no ErrorInfo) names
    the address the client called: in its message, once, and as `target`."""

    target: str = ""

    @classmethod
    def unreachable(cls, error: Unavailable, target: str) -> Unavailable:
        """`error` (a call that reached no server) saying where the client called."""
        prefix = f"cannot reach {target}: "
        message = error.message if error.message.startswith(prefix) else prefix + error.message
        found = cls(error.code, error.reason, message, error.metadata, error.details)
        found.target = target
        return found


class DeadlineExceeded(RunifoldError):
    """The call's deadline passed."""


class BudgetExhausted(RunifoldError):  # RESOURCE_EXHAUSTED / BUDGET_EXHAUSTED
    """The request's budget ran out (RESOURCE_EXHAUSTED)."""


class FailedPrecondition(RunifoldError):
    """The system is not in the state the call needs."""


class Aborted(RunifoldError):
    """A compare-and-swap lost."""


class VersionConflict(Aborted):
    """An append's expected version was not current. `current_version` says what is."""

    @property
    def current_version(self) -> int:
        return int(self.metadata.get("current_version", "0"))


class RevisionConflict(Aborted):
    """A memory write or delete at a stale `expected_revision` (REVISION_CONFLICT)."""

    @property
    def current_revision(self) -> int:
        return int(self.metadata.get("current_revision", "0"))


class SummaryConflict(Aborted):
    """A summary commit at a stale `expected_through_sequence` (SUMMARY_CONFLICT)."""

    @property
    def current_through_sequence(self) -> int:
        return int(self.metadata.get("current_through_sequence", "0"))


class TurnConflict(Aborted):
    """Another writer committed first. `outcome` holds the completed, uncommitted outcome.

    The model is never re-run automatically: decide whether to show, retry or drop it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        detail = next(
            (d for d in self.details if isinstance(d, agent_service_pb2.TurnConflict)), None
        )
        self.current_version = (
            detail.current_version if detail else int(self.metadata.get("current_version", "0"))
        )
        self.expected_version = detail.expected_version if detail else 0
        self.outcome = Outcome.from_proto(detail.outcome) if detail else Outcome()


class TurnLeaseLost(TurnConflict):
    """The turn stalled past its lease and another attempt took over (TURN_LEASE_LOST);
    `outcome` holds what this attempt produced. Retrying the same turn_id returns what
    the other attempt produced."""


class ConversationBusy(Aborted):
    """Another turn runs (or waits) on the conversation (CONVERSATION_BUSY).

    With CONCURRENCY_MODE_REJECT nothing ran (`outcome` is empty); a RACE turn that met
    an exclusive turn at its commit carries its completed `outcome`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        detail = next(
            (d for d in self.details if isinstance(d, agent_service_pb2.TurnConflict)), None
        )
        self.outcome = Outcome.from_proto(detail.outcome) if detail else Outcome()

    @property
    def running_turn_id(self) -> str:
        return self.metadata.get("running_turn_id", "")


class ModelOutputInvalid(FailedPrecondition):
    """The model's reply broke the transcript's limits and was not appended
    (MODEL_OUTPUT_INVALID); `outcome` holds it and `violations` says what is wrong."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        detail = next(
            (d for d in self.details if isinstance(d, agent_service_pb2.ModelOutputInvalid)),
            None,
        )
        self.outcome = Outcome.from_proto(detail.outcome) if detail else Outcome()
        self.violations = list(detail.violations) if detail else []


class ResourceExhausted(RunifoldError):
    """A limit was reached; `retry_delay` (seconds, from google.rpc.RetryInfo) says when
    a retry may succeed, or None."""

    @property
    def retry_delay(self) -> float | None:
        info = next((d for d in self.details if isinstance(d, error_details_pb2.RetryInfo)), None)
        if info is None:
            return None
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)


class TurnQueueFull(ResourceExhausted):
    """Too many turns wait on the conversation (CONCURRENCY_MODE_ENQUEUE); retry after
    `retry_delay`."""


class SummaryRequired(FailedPrecondition):
    """The conversation needs a summary first; a background job was enqueued.

    `backlog` is the number of unsummarized entries outside the window.
    """

    @property
    def backlog(self) -> int:
        return int(self.metadata.get("backlog", "0"))

    @property
    def job_id(self) -> str:
        return self.metadata.get("job_id", "")


class SummaryBacklog(SummaryRequired):
    """Backlog remained after the turn's own summarizer passes (SUMMARY_MODE_AUTO)."""


_BY_REASON: dict[str, type[RunifoldError]] = {
    "VERSION_CONFLICT": VersionConflict,
    "REVISION_CONFLICT": RevisionConflict,
    "SUMMARY_CONFLICT": SummaryConflict,
    "TURN_CONFLICT": TurnConflict,
    "SUMMARY_REQUIRED": SummaryRequired,
    "SUMMARY_BACKLOG": SummaryBacklog,
    "BUDGET_EXHAUSTED": BudgetExhausted,
    "TURN_LEASE_LOST": TurnLeaseLost,
    "CONVERSATION_BUSY": ConversationBusy,
    "MODEL_OUTPUT_INVALID": ModelOutputInvalid,
    "TURN_QUEUE_FULL": TurnQueueFull,
}
_BY_CODE: dict[grpc.StatusCode, type[RunifoldError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
}
_DETAIL_TYPES = (
    agent_service_pb2.TurnConflict,
    agent_service_pb2.ModelOutputInvalid,
    error_details_pb2.BadRequest,
    error_details_pb2.RetryInfo,
)


def from_rpc_error(error: grpc.RpcError) -> RunifoldError:
    """The typed exception of a failed call (of grpc's blocking or asyncio stack)."""
    call: Any = error
    code: grpc.StatusCode = call.code()
    message: str = call.details() or ""
    reason, metadata, details = code.name, {}, []
    try:
        status = rpc_status.from_call(call)
    except ValueError:  # details that do not match the status: keep the bare status
        status = None
    if status is not None:
        for packed in status.details:
            if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                packed.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
                continue
            for kind in _DETAIL_TYPES:
                if packed.Is(kind.DESCRIPTOR):
                    value = kind()
                    packed.Unpack(value)
                    details.append(value)
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, RunifoldError)
    return cls(code, reason, message, metadata, tuple(details))
