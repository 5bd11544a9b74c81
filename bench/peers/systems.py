"""The peer systems, each driven through its own public API the way its users drive it.

Runs in `.venv-peers` (see bench/peers/requirements.txt): it imports LangGraph,
Google ADK, SQLAlchemy and psycopg, never the project's packages.

- raw psycopg: the floor. A conversation row with a version, an events table;
  an append is a compare-and-swap transaction (UPDATE ... WHERE version = v,
  then INSERT), the same statements a careful hand-written store would run.
- LangGraph PostgresSaver: a graph over `MessagesState` (the `add_messages`
  reducer) compiled with `AsyncPostgresSaver` on a connection pool; an append is
  `aupdate_state` with one message: one checkpoint, the least LangGraph writes
  to record a message durably; a load is `aget_state` (LangGraph reads a
  thread's state whole: there is no way to read only the last 16 messages).
- Google ADK DatabaseSessionService on SQLAlchemy's async engine with the
  psycopg driver: an append is `append_event` (it locks the session row,
  checks staleness, stores the event); loads are `get_session` with
  `GetSessionConfig(num_recent_events=16)` and without.
- LangGraph AsyncPostgresStore with a pgvector index (its default HNSW,
  cosine) embedding the `text` field with the same model, through an async
  embedding function that runs the model in a thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from bench.peers.workload import WRITERS, Event, load_model, tables_bytes

# -- raw psycopg -------------------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE raw_conversations (
    conversation_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    version bigint NOT NULL DEFAULT 0,
    last_sequence bigint NOT NULL DEFAULT 0);
CREATE TABLE raw_events (
    conversation_id bigint NOT NULL,
    sequence bigint NOT NULL,
    role smallint NOT NULL,
    text text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, sequence));
"""

_ROLE = {"user": 1, "assistant": 2}


class RawConversations:
    name = "raw psycopg"

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url, min_size=WRITERS, max_size=WRITERS, kwargs={"autocommit": True}, open=False
        )

    async def open(self) -> None:
        await self.pool.open(wait=True)
        async with self.pool.connection() as conn:
            await conn.execute(RAW_SCHEMA)

    async def close(self) -> None:
        await self.pool.close()

    async def create(self, index: int) -> dict[str, int]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                "INSERT INTO raw_conversations DEFAULT VALUES RETURNING conversation_id"
            )
            row = await cursor.fetchone()
        assert row is not None
        return {"id": row[0], "version": 0}

    async def _append(self, handle: dict[str, int], events: Sequence[Event]) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE raw_conversations SET version = version + 1,"
                " last_sequence = last_sequence + %s"
                " WHERE conversation_id = %s AND version = %s RETURNING last_sequence",
                (len(events), handle["id"], handle["version"]),
            )
            row = await cursor.fetchone()
            if row is None:
                raise RuntimeError("version conflict")
            first = row[0] - len(events) + 1
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO raw_events (conversation_id, sequence, role, text)"
                    " VALUES (%s, %s, %s, %s)",
                    [
                        (handle["id"], first + i, _ROLE[e.role], e.text)
                        for i, e in enumerate(events)
                    ],
                )
        handle["version"] += 1

    async def fill(self, handle: dict[str, int], events: Sequence[Event]) -> None:
        await self._append(handle, events)

    async def append(self, handle: dict[str, int], event: Event) -> None:
        await self._append(handle, [event])

    async def load_last(self, handle: dict[str, int], count: int) -> list[str]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT text FROM raw_events WHERE conversation_id = %s"
                " ORDER BY sequence DESC LIMIT %s",
                (handle["id"], count),
            )
            rows = await cursor.fetchall()
        return [r[0] for r in reversed(rows)]

    async def load_all(self, handle: dict[str, int]) -> list[str]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT text FROM raw_events WHERE conversation_id = %s ORDER BY sequence",
                (handle["id"],),
            )
            return [r[0] for r in await cursor.fetchall()]

    async def storage_bytes(self) -> int:
        return await tables_bytes(self.url)


# -- LangGraph PostgresSaver ---------------------------------------------------------


class LangGraphConversations:
    name = "LangGraph PostgresSaver"

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=WRITERS,
            max_size=WRITERS,
            # What langgraph-checkpoint-postgres documents for a pool.
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        self.graph: Any = None

    async def open(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.graph import START, MessagesState, StateGraph

        await self.pool.open(wait=True)
        saver = AsyncPostgresSaver(self.pool)
        await saver.setup()
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda state: {})
        builder.add_edge(START, "agent")
        self.graph = builder.compile(checkpointer=saver)

    async def close(self) -> None:
        await self.pool.close()

    async def create(self, index: int) -> dict[str, Any]:
        return {"configurable": {"thread_id": f"thread-{index}-{uuid.uuid4().hex[:8]}"}}

    @staticmethod
    def _messages(events: Sequence[Event]) -> list[Any]:
        from langchain_core.messages import AIMessage, HumanMessage

        return [
            HumanMessage(content=e.text) if e.role == "user" else AIMessage(content=e.text)
            for e in events
        ]

    async def fill(self, config: dict[str, Any], events: Sequence[Event]) -> None:
        await self.graph.aupdate_state(config, {"messages": self._messages(events)})

    async def append(self, config: dict[str, Any], event: Event) -> None:
        await self.graph.aupdate_state(config, {"messages": self._messages([event])})

    async def load_last(self, config: dict[str, Any], count: int) -> list[str]:
        state = await self.graph.aget_state(config)
        return [str(m.content) for m in state.values["messages"][-count:]]

    async def load_all(self, config: dict[str, Any]) -> list[str]:
        state = await self.graph.aget_state(config)
        return [str(m.content) for m in state.values["messages"]]

    async def storage_bytes(self) -> int:
        return await tables_bytes(self.url)


