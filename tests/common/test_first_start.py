"""What a person meets when starting a server the first time (issue 15): a taken port
is one line naming the address and its variable; a start and a stop make no noise of the
project's own (no Python warnings, no progress bars, no gRPC fork warning, no per-RPC
lines at the default level); logs are text at a terminal and JSON elsewhere."""

from __future__ import annotations

import json
import logging
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runifold_client import AsyncClient, NotFound
from services.common.server import serving
from services.transcript.component import TranscriptComponent
from tests.support.process import service_process
from tests.support.settings import server_settings
from tests.support.tools import ROOT


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {
        **os.environ,
        # Never reached: the bind is checked before the database is opened.
        "DATABASE_URL": "postgresql://runifold@127.0.0.1:1/nowhere",
        "RUNIFOLD_PAGE_TOKEN_SECRET": "test-secret-0123456789",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "services.transcript"],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_taken_grpc_port_is_one_line_naming_it_and_runifold_listen(taken_port: int) -> None:
    address = f"127.0.0.1:{taken_port}"
    done = _start({"RUNIFOLD_LISTEN": address, "RUNIFOLD_METRICS_LISTEN": "off"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert address in lines[0] and "RUNIFOLD_LISTEN" in lines[0]
    assert "already in use" in lines[0]


def test_a_taken_metrics_port_is_one_line_naming_runifold_metrics_listen(
    taken_port: int,
) -> None:
    address = f"127.0.0.1:{taken_port}"
    done = _start({"RUNIFOLD_LISTEN": "127.0.0.1:0", "RUNIFOLD_METRICS_LISTEN": address})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert address in lines[0] and "RUNIFOLD_METRICS_LISTEN" in lines[0]


def test_a_taken_http_port_is_one_line_naming_runifold_http_listen(taken_port: int) -> None:
    address = f"127.0.0.1:{taken_port}"
    done = _start(
        {
            "RUNIFOLD_LISTEN": "127.0.0.1:0",
            "RUNIFOLD_METRICS_LISTEN": "off",
            "RUNIFOLD_HTTP_LISTEN": address,
        }
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert address in lines[0] and "RUNIFOLD_HTTP_LISTEN" in lines[0]


def test_an_http_port_off_loopback_needs_authentication_as_the_grpc_one() -> None:
    done = _start(
        {
            "RUNIFOLD_LISTEN": "127.0.0.1:0",
            "RUNIFOLD_METRICS_LISTEN": "off",
            "RUNIFOLD_HTTP_LISTEN": "0.0.0.0:0",
            "RUNIFOLD_AUTH": "none",
        }
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to listen on 0.0.0.0:0 with RUNIFOLD_AUTH=none" in done.stderr


@pytest.mark.slow
async def test_the_all_in_one_server_starts_and_stops_quietly(
    tmp_path: Path, namespace: str
) -> None:
    """What `make run` starts (embedded PostgreSQL, the embedding model, the offline
    model), at the default log level, with XDG_RUNTIME_DIR unset as on a server."""
    env = {"RUNIFOLD_LOG_LEVEL": "INFO", "RUNIFOLD_LOG_FORMAT": "auto"}
    saved = {k: os.environ.pop(k) for k in ("DATABASE_URL", "XDG_RUNTIME_DIR") if k in os.environ}
    try:
        async with service_process("services", env, tmp_path, timeout=180) as server:
            async with AsyncClient(server.address, namespace=namespace) as client:
                for _ in range(3):
                    await client.run_conversation("Hello there")
                await client.search_memories("hello")
            output = server.output
    finally:
        os.environ.update(saved)
    text = "".join(output)
    assert server.process.returncode == 0, text
    for noise in ("Warning", "warn(", "Loading weights", "it/s]", "fork_posix", "Traceback"):
        assert noise not in text, f"{noise!r} in the server's output:\n{text}"
    documents = []
    for line in output:
        if line.startswith("runifold"):  # the two banner lines
            continue
        documents.append(json.loads(line))  # not a terminal: JSON lines
    assert documents, text
    assert not [d for d in documents if d["message"] == "rpc"], "per-RPC lines at INFO"
    assert not [d for d in documents if d["level"] not in {"INFO", "DEBUG"}], text
    assert not [d for d in documents if d["logger"].startswith("sentence_transformers")]


def test_logs_are_text_at_a_terminal_and_json_elsewhere() -> None:
    program = (
        "import logging\n"
        "from services.common import logs\n"
        "from services.common.settings import Settings\n"
        "settings = Settings.from_env()\n"
        "logs.configure('test', settings.log_level, settings.log_format)\n"
        "logging.getLogger('services.test').info('server started', extra={'address': 'a:1'})\n"
    )
    piped = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
    )
    document = json.loads(piped.stderr)
    assert document["message"] == "server started" and document["address"] == "a:1"

    leader, follower = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            stderr=follower,
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=60,
        )
        written = os.read(leader, 65536).decode()
    finally:
        os.close(leader)
        os.close(follower)
    assert "INFO" in written and "services.test: server started" in written
    assert "address=a:1" in written and not written.lstrip().startswith("{")

    asked = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={**os.environ, "RUNIFOLD_LOG_FORMAT": "text"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "services.test: server started" in asked.stderr


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize(("slow_s", "level"), [("60", logging.DEBUG), ("0", logging.WARNING)])
async def test_access_lines_are_debug_unless_the_call_is_slow(
    shared_database_url: str, namespace: str, slow_s: str, level: int
) -> None:
    """An answered call (OK, or a NOT_FOUND the contract names) logs its line at DEBUG;
    a call slower than RUNIFOLD_SLOW_RPC_S at WARNING."""
    logger = logging.getLogger("runifold.rpc")
    handler, before = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        async with (
            serving(
                [TranscriptComponent()],
                server_settings(RUNIFOLD_SLOW_RPC_S=slow_s),
                database_url=shared_database_url,
            ) as running,
            AsyncClient(running.address, namespace=namespace) as client,
        ):
            created = await client.create_conversation()
            with pytest.raises(NotFound):
                await client.get_conversation(created.conversation_id, namespace="elsewhere")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
    lines = [r for r in handler.records if r.getMessage() == "rpc"]
    assert [getattr(r, "grpc_code", "") for r in lines] == ["OK", "NOT_FOUND"]
    assert {r.levelno for r in lines} == {level}
