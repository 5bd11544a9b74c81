"""`make soak`: a mixed workload against the all-in-one server for a set duration.

The server runs as production runs it (`python -m services`, its own process)
with the offline model and summarizer, the real embedding model and the Qdrant
Edge index, on a real PostgreSQL (DATABASE_URL, or pgserver in a temporary
folder). `--concurrency` clients each loop over a weighted mix until the
duration is spent:

  turn       RunConversation: memory lookup (limit 3), window 16, summary mode AUTO
  append     AppendEntries of 2 messages with a request id and compare-and-swap
  search     SearchMemories (limit 5)
  upsert     UpsertMemory of a new fact (the memories that turns and searches find)
  summarize  Summarize (up to 4 passes over a batch of 32)
  request    RequestSummary (the background queue; a worker drains it)
  view       LoadView (window 16)

Each client owns a few conversations, so compare-and-swap conflicts are rare
and counted when they happen. The report gives throughput, p50/p99 per RPC,
errors by status code, and the server process's resident memory (RSS, from
/proc) sampled over the run. No thresholds: the numbers are for reading.

`--noisy` is the noisy-neighbour mix: the clients, spread over
`--quiet-namespaces` namespaces, run the mix above twice for `--duration`
each, first alone (the baseline), then while one more namespace floods the
server with `--flood-concurrency` callers of the expensive calls (searches with
4,000-character queries and memory-enabled turns with 4,000-character inputs,
each with a 2 s deadline, back to back). The report gives the quiet namespaces'
p50/p99 in both runs and their ratio (the goal: p99 within 2x), and what the
flood got (OK, refused with NAMESPACE_CONCURRENCY_LIMIT or OVERLOADED, timed
out). A refused flood caller waits the RetryInfo delay before its next call
(`--flood-retry honour`, what the clients do) or calls again at once
(`--flood-retry ignore`, a hostile caller).

    python -m bench.soak --concurrency 16 --duration 600
    python -m bench.soak --noisy --duration 60                # baseline, then the flood
    python -m bench.soak --duration 3600 --mix upsert=0      # a kind left out
    make soak SOAK_ARGS="--concurrency 16 --duration 600"
    RUNIFOLD_SOAK_CONCURRENCY=16 RUNIFOLD_SOAK_DURATION_S=600 make soak
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from bench.common import new_database, postgres, seed_conversation, server
from bench.stats import median_ms, percentile_ms, rss_mib
from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import assistant, user
from services.common import stubs
from services.common.status import error_info

NAMESPACE = "soak"
# Operation -> weight in the mix.
MIX: dict[str, int] = {
    "turn": 30,
    "append": 25,
    "search": 20,
    "upsert": 5,
    "summarize": 8,
    "request": 4,
    "view": 8,
}
TOPICS = [
    "deploys happen on Tuesdays",
    "the staging cluster runs in Frankfurt",
    "budgets are reviewed each quarter",
    "the on-call rotation changes every Monday",
    "PostgreSQL holds the transcripts",
    "the API gateway enforces a 30 second timeout",
    "incidents are tracked in the ops channel",
    "the user's favourite editor is Helix",
]
CONVERSATIONS_PER_CLIENT = 3
FLOOD_NAMESPACE = "soak-flood"
FLOOD_TEXT_CHARS = 4000
FLOOD_DEADLINE_S = 2.0


@dataclass
class Settings:
    concurrency: int
    duration_s: float
    sample_s: float
    seed: int
    json_path: Path | None
    mix: dict[str, int]
    noisy: bool = False
    quiet_namespaces: int = 4
    flood_concurrency: int = 64
    flood_retry: str = "honour"
    flood_kinds: tuple[str, ...] = ("search", "turn")
    rounds: int = 3


def parse_args(argv: list[str]) -> Settings:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=int(env.get("RUNIFOLD_SOAK_CONCURRENCY", "8")),
        help="clients in flight (env RUNIFOLD_SOAK_CONCURRENCY, default 8)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=float(env.get("RUNIFOLD_SOAK_DURATION_S", "60")),
        help="seconds of load after warm-up (env RUNIFOLD_SOAK_DURATION_S, default 60)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=float(env.get("RUNIFOLD_SOAK_SAMPLE_S", "5")),
        help="seconds between RSS samples (env RUNIFOLD_SOAK_SAMPLE_S, default 5)",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed of the mix")
    parser.add_argument(
        "--mix",
        default="",
        help="weights to change, e.g. upsert=0,search=40 (kinds: " + ", ".join(MIX) + ")",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    parser.add_argument(
        "--noisy",
        action="store_true",
        help="the noisy-neighbour mix: a baseline run, then a run with one namespace flooding",
    )
    parser.add_argument(
        "--quiet-namespaces",
        type=int,
        default=4,
        help="namespaces the clients are spread over in --noisy (default 4)",
    )
    parser.add_argument(
        "--flood-concurrency",
        type=int,
        default=64,
        help="callers of the flooding namespace in --noisy (default 64)",
    )
    parser.add_argument(
        "--flood-retry",
        choices=("honour", "ignore"),
        default="honour",
        help="whether a refused flood caller waits the RetryInfo delay (default honour)",
    )
    parser.add_argument(
        "--flood-kinds",
        default="search,turn",
        help="what the flood calls: search, turn or both (default search,turn)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="--noisy alternates baseline and flood this many times, duration/rounds each "
        "(a machine whose load drifts skews both alike; default 3)",
    )
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.flood_kinds.split(",") if k)
    if not kinds or not set(kinds) <= {"search", "turn"}:
        parser.error("--flood-kinds takes search, turn or search,turn")
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    if args.concurrency < 1 or args.duration <= 0 or args.sample_interval <= 0:
        parser.error("concurrency, duration and sample interval must be positive")
    if args.quiet_namespaces < 1 or args.flood_concurrency < 1:
        parser.error("--quiet-namespaces and --flood-concurrency must be positive")
    mix = dict(MIX)
    for item in filter(None, args.mix.split(",")):
        kind, _, weight = item.partition("=")
        if kind not in MIX or not weight.isdigit():
            parser.error(f"--mix takes KIND=WEIGHT with KIND in {', '.join(MIX)}, got {item!r}")
        mix[kind] = int(weight)
    if not any(mix.values()):
        parser.error("--mix leaves nothing to run")
    return Settings(
        args.concurrency,
        args.duration,
        args.sample_interval,
        args.seed,
        args.json,
        mix,
        args.noisy,
        args.quiet_namespaces,
        args.flood_concurrency,
        args.flood_retry,
        kinds,
        args.rounds,
    )


# -- the workload ----------------------------------------------------------------


@dataclass
class Record:
    """What one RPC kind did."""

    latencies: list[float] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)


@dataclass
class Client:
    """One client: its conversations and their known versions."""

    index: int
    rng: random.Random
    conversations: list[str]
    versions: dict[str, int]
    namespace: str = NAMESPACE


class Workload:
    def __init__(self, channel: grpc.aio.Channel, mix: dict[str, int]) -> None:
        self.transcript = stubs.transcript(channel)
        self.summary = stubs.summary(channel)
        self.memory = stubs.memory(channel)
        self.agent = stubs.agent(channel)
        self.records: dict[str, Record] = defaultdict(Record)
        # Per namespace: the conversation the seeded memories come from.
        self.facts: dict[str, str] = {}
        self.kinds, self.weights = list(mix), list(mix.values())

    async def timed(self, name: str, call: Callable[[], Awaitable[object]]) -> object | None:
        start = time.perf_counter()
        try:
            result = await call()
        except grpc.aio.AioRpcError as error:
            self.records[name].codes[error.code().name] += 1
            return None
        self.records[name].latencies.append(time.perf_counter() - start)
        self.records[name].codes["OK"] += 1
        return result

    async def seed(self, namespace: str = NAMESPACE) -> None:
        self.facts[namespace] = await seed_conversation(self.transcript, namespace, TOPICS)
        for i in range(len(TOPICS)):
            await self.upsert_fact(i, namespace)

    async def upsert_fact(self, i: int, namespace: str = NAMESPACE) -> object | None:
        topic = i % len(TOPICS)
        return await self.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                content=f"Note {i}: {TOPICS[topic]}.",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=self.facts[namespace],
                        from_sequence=topic + 1,
                        through_sequence=topic + 1,
                    )
                ],
            ),
            timeout=30,
        )

    async def client(self, index: int, seed: int, namespace: str = NAMESPACE) -> Client:
        conversations = []
        for _ in range(CONVERSATIONS_PER_CLIENT):
            created = await self.transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace)
            )
            conversations.append(created.conversation.conversation_id)
        return Client(
            index,
            random.Random(seed + index),
            conversations,
            dict.fromkeys(conversations, 0),
            namespace,
        )

    async def step(self, client: Client, n: int) -> None:
        ns = client.namespace
        kind = client.rng.choices(self.kinds, weights=self.weights)[0]
        cid = client.rng.choice(client.conversations)
        topic = TOPICS[client.rng.randrange(len(TOPICS))]
        if kind == "turn":
            reply = await self.timed(
                "RunConversation",
                lambda: self.agent.RunConversation(
                    agent_pb.RunConversationRequest(
                        namespace=ns,
                        conversation_id=cid,
                        turn_id=str(uuid.uuid4()),
                        input=[user(f"What do we know about {topic.split()[0]}?")],
                        policy=agent_pb.ContextPolicy(
                            window=16,
                            summary_batch=32,
                            memory_limit=3,
                            summary_mode=agent_pb.SUMMARY_MODE_AUTO,
                            max_summary_passes=4,
                        ),
                    ),
                    timeout=60,
                ),
            )
            if isinstance(reply, agent_pb.RunConversationResponse):
                client.versions[cid] = reply.conversation_version
        elif kind == "append":
            appended = await self.timed(
                "AppendEntries",
                lambda: self.transcript.AppendEntries(
                    transcript_pb.AppendEntriesRequest(
                        namespace=ns,
                        conversation_id=cid,
                        expected_version=client.versions[cid],
                        request_id=str(uuid.uuid4()),
                        messages=[
                            user(f"client {client.index} says {topic}"),
                            assistant(f"Noted: {topic}."),
                        ],
                    ),
                    timeout=30,
                ),
            )
            if isinstance(appended, transcript_pb.AppendEntriesResponse):
                client.versions[cid] = appended.version
            else:  # a conflict (a turn moved it): learn the version
                got = await self.transcript.GetConversation(
                    transcript_pb.GetConversationRequest(namespace=ns, conversation_id=cid)
                )
                client.versions[cid] = got.conversation.version
        elif kind == "search":
            await self.timed(
                "SearchMemories",
                lambda: self.memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=ns, query=f"when is {topic.split()[-1]}?", limit=5
                    ),
                    timeout=30,
                ),
            )
        elif kind == "upsert":
            await self.timed(
                "UpsertMemory", lambda: self.upsert_fact(client.index * 100_000 + n, ns)
            )
        elif kind == "summarize":
            await self.timed(
                "Summarize",
                lambda: self.summary.Summarize(
                    summary_pb.SummarizeRequest(
                        namespace=ns,
                        conversation_id=cid,
                        window=16,
                        summary_batch=32,
                        max_summary_passes=4,
                    ),
                    timeout=60,
                ),
            )
        elif kind == "request":
            await self.timed(
                "RequestSummary",
                lambda: self.summary.RequestSummary(
                    summary_pb.RequestSummaryRequest(
                        namespace=ns, conversation_id=cid, window=16, summary_batch=32
                    ),
                    timeout=30,
                ),
            )
        else:
            await self.timed(
                "LoadView",
                lambda: self.transcript.LoadView(
                    transcript_pb.LoadViewRequest(
                        namespace=ns, conversation_id=cid, window=16, summary_batch=32
                    ),
                    timeout=30,
                ),
            )


async def soak(settings: Settings, database_url: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="runifold-soak-") as data:
        env = {
            "RUNIFOLD_LOG_LEVEL": "ERROR",
            "RUNIFOLD_DATA_DIR": data,
            "RUNIFOLD_DB_POOL_MAX": "32",
            "RUNIFOLD_SUMMARY_WORKERS": "1",
        }
        async with (
            # The all-in-one server as production runs it (`python -m services`).
            server("services", database_url, env, start_timeout=120) as (address, pid),
            grpc.aio.insecure_channel(address) as channel,
        ):
            work = Workload(channel, settings.mix)
            await work.seed()
            clients = [await work.client(i, settings.seed) for i in range(settings.concurrency)]
            # Warm-up (model, caches, pools): a few steps per client, not recorded.
            for client in clients:
                for n in range(3):
                    await work.step(client, -1 - n)
            work.records.clear()
            rss: list[tuple[float, float]] = []
            start = time.monotonic()
            deadline = start + settings.duration_s
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    value = rss_mib(pid)
                    if value is not None:
                        rss.append((time.monotonic() - start, value))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), settings.sample_s)

            async def run(client: Client) -> None:
                n = 0
                while time.monotonic() < deadline:
                    await work.step(client, n)
                    n += 1

            sampler = asyncio.create_task(sample())
            await asyncio.gather(*(run(c) for c in clients))
            elapsed = time.monotonic() - start
            stop.set()
            await sampler
            final = rss_mib(pid)
            if final is not None:
                rss.append((elapsed, final))
    rpcs = {}
    errors: Counter[str] = Counter()
    for name, record in sorted(work.records.items()):
        failed = {code: n for code, n in record.codes.items() if code != "OK"}
        errors.update(failed)
        rpcs[name] = {
            "ok": len(record.latencies),
            "rate_per_s": len(record.latencies) / elapsed,
            "p50_ms": median_ms(record.latencies),
            "p99_ms": percentile_ms(record.latencies, 0.99),
            "errors": failed,
        }
    total = sum(len(r.latencies) for r in work.records.values())
    return {
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "concurrency": settings.concurrency,
        "mix": settings.mix,
        "duration_s": round(elapsed, 1),
        "total_ok": total,
        "throughput_per_s": total / elapsed,
        "errors_by_code": dict(errors),
        "rpcs": rpcs,
        "rss_mib": [(round(t, 1), round(v, 1)) for t, v in rss],
    }


# -- the noisy neighbour ------------------------------------------------------------


def _long_text(rng: random.Random) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < FLOOD_TEXT_CHARS:
        words.append("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))))
    return " ".join(words)[:FLOOD_TEXT_CHARS]


def _retry_delay_s(error: grpc.aio.AioRpcError) -> float:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return 0.0


class Flood:
    """One namespace's callers of the expensive calls, back to back, each with a 2 s
    deadline: searches with long queries and memory-enabled turns with long inputs."""

    def __init__(
        self, channel: grpc.aio.Channel, honour_retry: bool, kinds: tuple[str, ...]
    ) -> None:
        self.memory = stubs.memory(channel)
        self.agent = stubs.agent(channel)
        self.honour_retry = honour_retry
        self.kinds = kinds
        self.outcomes: Counter[str] = Counter()
        # Made once: making a text per call cost the benchmark's own process more CPU
        # than the server spent refusing the calls.
        rng = random.Random(99)
        self.texts = [_long_text(rng) for _ in range(256)]

    async def caller(self, index: int, until: float) -> None:
        rng = random.Random(1000 + index)
        while (now := time.monotonic()) < until:
            try:
                if rng.choice(self.kinds) == "search":
                    await self.memory.SearchMemories(
                        memory_pb.SearchMemoriesRequest(
                            namespace=FLOOD_NAMESPACE, query=rng.choice(self.texts), limit=5
                        ),
                        timeout=FLOOD_DEADLINE_S,
                    )
                    self.outcomes["search OK"] += 1
                else:
                    # A new conversation each time: the window never needs a summary.
                    await self.agent.RunConversation(
                        agent_pb.RunConversationRequest(
                            namespace=FLOOD_NAMESPACE,
                            create_if_missing=True,
                            input=[user(rng.choice(self.texts))],
                            policy=agent_pb.ContextPolicy(memory_limit=5),
                        ),
                        timeout=FLOOD_DEADLINE_S,
                    )
                    self.outcomes["turn OK"] += 1
            except grpc.aio.AioRpcError as error:
                info = error_info(error)
                self.outcomes[f"{error.code().name} {info.reason if info else ''}".strip()] += 1
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and self.honour_retry:
                    await asyncio.sleep(max(0.0, min(_retry_delay_s(error), until - now)))


def _summary(records: dict[str, Record], elapsed: float) -> dict[str, dict[str, object]]:
    rows: dict[str, dict[str, object]] = {}
    every: list[float] = []
    for name, record in sorted(records.items()):
        every += record.latencies
        rows[name] = {
            "ok": len(record.latencies),
            "rate_per_s": len(record.latencies) / elapsed,
            "p50_ms": median_ms(record.latencies),
            "p99_ms": percentile_ms(record.latencies, 0.99),
            "errors": {code: n for code, n in record.codes.items() if code != "OK"},
        }
    rows["all"] = {
        "ok": len(every),
        "rate_per_s": len(every) / elapsed,
        "p50_ms": median_ms(every),
        "p99_ms": percentile_ms(every, 0.99),
        "errors": {},
    }
    return rows


async def noisy(settings: Settings, database_url: str) -> dict[str, object]:
    """The quiet namespaces' mix alone, then with one namespace flooding."""
    with tempfile.TemporaryDirectory(prefix="runifold-soak-") as data:
        env = {
            "RUNIFOLD_LOG_LEVEL": "ERROR",
            "RUNIFOLD_DATA_DIR": data,
            "RUNIFOLD_DB_POOL_MAX": "32",
            "RUNIFOLD_SUMMARY_WORKERS": "1",
        }
        async with (
            server("services", database_url, env, start_timeout=120) as (address, pid),
            grpc.aio.insecure_channel(address) as channel,
            # The flood's own connection, as another tenant's process would have.
            grpc.aio.insecure_channel(address) as flood_channel,
        ):
            work = Workload(channel, settings.mix)
            namespaces = [f"{NAMESPACE}-{i}" for i in range(settings.quiet_namespaces)]
            for namespace in namespaces:
                await work.seed(namespace)
            clients = [
                await work.client(i, settings.seed, namespaces[i % len(namespaces)])
                for i in range(settings.concurrency)
            ]
            for client in clients:
                for n in range(3):
                    await work.step(client, -1 - n)
            records: dict[str, dict[str, Record]] = {"baseline": {}, "flood": {}}
            seconds = {"baseline": 0.0, "flood": 0.0}
            rss: dict[str, list[float]] = {"baseline": [], "flood": []}
            flood = Flood(flood_channel, settings.flood_retry == "honour", settings.flood_kinds)
            window = settings.duration_s / settings.rounds
            for phase in ("baseline", "flood") * settings.rounds:
                work.records.clear()
                start = time.monotonic()
                until = start + window

                async def run(client: Client, until: float = until) -> None:
                    n = 0
                    while time.monotonic() < until:
                        await work.step(client, n)
                        n += 1

                async def sample(until: float = until, into: list[float] = rss[phase]) -> None:
                    while time.monotonic() < until:
                        value = rss_mib(pid)
                        if value is not None:
                            into.append(value)
                        await asyncio.sleep(min(settings.sample_s, window))

                callers = (
                    [flood.caller(i, until) for i in range(settings.flood_concurrency)]
                    if phase == "flood"
                    else []
                )
                # Every call of the phase has returned when this does: the next phase
                # starts clean (a flood call lasts at most its 2 s deadline).
                await asyncio.gather(sample(), *(run(c) for c in clients), *callers)
                seconds[phase] += time.monotonic() - start
                for name, record in work.records.items():
                    into = records[phase].setdefault(name, Record())
                    into.latencies += record.latencies
                    into.codes.update(record.codes)
            runs = {phase: _summary(records[phase], seconds[phase]) for phase in records}
    ratios = {
        name: round(float(str(row["p99_ms"])) / float(str(base["p99_ms"])), 2)
        for name, row in runs["flood"].items()
        if (base := runs["baseline"].get(name)) and float(str(base["p99_ms"]))
    }
    return {
        "mode": "noisy",
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "concurrency": settings.concurrency,
        "quiet_namespaces": settings.quiet_namespaces,
        "flood_concurrency": settings.flood_concurrency,
        "flood_retry": settings.flood_retry,
        "flood_kinds": list(settings.flood_kinds),
        "rounds": settings.rounds,
        "mix": settings.mix,
        "duration_s": settings.duration_s,
        "baseline": runs["baseline"],
        "flood": runs["flood"],
        "p99_ratio": ratios,
        "flood_outcomes": dict(flood.outcomes),
        "rss_mib": {phase: (min(v), max(v)) for phase, v in rss.items() if v},
    }


