"""One campaign: the cluster up, the clients and the nemesis for a while, everything
healed, the final state read, the checker's report.

`python -m chaos` (`make chaos`; `CHAOS_MINUTES`, `CHAOS_SEED`, `--failover` for a
primary with a synchronous standby that the nemesis fails over once). The history of a
campaign with a violation is kept (JSON Lines) beside the services' logs; the folder is
printed.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg

from chaos.checker import FinalEntry, FinalState, Report, check
from chaos.cluster import Cluster, temporary_folder
from chaos.history import History, parse_token
from chaos.nemesis import Nemesis
from chaos.workload import NAMESPACES, Endpoints, Workload, clients, conversation_ids
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from tests.support.fake_openai import FakeOpenAI, FakeReply


@dataclass
class Outcome:
    report: Report
    folder: Path
    lines: list[str] = field(default_factory=list)


class CountingModel:
    """The fake model's answers: each turn's reply is the token of its place (index 1),
    and its calls are counted by the turn's operation (its input token)."""

    def __init__(self, model: FakeOpenAI, rng_seed: int) -> None:
        self.calls: Counter[int] = Counter()
        self._seed = rng_seed
        model.respond_with(self.respond)

    async def respond(self, body: Any) -> FakeReply:
        messages = body.get("messages", []) if isinstance(body, dict) else []
        text = str(messages[-1].get("content", "")) if messages else ""
        parsed = parse_token(text)
        if parsed is None:
            return FakeReply(text="noted")
        namespace, cid, op_id, _ = parsed
        self.calls[op_id] += 1
        # Hold some calls a little, to widen the races.
        await asyncio.sleep((op_id * 7919 % 10) / 50)  # 0-180 ms, fixed per op
        return FakeReply(text=f"chaos|{namespace}|{cid}|{op_id}|1", usage=(20, 5))


async def run(
    minutes: float,
    seed: int,
    *,
    failover: bool = False,
    workers: int = 6,
    watchers: int = 3,
    keep: bool = False,
) -> Outcome:
    folder = temporary_folder()
    history = History()
    lines: list[str] = []
    model = FakeOpenAI(embedding_dim=8)
    await model.start()
    counting = CountingModel(model, seed)
    cluster = Cluster(folder, model.base_url, failover=failover)
    kept = keep
    try:
        started = time.monotonic()
        await cluster.start()
        lines.append(f"cluster up in {time.monotonic() - started:.1f} s ({folder})")
        endpoints = Endpoints(
            transcript=[cluster.address("transcript-1"), cluster.address("transcript-2")],
            memory=[cluster.address("memory-1"), cluster.address("memory-2")],
            summary=cluster.address("summary"),
            agent=[cluster.address("agent-1"), cluster.address("agent-2")],
        )
        async with clients(endpoints) as made:
            workload = Workload(made, history, seed)
            await workload.create_all()
            nemesis = Nemesis(
                cluster, history, seed, interval_s=min(15.0, max(4.0, minutes * 60 / 14))
            )
            tasks = [asyncio.create_task(workload.worker(i)) for i in range(workers)]
            tasks += [asyncio.create_task(workload.watcher(i)) for i in range(watchers)]
            chaos = asyncio.create_task(nemesis.run())
            await asyncio.sleep(minutes * 60)  # the campaign's duration
            nemesis.stop.set()
            await chaos
            await nemesis.heal_all()
            workload.stop.set()
            await asyncio.gather(*tasks)
            if nemesis.failover_at is not None:
                # The first append sent after the primary died and acknowledged.
                died = nemesis.failover_at
                after = [end for start, end in workload.ok_times if start > died]
                rto = min(after) - died if after else float("nan")
                acknowledged = sum(
                    1 for op in history.ops if op.kind == "append" and op.outcome == "ok"
                )
                lines.append(
                    f"failover: {acknowledged} appends acknowledged in all; the first one sent "
                    f"after the primary died was acknowledged {rto:.2f} s after its death"
                )
            final = await collect(cluster, made.transcript, made.memory, counting)
        report = check(history.ops, history.faults, final)
        lines += report.lines()
        kept = kept or bool(report.violations)
        if kept:
            history.dump(folder / "history.jsonl")
            lines.append(f"history and logs kept in {folder}")
        return Outcome(report, folder, lines)
    except BaseException:
        kept = True  # a campaign that broke: its logs say why
        lines.append(f"logs kept in {folder}")
        raise
    finally:
        await cluster.close()
        await model.close()
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)


