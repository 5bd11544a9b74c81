"""`python -m services.migrate`: the one-shot migration step of compose and the k8s Job."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from services import migrate
from services.common import migrations
from services.common.postgres.pool import Database
from tests.support.settings import server_settings
from tests.support.tools import run


async def test_applies_every_service_schema_then_checks(bare_database_url: str) -> None:
    settings = server_settings()
    folders = migrate.migration_dirs()
    assert "transcript" in folders
    with pytest.raises(migrations.SchemaMismatch):
        await migrate.run(replace(settings, migrate="check"), bare_database_url)

    versions = await migrate.run(settings, bare_database_url)
    assert versions.keys() == folders.keys()
    assert await migrate.run(settings, bare_database_url) == versions  # idempotent
    assert await migrate.run(replace(settings, migrate="check"), bare_database_url) == versions
    db = Database(bare_database_url, settings)
    await db.open()
    try:
        for service, folder in folders.items():
            await migrations.check(db, service, folder)
    finally:
        await db.close()


def test_command_line_exit_codes(bare_database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    command = (sys.executable, "-m", "services.migrate")
    assert run(*command, env=env).returncode == 2  # no DATABASE_URL
    env["DATABASE_URL"] = bare_database_url
    checked = run(*command, "--check", env=env)
    assert checked.returncode == 1 and "SCHEMA_MISMATCH" in checked.stderr