def render_noisy(report: dict[str, object]) -> list[str]:
    baseline, flooded, ratios = report["baseline"], report["flood"], report["p99_ratio"]
    assert isinstance(baseline, dict) and isinstance(flooded, dict) and isinstance(ratios, dict)
    assert isinstance(report["flood_kinds"], list)
    kinds = "+".join(report["flood_kinds"])
    lines = [
        f"# Soak, noisy neighbour: {report['concurrency']} clients in "
        f"{report['quiet_namespaces']} namespaces, {report['duration_s']:g} s alone and "
        f"{report['duration_s']:g} s with {report['flood_concurrency']} flood callers "
        f"({kinds}, RetryInfo: {report['flood_retry']}) in one more namespace, "
        f"alternating in {report['rounds']} rounds, on {report['machine']}",
        "",
        f"{'RPC (quiet)':<18} {'OK':>6} {'p50 ms':>8} {'p99 ms':>8}   {'OK':>6} {'p50 ms':>8}"
        f" {'p99 ms':>8}  p99 x  errors (flood run)",
    ]
    for name, row in flooded.items():
        base = baseline.get(name, {})
        lines.append(
            f"{name:<18} {base.get('ok', 0):>6} {base.get('p50_ms', 0):>8.2f}"
            f" {base.get('p99_ms', 0):>8.2f}   {row['ok']:>6} {row['p50_ms']:>8.2f}"
            f" {row['p99_ms']:>8.2f}  {ratios.get(name, 0):>5.2f}  {row['errors'] or ''}"
        )
    lines += [
        "",
        f"flood outcomes: {report['flood_outcomes']}",
        f"server RSS (MiB, min-max): {report['rss_mib']}",
    ]
    return lines


