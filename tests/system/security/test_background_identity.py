"""Background summary jobs under authentication.

A job runs after the RPC that asked for it has ended, so there is no caller
identity to carry to TranscriptService: the worker acts for the job's
namespace under the service's own identity (the service token under jwt; its
mesh identity, marked delegate, under mesh), so SUMMARY_REQUIRED turns clear
with authentication on.
"""

from __future__ import annotations

import uuid

from runifold.summary.v1 import summary_service_pb2 as summary_pb
from tests.support.stack import Stack
from tests.support.waiting import wait_for
from tests.system.security.support import bearer, must
from tests.system.security.worlds import build_world


async def test_a_summary_job_runs_with_authentication_on(stack: Stack) -> None:
    namespace = f"background-{uuid.uuid4().hex[:10]}"
    world = await build_world(
        stack.channel, namespace, bearer(namespace), with_turn=False, with_job=False
    )
    await must(
        stack.channel,
        "SummaryService.RequestSummary",
        summary_pb.RequestSummaryRequest(
            namespace=namespace, conversation_id=world.conversation_id, window=1, summary_batch=8
        ),
        world.metadata,
    )

    async def summarized() -> bool:
        got = await must(
            stack.channel,
            "SummaryService.GetSummary",
            summary_pb.GetSummaryRequest(
                namespace=namespace, conversation_id=world.conversation_id
            ),
            world.metadata,
        )
        return bool(got.summary.through_sequence > world.summary_through)

    await wait_for(summarized, timeout=5)
