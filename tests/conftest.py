"""Shared fixtures: a real PostgreSQL, migrated template databases, servers on loopback.

PostgreSQL comes from DATABASE_URL when set, otherwise from the pgserver
package (a real PostgreSQL 16 started in a temporary folder). Migrations run
once into a template database; a test that needs an empty database gets a
copy of it, others share one database and isolate themselves by namespace.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.common import admission, migrations, stubs
from services.common.logs import JsonFormatter
from services.common.postgres.pool import Database
from services.common.server import RunningServer, serving
from services.transcript.component import TranscriptComponent
from tests.support.fake_openai import FakeOpenAI, fake_openai
from tests.support.settings import server_settings

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

MIGRATION_DIRS: dict[str, Path] = {
    "transcript": Path("services/transcript/migrations"),
    "summary": Path("services/summary/migrations"),
    "memory": Path("services/memory/migrations"),
}
TEMPLATE = "runifold_template"
TESTS = Path(__file__).resolve().parent


def with_database(url: str, dbname: str) -> str:
    """The same server, another database."""
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server for the whole session."""
    external = os.environ.get("DATABASE_URL")
    if external:
        yield external
        return
    from services.common.postgres.embedded import import_pgserver

    pgserver = import_pgserver()
    with tempfile.TemporaryDirectory(prefix="runifold-pg-") as folder:
        server = pgserver.get_server(folder, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


async def _create_database(admin_url: str, name: str, template: str | None = None) -> None:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        suffix = f" TEMPLATE {template}" if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{suffix}'.encode())


async def _drop_database(admin_url: str, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture(scope="session")
async def template_url(postgres_url: str) -> AsyncIterator[str]:
    """A database with every service's migrations applied, used as a template."""
    name = f"{TEMPLATE}_{uuid.uuid4().hex[:8]}"
    await _create_database(postgres_url, name)
    url = with_database(postgres_url, name)
    db = Database(url, server_settings())
    await db.open()
    try:
        for service, folder in MIGRATION_DIRS.items():
            await migrations.migrate(db, service, folder)
    finally:
        await db.close()
    yield url
    await _drop_database(postgres_url, name)


@pytest.fixture
async def fresh_database_url(postgres_url: str, template_url: str) -> AsyncIterator[str]:
    """An empty, migrated database of its own for one test."""
    template = conninfo_to_dict(template_url)["dbname"]
    name = f"t_{uuid.uuid4().hex[:12]}"
    await _create_database(postgres_url, name, template=str(template))
    yield with_database(postgres_url, name)
    await _drop_database(postgres_url, name)


@pytest.fixture
async def bare_database_url(postgres_url: str) -> AsyncIterator[str]:
    """An empty database without any migration."""
    name = f"b_{uuid.uuid4().hex[:12]}"
    await _create_database(postgres_url, name)
    yield with_database(postgres_url, name)
    await _drop_database(postgres_url, name)


@pytest.fixture(scope="session")
async def shared_database_url(postgres_url: str, template_url: str) -> AsyncIterator[str]:
    """One migrated database shared by tests that isolate themselves by namespace."""
    template = conninfo_to_dict(template_url)["dbname"]
    name = f"shared_{uuid.uuid4().hex[:8]}"
    await _create_database(postgres_url, name, template=str(template))
    yield with_database(postgres_url, name)
    await _drop_database(postgres_url, name)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"ns-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def database(shared_database_url: str) -> AsyncIterator[Database]:
    """An open pool on the shared database."""
    db = Database(shared_database_url, server_settings())
    await db.open()
    yield db
    await db.close()


@pytest.fixture
async def transcript_server(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """TranscriptService alone, on the shared database."""
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url
    ) as running:
        yield running


@pytest.fixture
async def channel(transcript_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(transcript_server.address) as ch:
        yield ch


@pytest.fixture
def transcript(channel: grpc.aio.Channel) -> TranscriptServiceAsyncStub:
    return stubs.transcript(channel)


@pytest.fixture(scope="module")
async def model() -> AsyncIterator[FakeOpenAI]:
    """The fake OpenAI-compatible model server, one for a module's tests."""
    async with fake_openai() as server:
        yield server


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every record of every logger at DEBUG, as the server writes it (JSON lines)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter("test"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


@pytest.fixture
def own_context() -> Iterator[None]:
    """Admission keeps each call's slot in a context variable: leave none behind."""
    slot, namespace = admission._slot_var.set(None), admission.namespace_var.set(None)
    yield
    admission._slot_var.reset(slot)
    admission.namespace_var.reset(namespace)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep a stable order: the tests of each service and client first, then the whole
    system's (tests/system), then the operations checks (tests/ops)."""
    order = {"system": 1, "ops": 2}

    def rank(item: pytest.Item) -> int:
        try:
            parts = item.path.relative_to(TESTS).parts
        except ValueError:
            return 0
        return order.get(parts[0], 0) if len(parts) > 1 else 0

    items.sort(key=rank)
