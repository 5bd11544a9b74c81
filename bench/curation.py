"""Automatic curation benchmarks (issue 30).

Quality: a small labelled set of our own (bench/curation.py's CONVERSATIONS): people
state facts, change some later, take one back (a retraction), and chat with no facts.
Each conversation runs as turns with CURATION_MODE_AUTO against the all-in-one server in
its own process (the offline agent model), in a namespace of its own; once every job is
done, the memories are read back and scored against the labels:
- fact recall: of the facts the conversation holds at its end (the latest value of each,
  none retracted), the share an open memory states;
- junk rate: of the memories stored, the share whose every source is a turn with no fact
  (chit-chat);
- supersession correctness: of the facts that changed, the share where the latest value
  is open and no earlier value still is (the old memory closed);
- retracted leaks: open memories stating what a retracted turn said (goal: none);
- model calls and tokens per 100 turns (GetCurationBacklog's hourly counts).
With the offline proposer (the default) and with the OpenAI-compatible proposer against
a scripted fake model (tests/support/fake_openai.py, real HTTP): the fake is a perfect
reader of the set's phrasings, so its row measures the pipeline (sources, supersession,
retraction, duplicates) rather than a model.

Throughput: conversations of user entries are written through TranscriptService, then
one RequestCuration each while the memory processes (offline proposer) are up; the time
until the queue is empty, with 1 worker and with 2 (two processes of one worker).

Claim: one claim (the worker's statement) at 100 and 100,000 due jobs, in a transaction
rolled back so the depth stays put (goal: flat).

Turn latency: turns with AUTO and with OFF, interleaved rounds, against an all-in-one
server with no curation worker (the turn only asks for a job; the jobs' own work is the
throughput part's): the added p50 (goal: under 1 ms).

`python -m bench curation` runs it all; `curation-quality`, `curation-throughput`,
`curation-claim` and `curation-latency` one part. Sizes are small (the whole suite runs
in a few minutes on 2 cores); no threshold is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg

from bench.common import Stats, new_database, seed_conversation, server_process
from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import user
from services.common import migrations, stubs
from services.common.postgres.pool import Database
from services.common.settings import Settings
from services.memory.component import MIGRATIONS
from services.memory.curation.statements import CLAIM
from services.memory.proposals.prompt import SYSTEM_PROMPT
from tests.support.fake_openai import FakeReply, fake_openai

# -- the labelled set ----------------------------------------------------------------


@dataclass(frozen=True)
class Said:
    """One user turn: a fact (topic, value) or chit-chat (topic None); `retract` takes
    back the user entry of the turn with that index (0-based) of the conversation."""

    text: str
    topic: str | None = None
    value: str = ""
    retract: int | None = None


CONVERSATIONS: list[list[Said]] = [
    [
        Said("Hello there!"),
        Said("I live in Berlin.", "residence", "Berlin"),
        Said("Can you tell me a joke?"),
        Said("I work at Acme.", "employer", "Acme"),
        Said("Thanks, that was helpful."),
        Said("I moved to Lisbon last month.", "residence", "Lisbon"),
    ],
    [
        Said("My favourite drink is green tea.", "drink", "green tea"),
        Said("How are you today?"),
        Said("My dog is called Rex.", "dog", "Rex"),
        Said("What time is it in Tokyo?"),
        Said("My favourite drink is coffee now.", "drink", "coffee"),
    ],
    [
        Said("My name is Ana.", "name", "Ana"),
        Said("I speak Portuguese.", "language", "Portuguese"),
        Said("Nice weather today, isn't it?"),
        Said("I work at Globex.", "employer", "Globex"),
        Said("Sorry, ignore that.", retract=3),
        Said("Could you summarise our chat?"),
    ],
    [
        Said("Good morning!"),
        Said("Tell me something interesting."),
        Said("That is funny."),
        Said("See you later."),
    ],
    [
        Said("I live in Oslo.", "residence", "Oslo"),
        Said("My favourite drink is water.", "drink", "water"),
        Said("I live in Oslo.", "residence", "Oslo"),
        Said("I moved to Bergen.", "residence", "Bergen"),
        Said("I work at Initech.", "employer", "Initech"),
        Said("I now work at Hooli.", "employer", "Hooli"),
        Said("What should I cook tonight?"),
    ],
]
TURNS = sum(len(c) for c in CONVERSATIONS)


@dataclass
class Score:
    expected: int = 0
    recalled: int = 0
    memories: int = 0
    junk: int = 0
    changed: int = 0
    superseded_right: int = 0
    leaks: int = 0
    model_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _mentions(content: str, value: str) -> bool:
    return re.search(rf"\b{re.escape(value)}\b", content, re.IGNORECASE) is not None


def _score(conversation: list[Said], listed: list[memory_pb.Memory], now: float, s: Score) -> None:
    retracted = {said.retract for said in conversation if said.retract is not None}
    latest: dict[str, str] = {}
    history: dict[str, list[str]] = {}
    leaked: list[str] = []
    for k, said in enumerate(conversation):
        if said.topic is None:
            continue
        if k in retracted:
            leaked.append(said.value)
            continue
        latest[said.topic] = said.value
        if said.value not in history.setdefault(said.topic, []):
            history[said.topic].append(said.value)
    # The user entry of turn k is sequence 2k + 1 (each turn: the input, the answer).
    chit_chat = {2 * k + 1 for k, said in enumerate(conversation) if said.topic is None}
    open_now = [
        m.content
        for m in listed
        if not m.HasField("valid_until_time") or m.valid_until_time.ToSeconds() > now
    ]
    s.expected += len(latest)
    s.recalled += sum(any(_mentions(c, v) for c in open_now) for v in latest.values())
    s.memories += len(listed)
    s.junk += sum(
        all(
            set(range(src.from_sequence, src.through_sequence + 1)) <= chit_chat
            for src in m.sources
        )
        for m in listed
    )
    for values in history.values():
        if len(values) < 2:
            continue
        s.changed += 1
        fresh = any(_mentions(c, values[-1]) for c in open_now)
        stale = any(_mentions(c, old) for c in open_now for old in values[:-1])
        s.superseded_right += fresh and not stale
        if not (fresh and not stale):
            s.notes.append(f"{values[-1]!r} {'open' if fresh else 'missing'}, older still open")
    s.leaks += sum(any(_mentions(c, v) for c in open_now) for v in leaked)


# -- the scripted model ----------------------------------------------------------------

_ENTRY = re.compile(r'<entry sequence="(\d+)" role="user"[^>]*>([^<]*)</entry>')
_MEMORY = re.compile(r'<memory id="(m\d+)"[^>]*>([^<]*)</memory>')
_RULES = [
    (re.compile(r"(?:live in|moved to) ([A-Z]\w+)"), "The user lives in {}."),
    (re.compile(r"work at ([A-Z]\w+)"), "The user works at {}."),
    (
        re.compile(r"favourite drink is ([a-z ]+?)(?: now)?[.!]"),
        "The user's favourite drink is {}.",
    ),
    (re.compile(r"dog is called ([A-Z]\w+)"), "The user's dog is called {}."),
    (re.compile(r"name is ([A-Z]\w+)"), "The user's name is {}."),
    (re.compile(r"speak ([A-Z]\w+)"), "The user speaks {}."),
]


def _scripted(body: Any) -> FakeReply:
    """A perfect reader of the set's phrasings: ADD a new fact, SUPERSEDE a shown memory
    of the same topic (its content up to the value), DUPLICATE one that says it already."""
    assert body["messages"][0]["content"] == SYSTEM_PROMPT
    read = body["messages"][-1]["content"]
    shown = _MEMORY.findall(read)
    # A careful reader: of several statements of one topic in the entries read, the
    # latest is the fact (the earlier ones were never true at the end of the batch).
    latest: dict[str, tuple[str, str]] = {}
    for sequence, text in _ENTRY.findall(read):
        for pattern, template in _RULES:
            match = pattern.search(text)
            if match is not None:
                latest[template.split("{}")[0]] = (sequence, text)
    proposals = []
    for sequence, text in latest.values():
        for pattern, template in _RULES:
            match = pattern.search(text)
            if match is None:
                continue
            fact = template.format(match[1])
            topic = template.split("{}")[0]
            same = next((a for a, c in shown if c == fact), None)
            older = next((a for a, c in shown if c.startswith(topic) and c != fact), None)
            action, related = (
                ("DUPLICATE", same) if same else ("SUPERSEDE", older) if older else ("ADD", None)
            )
            proposals.append(
                {
                    "content": fact,
                    "sources": [
                        {"from_sequence": int(sequence), "through_sequence": int(sequence)}
                    ],
                    "valid_from_time": None,
                    "action": action,
                    "related_memory": related,
                    "reason": "the user stated it",
                }
            )
    return FakeReply(text=json.dumps({"proposals": proposals}))


# -- the all-in-one server ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def _all_in_one(url: str, env: dict[str, str]) -> AsyncIterator[grpc.aio.Channel]:
    with tempfile.TemporaryDirectory(prefix="runifold-bench-curation-") as data:
        base = {
            "RUNIFOLD_DATA_DIR": data,
            "RUNIFOLD_SUMMARY_WORKERS": "0",
            "RUNIFOLD_AGENT_MODEL_URL": "offline",
            "RUNIFOLD_CURATION": "auto",
            "RUNIFOLD_CURATION_POLL_INTERVAL_S": "0.05",
            "RUNIFOLD_CURATION_JOB_BACKOFF_S": "0.1",
        }
        async with (
            server_process("services", url, {**base, **env}) as address,
            grpc.aio.insecure_channel(address) as channel,
        ):
            yield channel


async def _settled(channel: grpc.aio.Channel, namespaces: list[str], cids: list[str]) -> None:
    """Until every conversation is curated through its last entry and no job waits."""
    transcript, memory = stubs.transcript(channel), stubs.memory(channel)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done = True
        for namespace, cid in zip(namespaces, cids, strict=True):
            got = await transcript.GetConversation(
                transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
            )
            backlog = await memory.GetCurationBacklog(
                memory_pb.GetCurationBacklogRequest(namespace=namespace)
            )
            c = got.conversation
            if c.curated_through < c.last_sequence or backlog.depth:
                done = False
                break
        if done:
            return
        await asyncio.sleep(0.05)  # progress poll of a background queue
    raise RuntimeError("curation did not settle in 300 s")


async def _quality_run(url: str, label: str, env: dict[str, str]) -> Score:
    score = Score()
    run = uuid.uuid4().hex[:6]
    async with _all_in_one(new_database(url), env) as channel:
        agent, transcript = stubs.agent(channel), stubs.transcript(channel)
        memory = stubs.memory(channel)
        namespaces, cids = [], []
        started = time.perf_counter()
        for k, conversation in enumerate(CONVERSATIONS):
            namespace = f"bench-curation-{label}-{run}-{k}"
            cid = str(uuid.uuid4())
            for said in conversation:
                reply = await agent.RunConversation(
                    agent_pb.RunConversationRequest(
                        namespace=namespace,
                        conversation_id=cid,
                        input=[user(said.text)],
                        create_if_missing=True,
                        policy=agent_pb.ContextPolicy(curation=agent_pb.CURATION_MODE_AUTO),
                    )
                )
                if said.retract is not None:
                    await transcript.AppendEntries(
                        transcript_pb.AppendEntriesRequest(
                            namespace=namespace,
                            conversation_id=cid,
                            expected_version=reply.conversation_version,
                            retract_sequences=[2 * said.retract + 1],
                        )
                    )
                    await memory.RequestCuration(
                        memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=cid)
                    )
            namespaces.append(namespace)
            cids.append(cid)
        await _settled(channel, namespaces, cids)
        score.seconds = time.perf_counter() - started
        now = time.time()
        for namespace, conversation in zip(namespaces, CONVERSATIONS, strict=True):
            listed = await memory.ListMemories(
                memory_pb.ListMemoriesRequest(
                    namespace=namespace, ignore_validity=True, page_size=1000
                )
            )
            _score(conversation, list(listed.memories), now, score)
            backlog = await memory.GetCurationBacklog(
                memory_pb.GetCurationBacklogRequest(namespace=namespace)
            )
            score.model_calls += backlog.model_calls_this_hour
            score.tokens += backlog.tokens_this_hour
    return score


def _quality_row(label: str, s: Score) -> str:
    def share(a: int, b: int) -> str:
        return f"{a}/{b} ({a / b:.0%})" if b else "-"

    return (
        f"{label:<34} recall {share(s.recalled, s.expected):<13} "
        f"junk {share(s.junk, s.memories):<12} "
        f"supersession {share(s.superseded_right, s.changed):<12} "
        f"retracted leaks {s.leaks}  "
        f"per 100 turns: {100 * s.model_calls / TURNS:.0f} calls, "
        f"{100 * s.tokens / TURNS:,.0f} tokens"
    )


async def quality(postgres_url: str) -> list[str]:
    facts = sum(1 for c in CONVERSATIONS for s in c if s.topic)
    lines = [
        "## Automatic curation quality (labelled set, AUTO turns, all-in-one server)",
        "",
        f"{len(CONVERSATIONS)} conversations, {TURNS} turns ({facts} stating a fact, "
        f"{TURNS - facts} chit-chat or a retraction)",
    ]
    offline = await _quality_run(postgres_url, "offline", {"RUNIFOLD_CURATOR_MODEL_URL": "offline"})
    lines.append(_quality_row("offline proposer", offline))
    lines += [f"  not superseded: {note}" for note in offline.notes]
    async with fake_openai() as model:
        model.respond_with(_scripted)
        scripted = await _quality_run(
            postgres_url,
            "model",
            {
                "RUNIFOLD_CURATOR_MODEL_URL": model.base_url,
                "RUNIFOLD_CURATOR_MODEL_MAX_RETRIES": "0",
            },
        )
    lines.append(_quality_row("OpenAI-compatible (scripted fake)", scripted))
    lines += [f"  not superseded: {note}" for note in scripted.notes]
    return lines


# -- throughput ------------------------------------------------------------------------

THROUGHPUT_CONVERSATIONS = 40
THROUGHPUT_ENTRIES = 8
_THROUGHPUT_TEXTS = [
    "I live in Town{k}.",
    "Hello again.",
    "I work at Company{k}.",
    "What is the time?",
    "My favourite drink is tea number {k}.",
    "Thanks.",
    "My dog is called Dog{k}.",
    "Bye for now.",
]


async def _drain(url: str, transcript: str, processes: int, cids: list[str]) -> tuple[float, int]:
    env = {
        "TRANSCRIPT_SERVICE_ADDR": transcript,
        "RUNIFOLD_CURATOR_MODEL_URL": "offline",
        "RUNIFOLD_CURATION_WORKERS": "1",
        "RUNIFOLD_CURATION_POLL_INTERVAL_S": "0.02",
        "RUNIFOLD_MEMORY_INDEX": "pgvector",
        "RUNIFOLD_DB_POOL_MIN": "2",
    }
    # A namespace per conversation: without a user, a namespace's memory is one
    # person's, and one conversation's facts would supersede another's.
    prefix = f"bench-curation-throughput-{uuid.uuid4().hex[:6]}"
    async with contextlib.AsyncExitStack() as stack:
        addresses = [
            await stack.enter_async_context(server_process("services.memory", url, env))
            for _ in range(processes)
        ]
        async with grpc.aio.insecure_channel(transcript) as channel:
            stub = stubs.transcript(channel)
            mine = []
            for k in range(len(cids)):
                texts = [t.format(k=k) for t in _THROUGHPUT_TEXTS]
                namespace = f"{prefix}-{k}"
                mine.append((namespace, await seed_conversation(stub, namespace, texts)))
        async with (
            grpc.aio.insecure_channel(addresses[0]) as channel,
            await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        ):
            memory = stubs.memory(channel)
            start = time.perf_counter()
            for first in range(0, len(mine), 8):
                await asyncio.gather(
                    *(
                        memory.RequestCuration(
                            memory_pb.RequestCurationRequest(namespace=ns, conversation_id=c)
                        )
                        for ns, c in mine[first : first + 8]
                    )
                )
            while True:
                cursor = await conn.execute(
                    "SELECT count(*) FROM memory.curation_jobs"
                    " WHERE state IN ('pending', 'running') AND namespace LIKE %s",
                    (prefix + "-%",),
                )
                row = await cursor.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.01)  # progress poll of a background queue
            elapsed = time.perf_counter() - start
            cursor = await conn.execute(
                "SELECT count(*) FROM memory.memories WHERE namespace LIKE %s", (prefix + "-%",)
            )
            row = await cursor.fetchone()
            return elapsed, int(row[0]) if row else 0


async def throughput(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    entries = THROUGHPUT_CONVERSATIONS * THROUGHPUT_ENTRIES
    lines = [
        "## Automatic curation throughput (offline proposer, pgvector index)",
        "",
        f"{THROUGHPUT_CONVERSATIONS} jobs of {THROUGHPUT_ENTRIES} user entries each "
        f"({entries} entries), requested at once; memory processes up and idle first",
    ]
    cids = [""] * THROUGHPUT_CONVERSATIONS
    rates = {}
    async with server_process("services.transcript", url) as transcript:
        for label, processes in (("1 worker", 1), ("2 workers (2 processes)", 2)):
            elapsed, facts = await _drain(url, transcript, processes, cids)
            rates[label] = entries / elapsed
            lines.append(
                f"{label:<26} {rates[label]:>8.1f} entries/s  "
                f"{THROUGHPUT_CONVERSATIONS / elapsed:>6.1f} jobs/s  "
                f"({facts} facts, {elapsed:.2f} s)"
            )
    one, two = rates.values()
    lines.append(f"ratio 2 workers / 1 worker: {two / one:.2f}")
    return lines


# -- claim cost ------------------------------------------------------------------------

CLAIM_DEPTHS = (100, 100_000)
CLAIMS = 300


async def claim_cost(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    db = Database(url, Settings.from_env({"RUNIFOLD_METRICS_LISTEN": "off"}))
    await db.open()
    lines = ["## Curation job claim by queue depth", ""]
    p50: dict[int, float] = {}
    try:
        await migrations.migrate(db, "memory", MIGRATIONS)
        for depth in CLAIM_DEPTHS:
            # Filled outside the pool: 100,000 rows take longer than its statement timeout.
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute("TRUNCATE memory.curation_jobs")
                await conn.execute(
                    """INSERT INTO memory.curation_jobs
                              (job_id, namespace, conversation_id, incarnation, state,
                               finish_time)
                       SELECT gen_random_uuid(), 'bench', gen_random_uuid(), 1, 'done', now()
                         FROM generate_series(1, 1000)"""
                )
                await conn.execute(
                    """INSERT INTO memory.curation_jobs
                              (job_id, namespace, conversation_id, incarnation, fair_time)
                       SELECT gen_random_uuid(), 'bench-' || (s %% 10), gen_random_uuid(), 1,
                              now() - make_interval(secs => 3600 + s)
                         FROM generate_series(1, %s) AS s""",
                    (depth,),
                )
                await conn.execute("ANALYZE memory.curation_jobs")
            latencies = []
            for _ in range(CLAIMS):
                async with db.connection() as conn, conn.transaction():
                    t0 = time.perf_counter()
                    cursor = await conn.execute(
                        CLAIM,
                        {"lease_token": uuid.uuid4(), "lease_s": 30.0, "worker": "bench"},
                    )
                    row = await cursor.fetchone()
                    latencies.append(time.perf_counter() - t0)
                    if row is None:
                        raise RuntimeError("the queue ran dry")
                    raise psycopg.Rollback()  # the depth stays put
            stats = Stats(f"claim at {depth:,} pending jobs", latencies, sum(latencies))
            p50[depth] = stats.p50
            lines.append(stats.row())
    finally:
        await db.close()
    low, high = CLAIM_DEPTHS
    lines.append(
        f"claim p50 at {high:,} / at {low:,} pending jobs: {p50[high] / p50[low]:.2f}"
        " (goal: flat, about 1)"
    )
    return lines


# -- the added latency of a turn --------------------------------------------------------

LATENCY_ROUNDS = 3
LATENCY_TURNS = 100


async def latency(postgres_url: str) -> list[str]:
    lines = [
        "## A turn with CURATION_MODE_AUTO (all-in-one, offline model, no curation worker)",
        "",
    ]
    timed: dict[int, list[float]] = {
        agent_pb.CURATION_MODE_OFF: [],
        agent_pb.CURATION_MODE_AUTO: [],
    }
    env = {
        "RUNIFOLD_CURATION_WORKERS": "0",
        "RUNIFOLD_CURATION_MAX_PENDING_PER_NAMESPACE": "100000",
    }
    async with _all_in_one(new_database(postgres_url), env) as channel:
        agent = stubs.agent(channel)

        async def one(mode: int, cid: str) -> float:
            started = time.perf_counter()
            await agent.RunConversation(
                agent_pb.RunConversationRequest(
                    namespace="bench-curation-latency",
                    conversation_id=cid,
                    input=[user("I live in Berlin.")],
                    create_if_missing=True,
                    policy=agent_pb.ContextPolicy(window=16, curation=mode),  # type: ignore[arg-type]
                )
            )
            return time.perf_counter() - started

        for round_ in range(LATENCY_ROUNDS + 1):  # the first round warms up
            for mode in timed:
                cid = str(uuid.uuid4())  # a conversation per mode and round: 7 turns each
                for i in range(LATENCY_TURNS):
                    if i % 7 == 0:
                        cid = str(uuid.uuid4())
                    took = await one(mode, cid)
                    if round_:
                        timed[mode].append(took)
    off = Stats("RunConversation, curation OFF", timed[agent_pb.CURATION_MODE_OFF], 1.0)
    auto = Stats("RunConversation, curation AUTO", timed[agent_pb.CURATION_MODE_AUTO], 1.0)
    for stats in (off, auto):
        lines.append(
            f"{stats.name:<46} p50 {stats.p50:>7.2f} ms  p99 {stats.pct(0.99):>7.2f} ms"
            f"  n={len(stats.latencies)}"
        )
    lines.append(f"added by AUTO at p50: {auto.p50 - off.p50:.2f} ms (goal: under 1 ms)")
    return lines


async def run(postgres_url: str) -> list[str]:
    lines: list[str] = []
    for part in (quality, throughput, claim_cost, latency):
        if lines:
            lines.append("")
        lines += await part(postgres_url)
    return lines