async def collect(
    cluster: Cluster, transcript: Any, memory: Any, counting: CountingModel
) -> FinalState:
    """What the stores hold at the end: every conversation's entries, the live memories,
    and the rows and index points that name what an erasure took."""
    import random

    rng = random.Random(0)
    final = FinalState(model_calls=counting.calls)
    for namespace in NAMESPACES:
        for cid in conversation_ids(namespace):
            stub = transcript(rng)
            try:
                got = await stub.GetConversation(
                    pb.GetConversationRequest(namespace=namespace, conversation_id=cid), timeout=30
                )
            except grpc.aio.AioRpcError:  # gone (erased last): nothing to read
                continue
            entries: list[FinalEntry] = []
            token = ""
            while True:
                page = await stub.ListEntries(
                    pb.ListEntriesRequest(
                        namespace=namespace, conversation_id=cid, page_size=500, page_token=token
                    ),
                    timeout=30,
                )
                entries += [
                    FinalEntry(e.sequence, e.message.text, bool(e.retracted_version))
                    for e in page.entries
                ]
                token = page.next_page_token
                if not token:
                    break
            final.entries[(namespace, cid)] = entries
            final.incarnations[(namespace, cid)] = got.conversation.incarnation
        token = ""
        while True:
            page = await memory(rng).ListMemories(
                memory_pb.ListMemoriesRequest(namespace=namespace, page_size=100, page_token=token),
                timeout=30,
            )
            for m in page.memories:
                final.memories[(namespace, m.memory_id)] = (
                    m.content,
                    [s.conversation_id for s in m.sources],
                )
            token = page.next_page_token
            if not token:
                break
    async with await psycopg.AsyncConnection.connect(cluster.direct_url, autocommit=True) as conn:
        final.stale_rows = await _stale_rows(conn)
        await _outbox_drained(conn)
        final.stale_points = await _stale_points(conn)
    return final


async def _stale_rows(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    found = []
    for table in ("summary.summaries", "summary.summary_history", "summary.jobs"):
        cursor = await conn.execute(
            f"""SELECT s.namespace, s.conversation_id::text, s.incarnation
                  FROM {table} AS s
                  LEFT JOIN transcript.conversations AS c
                         ON c.namespace = s.namespace AND c.conversation_id = s.conversation_id
                 WHERE c.incarnation IS DISTINCT FROM s.incarnation"""
        )
        for namespace, cid, incarnation in await cursor.fetchall():
            found.append(f"{table} holds incarnation {incarnation} of {namespace}/{cid}, erased")
    return found


async def _outbox_drained(conn: psycopg.AsyncConnection[Any], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cursor = await conn.execute("SELECT count(*) FROM memory.outbox")
        row = await cursor.fetchone()
        if row is not None and row[0] == 0:
            return
        await asyncio.sleep(0.5)  # the indexers drain it
    raise AssertionError("the memory outbox did not drain")


async def _stale_points(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cursor = await conn.execute(
        """SELECT table_name FROM information_schema.columns
            WHERE table_schema = 'memory' AND column_name = 'point_id'"""
    )
    found = []
    for (table,) in await cursor.fetchall():
        points = await conn.execute(
            f"""SELECT p.namespace, p.memory_id::text FROM memory."{table}" AS p
                 WHERE p.deleted_at IS NULL AND p.namespace <> ''
                   AND NOT EXISTS (SELECT 1 FROM memory.memories AS m
                                    WHERE m.namespace = p.namespace
                                      AND m.memory_id = p.memory_id)"""
        )
        found += [f"{namespace}/{memory_id}" for namespace, memory_id in await points.fetchall()]
    return found
