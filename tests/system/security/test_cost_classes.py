"""Every RPC declares its cost class (services/common/costs.py), on gRPC and on HTTP.

The test asks a real all-in-one server what it serves (server reflection for gRPC, and
a probe of every method's route on the HTTP port) and fails for a method that has no
cost class, or a cost class that names a method nobody serves: the next RPC cannot be
added without deciding its admission kind, its memory bound and how it waits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common import admission, costs
from services.common.settings import AdmissionLimits
from tests.support.stack import HTTP_ON, full_stack
from tests.support.tools import ROOT

WAITS = {"never", "queue", "lease", "stream"}


async def _served_by_reflection(channel: grpc.aio.Channel) -> set[str]:
    """Every method the server serves, as reflection lists it."""
    # The generated stub is typed for the blocking channel; on an aio channel it works alike.
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]

    async def ask(request: reflection_pb2.ServerReflectionRequest) -> Any:
        async for response in stub.ServerReflectionInfo(iter([request])):
            return response
        raise AssertionError("reflection answered nothing")

    listed = await ask(reflection_pb2.ServerReflectionRequest(list_services=""))
    methods = set()
    for service in listed.list_services_response.service:
        found = await ask(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=service.name)
        )
        for raw in found.file_descriptor_response.file_descriptor_proto:
            descriptor = descriptor_pb2.FileDescriptorProto.FromString(raw)
            for entry in descriptor.service:
                full = f"{descriptor.package}.{entry.name}" if descriptor.package else entry.name
                if full == service.name:
                    methods |= {f"/{full}/{method.name}" for method in entry.method}
    return methods


async def test_every_served_method_has_a_cost_class_and_every_cost_class_is_served(
    fresh_database_url: str, tmp_path: Path
) -> None:
    async with full_stack(fresh_database_url, tmp_path, None, http=HTTP_ON) as stack:
        served = await _served_by_reflection(stack.channel)
        runifold = {method for method in served if method.startswith("/runifold.")}
        assert len(runifold) >= 28, "reflection lists the services' methods"
        # gRPC: every method served has a cost class; every cost class names a method.
        undeclared = served - set(costs.COSTS)
        assert not undeclared, f"methods with no cost class: {sorted(undeclared)}"
        stale = set(costs.COSTS) - served
        assert not stale, f"cost classes of methods nobody serves: {sorted(stale)}"
        # HTTP: the port serves exactly the Runifold methods, each through its route.
        async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
            for method in sorted(runifold):
                answer = await http.post(method, json={})
                assert answer.status_code != 404, f"{method} is not served over HTTP"
            missing = await http.post("/runifold.transcript.v1.TranscriptService/Nothing", json={})
            assert missing.status_code == 404  # the probe tells a route from no route


def test_each_cost_class_is_complete_and_its_kind_has_a_limit() -> None:
    limits = AdmissionLimits()
    for method, cost in costs.COSTS.items():
        assert cost.waits in WAITS, method
        assert cost.why and cost.memory, f"{method}: say why and what it may hold"
        if cost.admission != "exempt":
            assert limits.limit(cost.admission) > 0, f"{method}: a kind with no limit"
    assert costs.admission_kinds() == admission.KINDS
    # The waiting places of parked turns are a kind with a limit too.
    for kind in admission.WAITING_KIND.values():
        assert limits.limit(kind) > 0


def test_the_production_guide_shows_the_cost_classes_as_they_are() -> None:
    guide = (ROOT / "docs" / "production.md").read_text()
    assert costs.table() in guide, "docs/production.md's cost class table is stale"
