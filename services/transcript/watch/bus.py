"""The notifications between the processes that serve one database, for
WatchConversation: the bus of services/common/postgres/notify.py on its own channel.

A process that commits a write to a watched conversation
(`conversations.watched_until` in the future, migrations/0004_watch.sql) announces
the conversation's key after the commit (the key only: no content, no namespace, no
id); every process listens on one connection of its own (not one per stream).
"""

from __future__ import annotations

from services.common.postgres.notify import ChangeBus
from services.common.postgres.notify import PostgresChangeBus as _NotifyBus
from services.common.settings import Settings

CHANNEL = "runifold_transcript"

__all__ = ["CHANNEL", "ChangeBus", "PostgresChangeBus"]


class PostgresChangeBus(_NotifyBus):
    """ChangeBus on PostgreSQL LISTEN/NOTIFY, channel `runifold_transcript`."""

    def __init__(self, url: str, settings: Settings, *, check_s: float = 5.0) -> None:
        super().__init__(url, settings, channel=CHANNEL, feed="transcript feed", check_s=check_s)
