"""/metrics of real service processes after a workload, read over HTTP.

TranscriptService runs as `python -m services.transcript` with its metrics
endpoint on an ephemeral port. A workload with version conflicts (ABORTED)
must move exactly the counters it should, every metric of the floor
(services/common/metrics.py) and of services/transcript/metrics.py must be
exported with bounded labels only, and `promtool check metrics` must accept the
real output. SummaryService runs as its own process for the backlog (and
exports the floor's, its own and the model calls' metrics), and the all-in-one
process (`python -m services`) for agent turns racing on one conversation (and
exports every metrics module's). Each service's entry module, imported alone,
registers the metrics its process serves.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.ops.promql import metric_objects
from tests.support.grpc_calls import user
from tests.support.process import ServiceProcess, service_process, value
from tests.support.tools import ROOT, check_metrics, run
from tests.support.waiting import wait_for

TRANSCRIPT = "runifold.transcript.v1.TranscriptService"
AGENT = "runifold.agent.v1.AgentService"
CONFLICTS = 5
TURNS = 6

# Every label a metric may carry: each has a small, fixed set of values.
BOUNDED_LABELS = {
    "grpc_type",
    "grpc_service",
    "grpc_method",
    "grpc_code",
    "store",
    "reason",
    "outcome",
    "purpose",
    "provider",
    "direction",
    "runifold_service",  # transcript, summary, memory, agent
    "resource",  # search, turn, summarize, upsert, propose, embeddings, model, watchers
    "cause",  # cancelled, deadline
    "event",  # appended, retracted, turn_started, turn_finished, heartbeat, erased
    "le",  # histogram buckets
    # prometheus_client's process and Python collectors
    "generation",
    "implementation",
    "major",
    "minor",
    "patchlevel",
    "version",
}


# The metrics modules whose metrics each service's process serves (the floor's in every
# one); the all-in-one process serves every module's.
SERVED = {
    "transcript": ("common", "transcript"),
    "summary": ("common", "summary", "llm"),
    "memory": ("common", "memory", "llm"),
    "agent": ("common", "agent", "llm"),
}


def defined_metrics(*packages: str) -> dict[str, Counter | Gauge | Histogram]:
    """The metric objects of the metrics modules of `packages` (every one when none), by
    exposition name."""
    found = {}
    for attribute in metric_objects(*packages):
        for family in attribute.describe():
            found[family.name] = attribute
    return found


def assert_exported(exposition: str, *packages: str) -> None:
    """Every metric of the metrics modules of `packages` is in the exposition."""
    families = {family.name for family in text_string_to_metric_families(exposition)}
    for name in defined_metrics(*packages):
        assert name in families, f"{name} is defined in a metrics module but not exported"


@pytest.mark.parametrize("service", sorted(SERVED))
def test_each_service_registers_the_metrics_it_serves(service: str) -> None:
    # A fresh interpreter imports what `python -m services.<service>` runs, as it does.
    listing = (
        "import importlib, sys; from prometheus_client import REGISTRY; "
        "importlib.import_module(sys.argv[1]); "
        "print('\\n'.join(m.name for m in REGISTRY.collect()))"
    )
    listed = run(sys.executable, "-c", listing, f"services.{service}.__main__", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    registered = set(listed.stdout.split())
    missing = set(defined_metrics(*SERVED[service])) - registered
    assert not missing, f"python -m services.{service} does not register {missing}"


@pytest.fixture
async def transcript_process(
    shared_database_url: str, tmp_path: Path
) -> AsyncIterator[ServiceProcess]:
    env = {"DATABASE_URL": shared_database_url, "RUNIFOLD_MIGRATE": "check"}
    async with service_process("services.transcript", env, tmp_path) as running:
        yield running
    assert running.process.returncode == 0, "".join(running.output)  # graceful SIGTERM


async def test_conflicts_move_the_counters_and_promtool_accepts_the_output(
    transcript_process: ServiceProcess, namespace: str
) -> None:
    before = await transcript_process.scrape()
    async with grpc.aio.insecure_channel(transcript_process.address) as channel:
        stub = stubs.transcript(channel)
        created = await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        cid = created.conversation.conversation_id
        await stub.AppendEntries(
            pb.AppendEntriesRequest(
                conversation_id=cid, namespace=namespace, expected_version=0, messages=[user("a")]
            )
        )
        for i in range(CONFLICTS):
            with pytest.raises(grpc.aio.AioRpcError) as stale:
                await stub.AppendEntries(
                    pb.AppendEntriesRequest(
                        conversation_id=cid,
                        namespace=namespace,
                        expected_version=0,
                        messages=[user(f"late writer {i}")],
                    )
                )
            assert stale.value.code() == grpc.StatusCode.ABORTED
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetConversation(
                pb.GetConversationRequest(conversation_id=str(uuid.uuid4()), namespace=namespace)
            )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    after = await transcript_process.scrape()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    append = {"grpc_service": TRANSCRIPT, "grpc_method": "AppendEntries", "grpc_type": "unary"}
    assert moved("grpc_server_handled_total", **append, grpc_code="ABORTED") == CONFLICTS
    assert moved("grpc_server_handled_total", **append, grpc_code="OK") == 1
    assert moved("grpc_server_started_total", **append) == CONFLICTS + 1
    assert moved("grpc_server_handling_seconds_count", **append) == CONFLICTS + 1
    assert moved("runifold_append_conflicts_total") == CONFLICTS
    assert (
        moved(
            "grpc_server_handled_total",
            grpc_service=TRANSCRIPT,
            grpc_method="GetConversation",
            grpc_code="NOT_FOUND",
        )
        == 1
    )
    assert moved("runifold_store_errors_total") == 0

    # Every metric of the floor and of TranscriptService is exported, bounded labels only.
    assert_exported(after, *SERVED["transcript"])
    for family in text_string_to_metric_families(after):
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS, (sample.name, sample.labels)
            for label_value in sample.labels.values():
                assert namespace not in label_value and cid not in label_value

    check_metrics(after)


async def test_health_probe_command(transcript_process: ServiceProcess) -> None:
    def probe(*args: str) -> int:
        command = [sys.executable, "-m", "services.healthcheck", transcript_process.address]
        return run(*command, *args, cwd=ROOT).returncode

    assert probe("--service", TRANSCRIPT) == 0
    assert probe() == 0
    assert probe("--service", "runifold.no.such.Service") == 1


@pytest.mark.skipif(
    not (ROOT / "services" / "summary" / "__main__.py").exists(),
    reason="SummaryService has no entry point yet (python -m services.summary)",
)
async def test_summary_backlog_reaches_metrics(
    transcript_process: ServiceProcess,
    shared_database_url: str,
    tmp_path: Path,
    namespace: str,
) -> None:
    env = {
        "DATABASE_URL": shared_database_url,
        "RUNIFOLD_MIGRATE": "auto",
        "TRANSCRIPT_SERVICE_ADDR": transcript_process.address,
    }
    async with service_process("services.summary", env, tmp_path / "summary") as summary:
        before = await summary.scrape()
        async with (
            grpc.aio.insecure_channel(transcript_process.address) as tch,
            grpc.aio.insecure_channel(summary.address) as sch,
        ):
            transcript = stubs.transcript(tch)
            created = await transcript.CreateConversation(
                pb.CreateConversationRequest(namespace=namespace)
            )
            cid = created.conversation.conversation_id
            await transcript.AppendEntries(
                pb.AppendEntriesRequest(
                    conversation_id=cid,
                    namespace=namespace,
                    expected_version=0,
                    messages=[user(f"entry {i}") for i in range(12)],
                )
            )
            await stubs.summary(sch).RequestSummary(
                summary_pb.RequestSummaryRequest(
                    conversation_id=cid, namespace=namespace, window=2, summary_batch=4
                )
            )

        # The job shows as backlog, or (when a worker was quicker) as completed.
        async def job_visible() -> bool:
            now = await summary.scrape()
            return value(now, "runifold_summary_jobs_depth") >= 1 or value(
                now, "runifold_summary_jobs_completed_total"
            ) > value(before, "runifold_summary_jobs_completed_total")

        await wait_for(job_visible, timeout=30)
        exposition = await summary.scrape()
        assert_exported(exposition, *SERVED["summary"])
        check_metrics(exposition)


async def test_all_in_one_serves_every_service_on_one_endpoint(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    """`python -m services`: racing turns, counted consistently on the one /metrics."""
    env = {"DATABASE_URL": shared_database_url, "RUNIFOLD_MIGRATE": "auto"}
    async with service_process("services", env, tmp_path, timeout=120) as allinone:
        before = await allinone.scrape()
        async with grpc.aio.insecure_channel(allinone.address) as channel:
            created = await stubs.transcript(channel).CreateConversation(
                pb.CreateConversationRequest(namespace=namespace)
            )
            cid = created.conversation.conversation_id
            agent = stubs.agent(channel)

            async def turn(i: int) -> grpc.StatusCode:
                try:
                    await agent.RunConversation(
                        agent_pb.RunConversationRequest(
                            conversation_id=cid,
                            namespace=namespace,
                            input=[user(f"question {i}")],
                            turn_id=str(uuid.uuid4()),
                        ),
                        timeout=60,
                    )
                except grpc.aio.AioRpcError as error:
                    return error.code()
                return grpc.StatusCode.OK

            codes = await asyncio.gather(*(turn(i) for i in range(TURNS)))
        after = await allinone.scrape()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    run_conversation = {"grpc_service": AGENT, "grpc_method": "RunConversation"}
    aborted = codes.count(grpc.StatusCode.ABORTED)
    assert codes.count(grpc.StatusCode.OK) + aborted == TURNS, codes
    assert moved("grpc_server_handled_total", **run_conversation) == TURNS
    assert moved("grpc_server_handled_total", **run_conversation, grpc_code="ABORTED") == aborted
    assert moved("runifold_turn_conflicts_total") == aborted
    assert moved("runifold_turns_total", outcome="conflict") == aborted
    assert moved("runifold_turns_total", outcome="committed") == TURNS - aborted
    # The agent's calls to TranscriptService went through the same server and endpoint.
    assert moved("grpc_server_handled_total", grpc_service=TRANSCRIPT, grpc_code="OK") > 0
    assert_exported(after)  # every metrics module's
    check_metrics(after)
