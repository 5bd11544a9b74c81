"""A transcript server started as production starts it (`python -m services.transcript`,
its own process, on the embedded PostgreSQL): JSON documents jsonb would refuse, sent
over gRPC and over the HTTP port, leave none of their text in the process's log (its
stderr, at DEBUG) nor in the embedded PostgreSQL's (its data directory's `log`). A
data error caused in that PostgreSQL directly, where no client path reaches any more,
leaves neither the value nor the statement in its log: the server runs with
log_error_verbosity = terse and log_min_error_statement = panic
(services/common/postgres/embedded.py).

The embeddings are not loaded: the transcript service alone needs none.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil  # type: ignore[import-untyped]  # pgserver's dependency; no type stubs
import psycopg
import pytest
from google.protobuf import json_format

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.status import error_info
from tests.support.grpc_calls import user
from tests.support.http_calls import post_json
from tests.support.process import service_process

SECRET = "card-4111-1111-1111-1111"
REFUSED = ['"\\ud800"', '"\\udc00"', "1e1000000", "-1e1000000", "[" * 200 + "]" * 200]
ENV = {
    "DATABASE_URL": "",  # empty counts as unset: the embedded PostgreSQL
    "RUNIFOLD_HTTP_LISTEN": "127.0.0.1:0",
    "RUNIFOLD_LOG_LEVEL": "DEBUG",
    "RUNIFOLD_LOG_FORMAT": "json",
}
NAMESPACE = "logs-hold-no-data"

pytestmark = pytest.mark.slow


def document(value: str) -> str:
    return f'{{"card": "{SECRET}", "value": {value}}}'


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """RUNIFOLD_DATA_DIR, outside pytest's tmp_path: as root, pgserver runs PostgreSQL
    as another user and opens the folder's parents to it
    (tests/system/faults/test_embedded_postgres.py). A postmaster a failed test left
    running is killed."""
    folder = Path(tempfile.mkdtemp(prefix="runifold-logs-")).resolve()
    yield folder
    with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
        pid = int((folder / "postgres" / "postmaster.pid").read_text().splitlines()[0])
        psutil.Process(pid).kill()
    shutil.rmtree(folder, ignore_errors=True)


def _postgres_url(pgdata: Path) -> str:
    """The embedded server's URL, from its postmaster.pid (unix socket folder)."""
    socket_dir = (pgdata / "postmaster.pid").read_text().splitlines()[4].strip()
    return f"postgresql://postgres:@/postgres?host={socket_dir}"


async def test_refused_documents_and_data_errors_leave_no_text_in_either_log(
    data_dir: Path,
) -> None:
    pgdata = data_dir / "postgres"
    async with service_process("services.transcript", ENV, data_dir) as server:
        assert server.http_url is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            transcript = stubs.transcript(channel)
            created = await transcript.CreateConversation(
                pb.CreateConversationRequest(namespace=NAMESPACE), timeout=30
            )
            cid = created.conversation.conversation_id
            answers = []  # checked last: the logs first
            for value in REFUSED:
                request = pb.AppendEntriesRequest(
                    namespace=NAMESPACE,
                    conversation_id=cid,
                    messages=[user("hello")],
                    state_delta=pb.StateDelta(conversation_json=document(value)),
                )
                try:
                    await transcript.AppendEntries(request, timeout=30)
                    answers.append(("OK", ""))
                except grpc.aio.AioRpcError as error:
                    info = error_info(error)
                    answers.append((error.code().name, info.reason if info else ""))
                reply = await post_json(
                    server.http_url,
                    "runifold.transcript.v1.TranscriptService/AppendEntries",
                    json_format.MessageToDict(request),
                )
                answers.append((str(reply.status), ",".join(reply.field_violations)))

        # What no client reaches any more, caused directly: the value as a parameter,
        # then inside the statement's text.
        with psycopg.connect(_postgres_url(pgdata), autocommit=True) as conn:
            for value in REFUSED[:2]:
                with pytest.raises(psycopg.DataError):
                    conn.execute("SELECT %s::jsonb", (document(value),))
                with pytest.raises(psycopg.DataError):
                    conn.execute(f"SELECT '{document(value)}'::jsonb".encode())

    output = "".join(server.output)
    assert '"message": "rpc"' in output  # the process logged at DEBUG
    assert SECRET not in output
    server_log = (pgdata / "log").read_text(errors="replace")
    assert "ERROR:  invalid input syntax for type json" in server_log  # logged, tersely
    assert SECRET not in server_log
    assert "STATEMENT:" not in server_log and "CONTEXT:" not in server_log
    refused = [("INVALID_ARGUMENT", "INVALID_STATE"), ("400", "state_delta.conversation_json")]
    assert answers == refused * len(REFUSED)
