"""DomainError <-> gRPC status with google.rpc details, via grpcio-status."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message as ProtoMessage
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.errors import ERROR_DOMAIN, Code, DomainError

GRPC_CODES: dict[Code, grpc.StatusCode] = {code: grpc.StatusCode[code.value] for code in Code}
_RPC_CODES: dict[Code, int] = {code: code_pb2.Code.Value(code.value) for code in Code}
_FROM_GRPC: dict[grpc.StatusCode, Code] = {v: k for k, v in GRPC_CODES.items()}


def _pack(message: ProtoMessage) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def status_details(error: DomainError) -> list[any_pb2.Any]:
    """The packed details of a domain error, the same on every transport: ErrorInfo
    first, then BadRequest (a field at fault), RetryInfo (a delay), and its own."""
    details = [
        _pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata
            )
        )
    ]
    if error.field:
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=error.field, description=error.message, reason=error.reason
                        )
                    ]
                )
            )
        )
    if error.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromTimedelta(timedelta(seconds=error.retry_after_s))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    for detail in error.details:
        if isinstance(detail, any_pb2.Any):
            details.append(detail)
        elif isinstance(detail, ProtoMessage):
            details.append(_pack(detail))
    return details


def to_status(error: DomainError) -> grpc.Status:
    """The gRPC status of a domain error: code, message and packed details."""
    status: grpc.Status = rpc_status.to_status(
        status_pb2.Status(
            code=_RPC_CODES[error.code], message=error.message, details=status_details(error)
        )
    )
    return status


def from_rpc_error(error: grpc.aio.AioRpcError) -> DomainError:
    """A domain error from a failed outbound call, keeping the peer's reason and details."""
    code = _FROM_GRPC.get(error.code(), Code.INTERNAL)
    reason = "UPSTREAM_" + error.code().name
    metadata: dict[str, str] = {}
    details: list[any_pb2.Any] = []
    status = rpc_status.from_call(cast(grpc.Call, error)) if error.trailing_metadata() else None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
                metadata = dict(info.metadata)
            else:
                details.append(detail)
    message = error.details() or code.value.lower()
    return DomainError(code, reason, message, metadata=metadata, details=tuple(details))


def error_info(error: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, if any (for tests and clients)."""
    status = rpc_status.from_call(cast(grpc.Call, error))
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
