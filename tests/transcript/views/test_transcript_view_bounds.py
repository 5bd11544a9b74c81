"""LoadView with a summarized_through at the top of int64 is SEQUENCE_OUT_OF_RANGE on
PostgreSQL, not a bigint overflow in the view's range arithmetic (found by
tests/system/security/test_hostile_input.py: it was INTERNAL)."""

from __future__ import annotations

import pytest

from services.common.errors import Code, DomainError
from services.common.postgres.pool import Database
from services.transcript.store import PostgresTranscriptStore
from tests.transcript.support import make_service, new_conversation, user

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("through", [INT64_MAX, INT64_MAX - 4096, 2**62 + 1])
async def test_summarized_through_beyond_any_sequence(
    database: Database, namespace: str, through: int
) -> None:
    service = make_service(PostgresTranscriptStore(database))
    cid = await new_conversation(service, namespace)
    await service.append(namespace, cid, 0, [user("one"), user("two")], "")
    with pytest.raises(DomainError) as caught:
        await service.load_view(namespace, cid, 4096, 4096, through)
    assert (caught.value.code, caught.value.reason) == (
        Code.INVALID_ARGUMENT,
        "SEQUENCE_OUT_OF_RANGE",
    )
    assert caught.value.metadata == {"last_sequence": "2"}
    view = await service.load_view(namespace, cid, 1, 4096, 0)  # still a normal view
    assert [e.sequence for e in view.summary_buffer] == [1]
