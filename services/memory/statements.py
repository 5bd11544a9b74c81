"""The SQL shared by the memory store's features: the columns of a memory, and what
makes one live and valid at a time. Each feature's statements are in its folder
(writes/, search/, outbox/).

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here."""

from __future__ import annotations

COLUMNS = (
    "namespace, memory_id, content, sources, metadata, revision, create_time, update_time, "
    "expire_time, embedding_model, embedding_dimension, valid_from_time, valid_until_time, "
    "superseded_by"
)


LIVE = "(expire_time IS NULL OR expire_time > now())"


# The same, on the memories table aliased `m`.
LIVE_M = "(m.expire_time IS NULL OR m.expire_time > now())"


# Valid (in valid time) at %(valid_at)s; every memory when it is NULL.
VALID_AT = """(%(valid_at)s::timestamptz IS NULL
    OR (valid_from_time <= %(valid_at)s::timestamptz
        AND (valid_until_time IS NULL OR valid_until_time > %(valid_at)s::timestamptz)))"""
