"""Helpers shared by the suites that talk to real gRPC servers.

Messages and error details, health, JWT bearer credentials and certificate
files: one definition each, used by the tests of every service, tests/system and
tests/ops alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypeVar

import grpc
import jwt
import trustme
from google.protobuf.message import Message as ProtoMessage
from grpc_health.v1 import health_pb2

from runifold.common.v1 import common_pb2
from services.common import stubs
from services.common.postgres.pool import Database
from services.common.status import error_info
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

Metadata = tuple[tuple[str, str], ...]
M = TypeVar("M", bound=ProtoMessage)

LIVENESS = "runifold.liveness"


# -- messages and errors ---------------------------------------------------------------


def user(text: str) -> common_pb2.Message:
    """A user message of the contract."""
    return common_pb2.Message(role=common_pb2.ROLE_USER, text=text)


def status_detail(error: grpc.aio.AioRpcError, kind: type[M]) -> M:
    """The detail of type `kind` packed in a failed call's status (which must carry one)."""
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, f"{error.code().name} without status details"
    for packed in status.details:
        if packed.Is(kind.DESCRIPTOR):
            value = kind()
            packed.Unpack(value)
            return value
    raise AssertionError(f"no {kind.DESCRIPTOR.full_name} detail in {error.code().name}")


def reason(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a failed call (which must carry one)."""
    info = error_info(error)
    assert info is not None, f"{error.code().name} without ErrorInfo: {error.details()}"
    return str(info.reason)


# -- health --------------------------------------------------------------------------------


async def health_status(address: str, service: str = "", timeout: float = 2) -> int | None:
    """The health status the server reports, or None when it does not answer."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await stubs.health(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return None
        status: int = reply.status
        return status


async def check_health_follows_schema(
    database_url: str, address: str, service_name: str, schema_service: str
) -> None:
    """Break the recorded checksum of `schema_service`'s migrations, then mend it:
    the health of `service_name` turns NOT_SERVING and back to SERVING, while
    liveness stays SERVING throughout (a restart would not fix a schema)."""
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING

    async def status_is(expected: int) -> bool:
        return await health_status(address, service_name) == expected

    assert await status_is(serving)
    admin = Database(database_url, server_settings())
    await admin.open()
    try:
        async with admin.connection() as conn:
            await conn.execute(
                "UPDATE public.runifold_schema_migrations "
                "SET checksum = 'edited' || checksum WHERE service = %s",
                (schema_service,),
            )
        await wait_for(lambda: status_is(not_serving))
        assert await health_status(address, LIVENESS) == serving
        async with admin.connection() as conn:
            await conn.execute(
                "UPDATE public.runifold_schema_migrations "
                "SET checksum = substr(checksum, 7) WHERE service = %s",
                (schema_service,),
            )
        await wait_for(lambda: status_is(serving))
    finally:
        await admin.close()


# -- credentials ---------------------------------------------------------------------------


def jwt_token(secret: str, *namespaces: str, **claims: object) -> str:
    """An HS256 bearer token for audience "runifold" granting these namespaces, valid
    for five minutes; `claims` add to or override the defaults (sub, aud, exp)."""
    body: dict[str, object] = {
        "sub": "app",
        "aud": "runifold",
        "exp": time.time() + 300,
        "namespaces": list(namespaces),
    }
    body.update(claims)
    return jwt.encode(body, secret, algorithm="HS256")


def authorization(token: str) -> Metadata:
    """Call metadata carrying a bearer token."""
    return (("authorization", f"Bearer {token}"),)


def write_pem(path: Path, blob: trustme.Blob) -> str:
    """Write a certificate or key to `path`; its path as a string (for AuthSettings)."""
    blob.write_to_path(str(path))
    return str(path)
