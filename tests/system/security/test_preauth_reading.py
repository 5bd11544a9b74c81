"""A caller without credentials costs the server no memory for what it sends.

grpc reads a unary request in full (and Python copies it) before any handler
code runs, so 40 concurrent 16 MB requests with no credentials raised a JWT
server's resident memory by about a gigabyte, much of it kept afterwards. The
guard now authenticates from the metadata before it reads the request off the
stream: an unauthenticated request is refused while its bytes still wait in the
transport, unread.

The server runs in its own process, as production starts it, and its memory is
read from /proc; the bound is a fraction of the bytes sent, far below what
holding (let alone parsing) them would cost.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from runifold.transcript.v1 import transcript_service_pb2 as pb
from tests.support.grpc_calls import user
from tests.support.process import service_process

pytestmark = pytest.mark.slow

CONCURRENT = 40
ROUNDS = 2
TRANSPORT_CAP = 16 * 1024 * 1024  # the cap the finding was measured at
APPEND = "/runifold.transcript.v1.TranscriptService/AppendEntries"


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak so far) of a process, in KiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in {"VmRSS", "VmHWM"}:
            found[name] = int(rest.split()[0])
    return found


def big_append() -> bytes:
    """An AppendEntries request just under the transport cap (16,000 messages)."""
    request = pb.AppendEntriesRequest(
        conversation_id=str(uuid.uuid4()),
        namespace="tenant-a",
        expected_version=0,
        messages=[user("x" * 1000) for _ in range(16_000)],
    ).SerializeToString()
    assert TRANSPORT_CAP // 2 < len(request) < TRANSPORT_CAP
    return request


async def test_big_unauthenticated_requests_are_refused_unread(
    shared_database_url: str, tmp_path: Path
) -> None:
    env = {
        "DATABASE_URL": shared_database_url,
        "RUNIFOLD_MIGRATE": "check",
        "RUNIFOLD_AUTH": "jwt",
        "RUNIFOLD_JWT_SECRET": "preauth-" + "s" * 32,
        "RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES": str(TRANSPORT_CAP),
    }
    request = big_append()
    async with (
        service_process("services.transcript", env, tmp_path) as server,
        grpc.aio.insecure_channel(
            server.address, options=[("grpc.max_send_message_length", TRANSPORT_CAP)]
        ) as channel,
    ):
        append: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(APPEND)

        async def unauthenticated() -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await append(request, timeout=60)
            return caught.value.code()

        before = memory_kib(server.process.pid)
        sent = 0
        for _ in range(ROUNDS):
            codes = await asyncio.gather(*(unauthenticated() for _ in range(CONCURRENT)))
            assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
            sent += CONCURRENT * len(request)
        after = memory_kib(server.process.pid)

    bound_kib = sent // 10 // 1024
    peak_growth = after["VmHWM"] - before["VmHWM"]
    kept = after["VmRSS"] - before["VmRSS"]
    # Reading the requests cost more than they weighed (about 1.5x at the peak).
    assert peak_growth < bound_kib, f"peak grew {peak_growth} KiB for {sent} bytes sent"
    assert kept < bound_kib, f"resident memory grew {kept} KiB for {sent} bytes sent"