def render(report: dict[str, object]) -> list[str]:
    rpcs = report["rpcs"]
    assert isinstance(rpcs, dict)
    lines = [
        f"# Soak: {report['concurrency']} clients for {report['duration_s']} s"
        f" on {report['machine']}",
        "",
        f"mix (weights): {report['mix']}",
        f"throughput {report['throughput_per_s']:.1f} RPC/s ({report['total_ok']} OK); "
        f"errors by code: {report['errors_by_code'] or 'none'}",
        "",
        f"{'RPC':<18} {'OK':>7} {'rate/s':>8} {'p50 ms':>9} {'p99 ms':>9}  errors",
    ]
    for name, row in rpcs.items():
        lines.append(
            f"{name:<18} {row['ok']:>7} {row['rate_per_s']:>8.1f} {row['p50_ms']:>9.2f}"
            f" {row['p99_ms']:>9.2f}  {row['errors'] or ''}"
        )
    samples = report["rss_mib"]
    assert isinstance(samples, list)
    lines += ["", "server RSS (MiB) over time: " + "  ".join(f"{t:g}s {v:.0f}" for t, v in samples)]
    if len(samples) >= 3:
        # Growth after the first third of the run (start-up allocations are settled by then).
        third = samples[len(samples) // 3]
        lines.append(
            f"RSS growth from {third[0]:g}s to the end: {samples[-1][1] - third[1]:+.1f} MiB"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    with postgres() as url:
        run = noisy if settings.noisy else soak
        report = asyncio.run(run(settings, new_database(url)))
    for line in (render_noisy if settings.noisy else render)(report):
        print(line, flush=True)
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
