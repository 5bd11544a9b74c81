"""LangGraph checkpointers in `make bench-peers`: RunifoldSaver against PostgresSaver.

The same agent on each: a `StateGraph` over `MessagesState` (LangGraph's `add_messages`
channel) with one node calling a fake chat model (langchain-core's
`FakeListChatModel`, replies of about 400 characters), TURNS turns on one thread, each
`ainvoke` with one user message of about 200 characters: what a chat application
built on LangGraph does. Both checkpointers run in this process (the project's
virtual environment holds LangGraph and both savers), each on its own database of
the same PostgreSQL; RunifoldSaver reaches TranscriptService and AgentService through
gRPC (the all-in-one server, its own process).

Measured per checkpointer:
- storage after the run: the bytes (tables, indexes, TOAST) of what the checkpointer
  wrote: PostgresSaver's tables; for Runifold, the database minus the same database
  measured before the run (so the migrations' empty tables do not count);
- put and get latency p50 / p99: every `aput` and `aget_tuple` the graph makes,
  timed around the saver's method;
- two runs on one thread at once: both runs read the thread, then both model calls
  are held until both have read (a barrier), then both write. Without a guard the
  second write loses the first run's messages (LangGraph's own documentation: only
  its paid server enforces `multitask_strategy`); `lost` counts the messages missing
  from the final state, `refused` the runs refused with CONVERSATION_BUSY.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bench.peers.workload import tables_bytes
from bench.stats import percentile_ms

TURNS = 500
USER_CHARS = 200
REPLY_CHARS = 400

_WORDS = [
    "deploy",
    "schedule",
    "staging",
    "cluster",
    "budget",
    "rotation",
    "migration",
    "gateway",
    "timeout",
    "review",
    "release",
    "rollback",
    "canary",
    "latency",
    "quota",
    "tenant",
    "index",
    "outbox",
    "replica",
    "lease",
    "summary",
]


def _text(seed: int, chars: int) -> str:
    words: list[str] = []
    n = seed
    while sum(len(w) + 1 for w in words) < chars:
        n = (n * 1103515245 + 12345) % 2**31
        words.append(_WORDS[n % len(_WORDS)])
    return " ".join(words)[:chars]


class _Timed:
    """Wraps a saver's aput and aget_tuple on the instance, recording each call's time."""

    def __init__(self, saver: Any) -> None:
        self.puts: list[float] = []
        self.gets: list[float] = []
        saver.aput = self._wrap(saver.aput, self.puts)
        saver.aget_tuple = self._wrap(saver.aget_tuple, self.gets)

    @staticmethod
    def _wrap(call: Callable[..., Awaitable[Any]], into: list[float]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - started)

        return timed


def _graph(saver: Any, hold: Callable[[], Awaitable[None]] | None = None) -> Any:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph.graph import START, MessagesState, StateGraph

    model = FakeListChatModel(responses=[_text(i, REPLY_CHARS) for i in range(97)])

    async def agent(state: MessagesState) -> dict[str, Any]:
        if hold is not None:
            await hold()
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


async def _turns(saver: Any, thread_id: str, turns: int) -> _Timed:
    from langchain_core.messages import HumanMessage

    timed = _Timed(saver)
    graph = _graph(saver)
    config = {"configurable": {"thread_id": thread_id}}
    for turn in range(turns):
        await graph.ainvoke({"messages": [HumanMessage(_text(turn, USER_CHARS))]}, config)
    state = await graph.aget_state(config)
    if len(state.values["messages"]) != 2 * turns:
        raise AssertionError(f"{len(state.values['messages'])} messages after {turns} turns")
    return timed


async def _race(
    saver: Any, thread_id: str, run: Callable[[Any, dict[str, Any], str], Awaitable[None]]
) -> dict[str, int]:
    """Two runs on one thread at once, both model calls held until both runs have read."""
    from langchain_core.messages import HumanMessage

    both_read = asyncio.Barrier(2)

    async def hold() -> None:
        # A run that is refused never reaches its model call: do not wait for it forever.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(both_read.wait(), timeout=5)

    graph = _graph(saver, hold)
    config = {"configurable": {"thread_id": thread_id}}
    await graph.ainvoke({"messages": [HumanMessage("first")]}, config)
    before = len((await graph.aget_state(config)).values["messages"])
    outcomes = await asyncio.gather(
        run(graph, config, "run a"), run(graph, config, "run b"), return_exceptions=True
    )
    refused = sum(1 for o in outcomes if isinstance(o, Exception) and "BUSY" in str(o))
    failed = [o for o in outcomes if isinstance(o, Exception) and "BUSY" not in str(o)]
    if failed:
        raise failed[0]
    after = len((await graph.aget_state(config)).values["messages"])
    expected = before + 2 * (2 - refused)
    return {"refused": refused, "lost": expected - after}


async def _plain_run(graph: Any, config: dict[str, Any], text: str) -> None:
    from langchain_core.messages import HumanMessage

    await graph.ainvoke({"messages": [HumanMessage(text)]}, config)


def _result(
    name: str, turns: int, storage: int, timed: _Timed, races: dict[str, Any]
) -> dict[str, Any]:
    return {
        "system": name,
        "turns": turns,
        "storage_bytes": storage,
        "put": {
            "n": len(timed.puts),
            "p50_ms": percentile_ms(timed.puts, 0.5),
            "p99_ms": percentile_ms(timed.puts, 0.99),
        },
        "get": {
            "n": len(timed.gets),
            "p50_ms": percentile_ms(timed.gets, 0.5),
            "p99_ms": percentile_ms(timed.gets, 0.99),
        },
        "races": races,
    }


@contextlib.asynccontextmanager
async def _postgres_saver(url: str) -> AsyncIterator[Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(
        url,
        min_size=2,
        max_size=4,
        # What langgraph-checkpoint-postgres documents for a pool.
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    ) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver


async def postgres_saver(url: str, turns: int = TURNS) -> dict[str, Any]:
    """LangGraph's AsyncPostgresSaver: TURNS turns, then two runs racing on one thread."""
    async with _postgres_saver(url) as saver:
        timed = await _turns(saver, f"thread-{uuid.uuid4().hex[:8]}", turns)
        storage = await tables_bytes(url)
        races = {"none": await _race(saver, f"race-{uuid.uuid4().hex[:8]}", _plain_run)}
    return _result("LangGraph AsyncPostgresSaver", turns, storage, timed, races)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table of the checkpointer rows, with storage as a ratio to Runifold's."""
    ours = next((r for r in rows if r["system"].startswith("Runifold")), None)
    lines = [
        f"### LangGraph checkpointers, {rows[0]['turns'] if rows else TURNS} turns on one thread",
        "",
        "| system | storage (MiB) | vs Runifold | put p50 / p99 ms | get p50 / p99 ms "
        "| two runs at once (strategy: refused, messages lost) |",
        "|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['storage_bytes'] / ours['storage_bytes']:.1f}x" if ours else ""
        races = "; ".join(
            f"{k}: {v['refused']} refused, {v['lost']} lost" for k, v in r["races"].items()
        )
        lines.append(
            f"| {r['system']} | {r['storage_bytes'] / 2**20:,.2f} | {ratio} | "
            f"{r['put']['p50_ms']:.2f} / {r['put']['p99_ms']:.2f} | "
            f"{r['get']['p50_ms']:.2f} / {r['get']['p99_ms']:.2f} | {races} |"
        )
    return lines
