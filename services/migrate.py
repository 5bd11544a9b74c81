"""Apply every service's migrations, then exit: `python -m services.migrate`.

The one-shot migration step of docker-compose and of the Kubernetes Job: run
it before (new versions of) the services, which then start with
`RUNIFOLD_MIGRATE=check` and refuse to serve a schema that is not current.

`RUNIFOLD_MIGRATE=auto` (the default) applies what is missing, each service
under its own advisory lock, then checks; `RUNIFOLD_MIGRATE=check` (or
`--check`) only checks. Exit status: 0 when every schema is current, 1 when
one is not (or the database cannot be reached), 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from services.common import logs, migrations
from services.common.errors import DomainError
from services.common.postgres.pool import Database
from services.common.settings import Settings, SettingsError

log = logging.getLogger("runifold.migrate")

# Services in the order their schemas are applied.
SERVICES = ("transcript", "summary", "memory", "agent")


def migration_dirs(root: Path = Path(__file__).parent) -> dict[str, Path]:
    """Each service that has migrations, and their folder."""
    return {
        name: root / name / "migrations"
        for name in SERVICES
        if (root / name / "migrations").is_dir()
    }


async def run(settings: Settings, database_url: str) -> dict[str, int]:
    """Apply (mode auto) and check every service's migrations; return their versions."""
    settings = replace(settings, db_pool_min=1, db_pool_max=1)
    db = Database(database_url, settings, name="postgresql")
    await db.open()
    versions: dict[str, int] = {}
    try:
        for service, folder in migration_dirs().items():
            if settings.migrate == "auto":
                await migrations.migrate(db, service, folder)
            versions[service] = await migrations.check(db, service, folder)
            log.info("schema current", extra={"service": service, "version": versions[service]})
    finally:
        await db.close()
    return versions


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m services.migrate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check (RUNIFOLD_MIGRATE=check)")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"runifold: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        settings = replace(settings, migrate="check")
    if settings.database_url is None:
        print("runifold: configuration error: DATABASE_URL must be set", file=sys.stderr)
        return 2
    logs.configure("migrate", settings.log_level, settings.log_format)
    try:
        versions = asyncio.run(run(settings, settings.database_url))
    except DomainError as exc:  # SchemaMismatch, StoreUnavailable
        log.error("migration failed", extra={"reason": exc.reason, "detail": exc.message})
        return 1
    done = ", ".join(f"{service} v{version}" for service, version in versions.items())
    print(f"runifold migrate ({settings.migrate}): {done or 'nothing to do'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
