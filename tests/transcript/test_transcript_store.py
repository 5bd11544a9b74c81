"""TranscriptService on a PostgreSQL it cannot reach (each feature's rules on PostgreSQL:
test_*_store.py in its folder)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from services.common.postgres.pool import Database
from services.transcript.store import PostgresTranscriptStore
from tests.transcript.support import make_service


async def test_store_outage_is_store_unavailable(shared_database_url: str, namespace: str) -> None:
    """A database that cannot be reached surfaces as UNAVAILABLE, not INTERNAL."""
    from services.common.errors import Code, DomainError
    from tests.support.settings import server_settings

    params = psycopg.conninfo.conninfo_to_dict(shared_database_url)
    params["dbname"] = "no_such_database_" + uuid.uuid4().hex[:6]
    db = Database(
        psycopg.conninfo.make_conninfo("", **params),
        server_settings(RUNIFOLD_DB_TIMEOUT_S="0.5", RUNIFOLD_DB_POOL_MIN="0"),
    )
    await db.open()
    try:
        with pytest.raises(DomainError) as caught:
            await make_service(PostgresTranscriptStore(db)).get_conversation(
                namespace, str(uuid.uuid4())
            )
        assert caught.value.code is Code.UNAVAILABLE
        assert caught.value.reason == "STORE_UNAVAILABLE"
    finally:
        await db.close()
