"""Helpers of the security suites: every RPC from the descriptors, a generic caller,
JWT credentials, and a snapshot of everything a namespace holds in PostgreSQL.

The RPC list is read from the generated descriptors (every `*_pb2` module under
gen/python/runifold), so an RPC or a service added to the contract is enumerated
without touching these tests; a suite that keeps a case per RPC fails until
the new RPC has one.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from connectrpc.errors import ConnectError
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from psycopg import sql

import runifold
from services.common.auth import AuthSettings
from services.common.status import error_info
from tests.support.grpc_calls import (
    Metadata as Metadata,  # re-exported: the suites import it from here
)
from tests.support.grpc_calls import authorization, jwt_token
from tests.support.http_calls import connect_call, grpc_code_name
from tests.support.http_calls import error_info as connect_error_info

SECRET = "security-suite-secret-" + "s" * 32
AUDIENCE = "runifold"
CALL_TIMEOUT_S = 60.0
# Streams that follow a resource until the client leaves: answered once caught up.
FOLLOWING = frozenset(
    {
        "/runifold.transcript.v1.TranscriptService/WatchConversation",
        "/runifold.memory.v1.MemoryService/WatchMemories",
    }
)


def token(*namespaces: str) -> str:
    """A valid bearer token granting exactly these namespaces ("*": all)."""
    return jwt_token(
        SECRET,
        *namespaces,
        sub="tenant:" + ",".join(namespaces),
        aud=AUDIENCE,
        exp=time.time() + 3600,
    )


# The servers' authentication; the service token lets background summary jobs act
# for their namespace (it grants "*", as an operator would mint it).
AUTH = AuthSettings(mode="jwt", jwt_secret=SECRET, jwt_audience=AUDIENCE, service_token=token("*"))


def bearer(*namespaces: str) -> Metadata:
    """Call metadata of a caller granted exactly these namespaces."""
    return authorization(token(*namespaces))


# -- the contract's RPCs ---------------------------------------------------------


@dataclass(frozen=True)
class Rpc:
    """One RPC of one service, with its request and response classes."""

    service: str
    name: str
    method: MethodDescriptor
    request: type[Message]
    response: type[Message]
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def id(self) -> str:
        """Short name for test ids: "TranscriptService.CreateConversation"."""
        return f"{self.service.rsplit('.', 1)[-1]}.{self.name}"

    @property
    def input(self) -> Descriptor:
        return self.method.input_type


def _service_modules() -> list[Any]:
    root = Path(next(iter(runifold.__path__)))
    names = sorted(
        "runifold." + ".".join(path.relative_to(root).with_suffix("").parts)
        for path in root.glob("*/v*/*_pb2.py")
    )
    return [importlib.import_module(name) for name in names]


def all_rpcs() -> list[Rpc]:
    """Every RPC of every runifold service, in a stable order."""
    rpcs = []
    for module in _service_modules():
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                rpcs.append(
                    Rpc(
                        service=service.full_name,
                        name=method.name,
                        method=method,
                        request=message_factory.GetMessageClass(method.input_type),
                        response=message_factory.GetMessageClass(method.output_type),
                        server_streaming=method.server_streaming,
                    )
                )
    return rpcs


RPCS = all_rpcs()
RPC_BY_ID = {rpc.id: rpc for rpc in RPCS}


# -- calling any RPC ---------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a call gave: a status, its ErrorInfo and the reply (or stream events)."""

    code: grpc.StatusCode
    details: str = ""
    reason: str | None = None
    error_metadata: Mapping[str, str] = field(default_factory=dict)
    replies: tuple[Message, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    def describe(self) -> str:
        if self.ok:
            return f"OK {[MessageToDict(r) for r in self.replies]}"[:2000]
        return f"{self.code.name} {self.reason} {self.details!r} {dict(self.error_metadata)}"


def _failed(error: grpc.aio.AioRpcError) -> Outcome:
    info = error_info(error)
    return Outcome(
        code=error.code(),
        details=error.details() or "",
        reason=info.reason if info is not None else None,
        error_metadata=dict(info.metadata) if info is not None else {},
    )


async def invoke(
    channel: grpc.aio.Channel,
    rpc: Rpc,
    request: Message | bytes,
    metadata: Metadata = (),
    timeout: float = CALL_TIMEOUT_S,
) -> Outcome:
    """Call `rpc` with a request message (or raw bytes sent as they are)."""
    serializer = None if isinstance(request, bytes) else rpc.request.SerializeToString
    sent: Any = request  # bytes go out as they are (no serializer)
    try:
        if rpc.server_streaming:
            stream = channel.unary_stream(
                rpc.path,
                request_serializer=serializer,
                response_deserializer=rpc.response.FromString,
            )
            call = stream(sent, metadata=metadata, timeout=timeout)
            replies = []
            async for reply in call:
                replies.append(reply)
                if rpc.path in FOLLOWING and reply.WhichOneof("event") == "heartbeat":
                    call.cancel()  # caught up: it would follow until the client leaves
                    break
            return Outcome(grpc.StatusCode.OK, replies=tuple(replies))
        unary = channel.unary_unary(
            rpc.path, request_serializer=serializer, response_deserializer=rpc.response.FromString
        )
        reply = await unary(sent, metadata=metadata, timeout=timeout)
        return Outcome(grpc.StatusCode.OK, replies=(reply,))
    except grpc.aio.AioRpcError as error:
        return _failed(error)


async def invoke_http(
    base_url: str,
    rpc: Rpc,
    request: Message,
    metadata: Metadata = (),
    timeout: float = CALL_TIMEOUT_S,
) -> Outcome:
    """Call `rpc` over the HTTP port (Connect with JSON, as curl and the console do), with
    the same metadata as headers; the outcome in gRPC's terms, to compare with `invoke`'s."""
    try:
        replies = await connect_call(base_url, rpc.method, request, metadata, timeout_s=timeout)
    except ConnectError as error:
        info = connect_error_info(error)
        return Outcome(
            code=grpc.StatusCode[grpc_code_name(error.code)],
            details=error.message,
            reason=info.reason if info is not None else None,
            error_metadata=dict(info.metadata) if info is not None else {},
        )
    return Outcome(grpc.StatusCode.OK, replies=tuple(replies))


async def must(channel: grpc.aio.Channel, rpc_id: str, request: Message, metadata: Metadata) -> Any:
    """The reply of a call that has to succeed (setup steps)."""
    outcome = await invoke(channel, RPC_BY_ID[rpc_id], request, metadata)
    assert outcome.ok, f"{rpc_id}: {outcome.describe()}"
    return outcome.replies[-1]


# -- what a namespace holds ----------------------------------------------------------

# Schemas of the services' own tables. memory.outbox is left out: it is a queue
# the indexer drains by design (what it feeds is checked through search).
_SCHEMAS = ("transcript", "summary", "memory")
_VOLATILE = {("memory", "outbox")}
# Columns the summary workers own: they change as a worker claims, runs, retries
# or finishes a job, whoever asked for it. What a request writes (the job, its
# parameters, a repeated request) stays compared.
_WORKER_OWNED = {
    ("summary", "jobs"): {
        "state",
        "attempts",
        "failures",
        "run_after",
        "lease_token",
        "lease_until",
        "claimed_by",
        "last_error",
        "finish_time",
    }
}


async def _tables(conn: psycopg.AsyncConnection[Any]) -> dict[tuple[str, str], list[str]]:
    cursor = await conn.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = ANY(%s) ORDER BY table_schema, table_name, ordinal_position",
        (list(_SCHEMAS),),
    )
    tables: dict[tuple[str, str], list[str]] = {}
    for schema, table, column in await cursor.fetchall():
        tables.setdefault((schema, table), []).append(column)
    return tables


