"""LangGraph's own conformance suite for checkpointers (langgraph-checkpoint-conformance)
run against RunifoldSaver on a real all-in-one server: every base capability and the
extended ones (copy_thread, delete_for_runs, prune) pass; the report is printed into
the test log."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from runifold_client import AsyncClient
from runifold_client.langgraph import RunifoldSaver
from tests.support.stack import Stack


async def test_conformance_suite_passes(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"lg-{uuid.uuid4().hex[:10]}"

    async def saver_factory() -> AsyncGenerator[RunifoldSaver, None]:
        async with AsyncClient(stack.address, namespace=namespace) as client:
            yield RunifoldSaver(client=client)

    registered = checkpointer_test(name="RunifoldSaver")(saver_factory)
    report = await validate(registered, progress=ProgressCallbacks.verbose())
    with capsys.disabled():  # the report in `make test`'s log, passing or not
        report.print_report()
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    assert report.passed_all_base(), failures
    for capability in ("copy_thread", "delete_for_runs", "prune"):
        assert report.results[capability].passed is True, (capability, failures)
    assert report.passed_all(), failures
