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

    python -m bench.soak --concurrency 16 --duration 600
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

from bench.common import new_database, postgres, seed_conversation, server
from bench.stats import median_ms, percentile_ms, rss_mib
from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import assistant, user
from services.common import stubs

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


@dataclass
class Settings:
    concurrency: int
    duration_s: float
    sample_s: float
    seed: int
    json_path: Path | None
    mix: dict[str, int]


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
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.sample_interval <= 0:
        parser.error("concurrency, duration and sample interval must be positive")
    mix = dict(MIX)
    for item in filter(None, args.mix.split(",")):
        kind, _, weight = item.partition("=")
        if kind not in MIX or not weight.isdigit():
            parser.error(f"--mix takes KIND=WEIGHT with KIND in {', '.join(MIX)}, got {item!r}")
        mix[kind] = int(weight)
    if not any(mix.values()):
        parser.error("--mix leaves nothing to run")
    return Settings(
        args.concurrency, args.duration, args.sample_interval, args.seed, args.json, mix
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


class Workload:
    def __init__(self, channel: grpc.aio.Channel, mix: dict[str, int]) -> None:
        self.transcript = stubs.transcript(channel)
        self.summary = stubs.summary(channel)
        self.memory = stubs.memory(channel)
        self.agent = stubs.agent(channel)
        self.records: dict[str, Record] = defaultdict(Record)
        self.facts_conversation = ""
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

    async def seed(self) -> None:
        self.facts_conversation = await seed_conversation(self.transcript, NAMESPACE, TOPICS)
        for i in range(len(TOPICS)):
            await self.upsert_fact(i)

    async def upsert_fact(self, i: int) -> object | None:
        topic = i % len(TOPICS)
        return await self.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=NAMESPACE,
                content=f"Note {i}: {TOPICS[topic]}.",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=self.facts_conversation,
                        from_sequence=topic + 1,
                        through_sequence=topic + 1,
                    )
                ],
            ),
            timeout=30,
        )

    async def client(self, index: int, seed: int) -> Client:
        conversations = []
        for _ in range(CONVERSATIONS_PER_CLIENT):
            created = await self.transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=NAMESPACE)
            )
            conversations.append(created.conversation.conversation_id)
        return Client(
            index, random.Random(seed + index), conversations, dict.fromkeys(conversations, 0)
        )

    async def step(self, client: Client, n: int) -> None:
        kind = client.rng.choices(self.kinds, weights=self.weights)[0]
        cid = client.rng.choice(client.conversations)
        topic = TOPICS[client.rng.randrange(len(TOPICS))]
        if kind == "turn":
            reply = await self.timed(
                "RunConversation",
                lambda: self.agent.RunConversation(
                    agent_pb.RunConversationRequest(
                        namespace=NAMESPACE,
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
                        namespace=NAMESPACE,
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
                    transcript_pb.GetConversationRequest(namespace=NAMESPACE, conversation_id=cid)
                )
                client.versions[cid] = got.conversation.version
        elif kind == "search":
            await self.timed(
                "SearchMemories",
                lambda: self.memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=NAMESPACE, query=f"when is {topic.split()[-1]}?", limit=5
                    ),
                    timeout=30,
                ),
            )
        elif kind == "upsert":
            await self.timed("UpsertMemory", lambda: self.upsert_fact(client.index * 100_000 + n))
        elif kind == "summarize":
            await self.timed(
                "Summarize",
                lambda: self.summary.Summarize(
                    summary_pb.SummarizeRequest(
                        namespace=NAMESPACE,
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
                        namespace=NAMESPACE, conversation_id=cid, window=16, summary_batch=32
                    ),
                    timeout=30,
                ),
            )
        else:
            await self.timed(
                "LoadView",
                lambda: self.transcript.LoadView(
                    transcript_pb.LoadViewRequest(
                        namespace=NAMESPACE, conversation_id=cid, window=16, summary_batch=32
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
        report = asyncio.run(soak(settings, new_database(url)))
    for line in render(report):
        print(line, flush=True)
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