async def namespace_rows(database_url: str, namespace: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every service table that belongs to `namespace`, each row a
    tuple of (column, value) pairs.

    Tables with a `namespace` column are filtered on it; transcript child
    tables (keyed by `conversation_key`) are joined to their conversation.
    """
    snapshot: dict[str, list[tuple[Any, ...]]] = {}
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for (schema, table), columns in (await _tables(conn)).items():
            if (schema, table) in _VOLATILE:
                continue
            name = sql.Identifier(schema, table)
            owned = _WORKER_OWNED.get((schema, table), set())
            selected = sql.SQL(", ").join(
                sql.Identifier("t", column) for column in columns if column not in owned
            )
            if "namespace" in columns:
                query = sql.SQL("SELECT {} FROM {} t WHERE t.namespace = %s").format(selected, name)
            elif "conversation_key" in columns:
                query = sql.SQL(
                    "SELECT {} FROM {} t JOIN transcript.conversations c "
                    "ON c.conversation_key = t.conversation_key WHERE c.namespace = %s"
                ).format(selected, name)
            else:
                continue
            cursor = await conn.execute(query, (namespace,))
            names = [column.name for column in cursor.description or ()]
            rows = [tuple(zip(names, row, strict=True)) for row in await cursor.fetchall()]
            snapshot[f"{schema}.{table}"] = sorted(rows, key=repr)
    return snapshot


def changed_tables(
    before: Mapping[str, Sequence[tuple[Any, ...]]], after: Mapping[str, Sequence[tuple[Any, ...]]]
) -> list[str]:
    """Names of the tables whose rows differ."""
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )
