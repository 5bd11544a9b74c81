"""Domain errors as Connect errors, and the codecs that read requests.

A `DomainError` becomes a `ConnectError` with the same code and message and the same
packed details as on gRPC (`services.common.status.status_details`: ErrorInfo first,
then BadRequest, RetryInfo and the error's own, such as TurnConflict). Connect sends
each detail as `{"type", "value"}` (the message's bytes, base64); each also carries
`debug`, the detail as JSON, for people reading responses with curl: that needs the
detail's descriptor in protobuf-py (connectrpc's protobuf runtime), made here once per
proto file from google.protobuf's descriptor of it.

A request body that is not a valid message of the method's type is INVALID_ARGUMENT /
INVALID_REQUEST with ErrorInfo, as on gRPC (for JSON, naming the field at fault, never
quoting its value).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from connectrpc.code import Code as ConnectCode
from connectrpc.codec import Codec
from connectrpc.compat import google_protobuf_binary_codec, google_protobuf_json_codec
from connectrpc.errors import ConnectError, ErrorDetail
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FileDescriptor
from protobuf import DescMessage, Registry
from protobuf.wkt import Any as WireAny
from protobuf.wkt import FileDescriptorProto, FileDescriptorSet

from services.common.errors import Code, DomainError, invalid_argument
from services.common.status import status_details

log = logging.getLogger(__name__)

CONNECT_CODES: dict[Code, ConnectCode] = {
    code: ConnectCode.CANCELED if code is Code.CANCELLED else ConnectCode[code.value]
    for code in Code
}
# The gRPC name of each Connect code (metrics and logs count both transports alike).
GRPC_NAMES: dict[ConnectCode, str] = {
    code: "CANCELLED" if code is ConnectCode.CANCELED else code.name for code in ConnectCode
}
_TYPE_PREFIX = "type.googleapis.com/"


def connect_error(error: DomainError) -> ConnectError:
    """The Connect form of a domain error (same code, message, reason and details)."""
    return ConnectError(
        CONNECT_CODES[error.code],
        error.message,
        details=[_detail(packed) for packed in status_details(error)],
    )


def _detail(packed: any_pb2.Any) -> ErrorDetail:
    wire = WireAny(type_url=packed.type_url, value=packed.value)
    desc = _descriptor(packed.type_url.removeprefix(_TYPE_PREFIX))
    if desc is not None:
        try:
            # Built from the message (not the Any), the detail is sent with `debug` too.
            message = wire.unpack(desc)
            if message is not None:
                return ErrorDetail(message)
        except Exception as exc:  # a detail that cannot be shown is still sent
            log.debug("error detail without debug form", exc_info=exc)
    return ErrorDetail(wire)


@functools.cache
def _descriptor(type_name: str) -> DescMessage | None:
    """The protobuf-py descriptor of a message type google.protobuf knows, or None."""
    try:
        message = descriptor_pool.Default().FindMessageTypeByName(type_name)
    except KeyError:
        return None
    return _registry(message.file.name).message(type_name)


@functools.cache
def _registry(file_name: str) -> Registry:
    """A protobuf-py registry of one proto file and its imports, dependencies first."""
    ordered: list[FileDescriptor] = []

    def visit(file: FileDescriptor) -> None:
        if file in ordered:
            return
        for dependency in file.dependencies:
            visit(dependency)
        ordered.append(file)

    visit(descriptor_pool.Default().FindFileByName(file_name))
    return FileDescriptorSet(file=[_file_proto(f) for f in ordered]).to_registry()


def _file_proto(file: FileDescriptor) -> FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    # CopyToProto leaves json_name out (protoc fills it in for its plugins); protobuf-py
    # names JSON fields by it.
    for message in proto.message_type:
        _json_names(message, file.message_types_by_name[message.name])
    return FileDescriptorProto.from_binary(proto.SerializeToString())


def _json_names(proto: descriptor_pb2.DescriptorProto, message: Descriptor) -> None:
    for field in proto.field:
        field.json_name = message.fields_by_name[field.name].json_name
    for nested in proto.nested_type:
        _json_names(nested, message.nested_types_by_name[nested.name])


# -- request codecs ----------------------------------------------------------------------


class _Checked:
    """A codec whose decode failure is INVALID_REQUEST with ErrorInfo (as on gRPC)."""

    def __init__(self, inner: Codec[Any, Any], what: str) -> None:
        self._inner = inner
        self._what = what

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Any) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._inner.decode(data, message_class)
        except Exception as exc:
            # The JSON parser's words quote the offending value (the caller's content):
            # only the path of field names it gives is passed on.
            path = ".".join(_FIELD.findall(str(exc))) if self._what == "JSON" else ""
            raise connect_error(
                invalid_argument(
                    "INVALID_REQUEST",
                    f"the request is not a valid {self._what} message of this method's type"
                    + (f" (field {path})" if path else ""),
                )
            ) from None


# How google.protobuf's JSON parser names each field on the way to a bad value.
_FIELD = re.compile(r"Failed to parse ([A-Za-z_][A-Za-z0-9_]{0,63}) field")


def request_codecs() -> list[Codec[Any, Any]]:
    """Binary protobuf and JSON (proto3's JSON mapping; unknown fields are ignored, as
    the binary format keeps them), both over google.protobuf's messages."""
    return [
        _Checked(google_protobuf_binary_codec(), "protobuf"),
        _Checked(google_protobuf_json_codec(), "JSON"),
    ]
