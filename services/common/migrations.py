"""Numbered SQL migrations per service, applied under an advisory lock.

Each service keeps `migrations/NNNN_name.sql`. `migrate` applies the missing
ones in order, each in its own transaction, while holding a per-service
advisory lock so that replicas starting together do not race. The checksum of
every applied file is recorded; a server refuses to serve when the database
schema is not exactly the one its code expects (missing, newer or edited).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import Code, DomainError
from services.common.postgres.pool import AsyncConn, Database
from services.common.settings import Settings, SettingsError

log = logging.getLogger(__name__)

_FILE_PATTERN = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS public.runifold_schema_migrations (
    service    text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service, version)
)
"""


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str
    checksum: str  # sha256 of `sql`


class SchemaMismatch(DomainError):
    """The database schema is not the one this code expects."""

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(
            Code.FAILED_PRECONDITION, "SCHEMA_MISMATCH", f"{service} schema mismatch: {detail}"
        )


@functools.cache
def load(directory: Path) -> tuple[Migration, ...]:
    """Read the numbered migrations of a folder, checking there is no gap.

    Read once per process: the files ship with the code, and the health probe
    checks the schema against them every few seconds."""
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_PATTERN.fullmatch(path.name)
        if not match:
            raise ValueError(f"migration file name must be NNNN_name.sql: {path}")
        sql = path.read_text()
        checksum = hashlib.sha256(sql.encode()).hexdigest()
        migrations.append(Migration(int(match[1]), match[2], sql, checksum))
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ValueError(f"migrations in {directory} must be numbered 1..n without gaps")
    return tuple(migrations)


async def _applied(conn: AsyncConn, service: str) -> dict[int, str]:
    cursor = await conn.execute(
        "SELECT version, checksum FROM public.runifold_schema_migrations WHERE service = %s",
        (service,),
    )
    return {version: checksum for version, checksum in await cursor.fetchall()}


def _compare(service: str, migrations: Sequence[Migration], applied: dict[int, str]) -> list[str]:
    problems = []
    known = {m.version: m for m in migrations}
    for version, checksum in sorted(applied.items()):
        if version not in known:
            problems.append(f"database has version {version}, newer than this code")
        elif known[version].checksum != checksum:
            problems.append(f"migration {version} was edited after it was applied")
    return problems


async def migrate(db: Database, service: str, directory: Path) -> int:
    """Apply the missing migrations of a service; return the schema version."""
    migrations = load(directory)
    async with db.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"runifold.{service}",))
        try:
            await conn.execute(_BOOKKEEPING)
            applied = await _applied(conn, service)
            problems = _compare(service, migrations, applied)
            if problems:
                raise SchemaMismatch(service, "; ".join(problems))
            for migration in migrations:
                if migration.version in applied:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql.encode())
                    await conn.execute(
                        "INSERT INTO public.runifold_schema_migrations "
                        "(service, version, name, checksum) VALUES (%s, %s, %s, %s)",
                        (service, migration.version, migration.name, migration.checksum),
                    )
                log.info(
                    "migration applied", extra={"service": service, "version": migration.version}
                )
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (f"runifold.{service}",))
    return len(migrations)


async def check(db: Database, service: str, directory: Path) -> int:
    """Raise SchemaMismatch unless every migration is applied, unedited, and none is newer;
    return the schema version."""
    migrations = load(directory)
    async with db.connection() as conn:
        cursor = await conn.execute(
            "SELECT to_regclass('public.runifold_schema_migrations') IS NOT NULL"
        )
        row = await cursor.fetchone()
        applied = await _applied(conn, service) if row and row[0] else {}
    problems = _compare(service, migrations, applied)
    missing = [m.version for m in migrations if m.version not in applied]
    if missing:
        problems.append(f"migrations {missing} are not applied (run the migration step)")
    if problems:
        raise SchemaMismatch(service, "; ".join(problems))
    return len(migrations)


async def open_database(
    database_url: str | None, settings: Settings, service: str, directory: Path
) -> Database:
    """A service's pool, opened, with its schema migrated (RUNIFOLD_MIGRATE=auto) and
    checked; a wrong schema refuses to start."""
    if database_url is None:
        raise SettingsError(f"the {service} service needs a database: set DATABASE_URL")
    db = Database(database_url, settings, name=service)
    await db.open()
    try:
        if settings.migrate == "auto":
            await migrate(db, service, directory)
        await check(db, service, directory)
    except BaseException:
        await db.close()
        raise
    return db


async def serving_schema(db: Database | None, service: str, directory: Path) -> bool:
    """Health of a service's store: the pool is open, the database answers, and the
    schema is exactly the one the code expects."""
    if db is None or db.closed:
        return False
    try:
        await check(db, service, directory)
    except Exception:
        return False
    return True