# -- Google ADK DatabaseSessionService ------------------------------------------------


class AdkConversations:
    name = "Google ADK DatabaseSessionService"

    def __init__(self, url: str) -> None:
        self.url = url
        self.service: Any = None
        # Filled events get timestamps in the past, one millisecond apart, so that
        # ADK's (timestamp, id) order is the order written; live appends come later.
        self._clock = time.time() - 86_400

    async def open(self) -> None:
        from google.adk.sessions import DatabaseSessionService
        from psycopg.conninfo import conninfo_to_dict
        from sqlalchemy.engine import URL

        # The same server and database, as a SQLAlchemy URL with the psycopg driver.
        params = conninfo_to_dict(self.url)
        url = URL.create(
            "postgresql+psycopg",
            username=str(params.get("user", "postgres")),
            password=str(params.get("password", "")) or None,
            database=str(params["dbname"]),
            query={"host": str(params["host"])},
        )
        self.service = DatabaseSessionService(
            db_url=url.render_as_string(hide_password=False), pool_size=WRITERS
        )

    async def close(self) -> None:
        await self.service.close()

    async def create(self, index: int) -> Any:
        return await self.service.create_session(
            app_name="bench", user_id=f"user-{index}", session_id=f"session-{uuid.uuid4().hex}"
        )

    def _event(self, event: Event, timestamp: float | None = None) -> Any:
        from google.adk.events import Event as AdkEvent
        from google.genai import types

        role = "user" if event.role == "user" else "model"
        fields: dict[str, Any] = {}
        if timestamp is not None:
            fields["timestamp"] = timestamp
        return AdkEvent(
            author=role,
            invocation_id="bench",
            content=types.Content(role=role, parts=[types.Part(text=event.text)]),
            **fields,
        )

    async def fill(self, session: Any, events: Sequence[Event]) -> None:
        # Bulk: rows built by ADK's own storage model (StorageEvent.from_event), in one
        # transaction. append_event one at a time would take ~20 min for 120,000 events.
        schema = self.service._get_schema_classes()
        rows = []
        for e in events:
            self._clock += 0.001
            rows.append(schema.StorageEvent.from_event(session, self._event(e, self._clock)))
        async with self.service.database_session_factory() as sql_session:
            sql_session.add_all(rows)
            await sql_session.commit()

    async def append(self, session: Any, event: Event) -> None:
        await self.service.append_event(session, self._event(event))

    async def _texts(self, session: Any, config: Any) -> list[str]:
        got = await self.service.get_session(
            app_name=session.app_name,
            user_id=session.user_id,
            session_id=session.id,
            config=config,
        )
        return [e.content.parts[0].text for e in got.events]

    async def load_last(self, session: Any, count: int) -> list[str]:
        from google.adk.sessions.base_session_service import GetSessionConfig

        return await self._texts(session, GetSessionConfig(num_recent_events=count))

    async def load_all(self, session: Any) -> list[str]:
        return await self._texts(session, None)

    async def storage_bytes(self) -> int:
        return await tables_bytes(self.url)


# -- LangGraph AsyncPostgresStore with a pgvector index ----------------------------------


class LangGraphSearch:
    name = "LangGraph AsyncPostgresStore (pgvector)"

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=4,
            max_size=4,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        self.store: Any = None

    async def open(self) -> None:
        from langgraph.store.postgres.aio import AsyncPostgresStore

        model = load_model(threads=1)

        async def embed(texts: Sequence[str]) -> list[list[float]]:
            vectors = await asyncio.to_thread(
                model.encode, list(texts), normalize_embeddings=True, batch_size=64
            )
            return [list(map(float, v)) for v in vectors]

        async with await AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await self.pool.open(wait=True)
        self.store = AsyncPostgresStore(
            self.pool,
            index={"dims": 384, "embed": embed, "fields": ["text"]},
        )
        await self.store.setup()

    async def close(self) -> None:
        await self.pool.close()

    async def ingest(self, namespace: int, texts: Sequence[str]) -> None:
        from langgraph.store.base import PutOp

        for low in range(0, len(texts), 64):
            await self.store.abatch(
                [
                    PutOp(("tenant", str(namespace)), f"fact-{low + i}", {"text": text})
                    for i, text in enumerate(texts[low : low + 64])
                ]
            )

    async def ready(self) -> None:
        return None  # the store embeds and indexes inside each put

    async def search(self, namespace: int, query: str) -> list[str]:
        items = await self.store.asearch(("tenant", str(namespace)), query=query, limit=5)
        return [item.value["text"] for item in items]
