"""Summaries that stay ahead (issue 29): after a committed turn the agent asks the
background queue for the job that keeps the summary `RUNIFOLD_AGENT_SUMMARY_LEAD`
entries ahead of the window, so that a chat loop whose queue keeps up never finds
unsummarized entries outside its window; REQUIRE still refuses when the queue is behind.

The rules (services/agent/turn/ahead.py) alone, then the orchestrator with the real
transcript domain behind in-memory ports, the fake queue run between turns.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.agent.config import AgentConfig
from services.agent.model import SummaryMode, Turn, TurnResult
from services.agent.service import AgentService
from services.agent.turn.ahead import effective_lead, job_window_ahead, summary_ahead
from services.common.domain import Budget, Message, Role, Usage
from services.common.errors import Code, DomainError, StoreUnavailable
from services.common.settings import SettingsError
from services.llm.model import ChatRequest, ChatResponse
from tests.agent.fakes import FakeMemories, FakeSummaries, FakeTranscripts, ScriptedModel, new_id

NS = "tenant-ahead"


# -- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "lead", "expected"),
    [(16, 8, 8), (16, 0, 0), (4, 8, 2), (1, 8, 0), (4096, 2048, 2048), (16, 15, 8), (9, 8, 4)],
)
def test_the_lead_a_window_allows_is_at_most_half_of_it(
    window: int, lead: int, expected: int
) -> None:
    assert effective_lead(window, lead) == expected


@pytest.mark.parametrize(
    ("window", "lead", "through", "last", "expected"),
    [
        # Short conversations: nothing is near the window's edge, no job.
        (16, 8, 0, 10, None),
        # Within half the lead of the edge: a job with a window 8 smaller.
        (16, 8, 0, 12, 8),
        # Entries outside the window not summarized (ahead < 0): a job.
        (16, 8, 0, 30, 8),
        # More than half the lead ahead: no job yet.
        (16, 8, 20, 30, None),
        # Exactly half: a job.
        (16, 8, 18, 30, 8),
        # The lead off: never a job (summaries only when a turn needs one).
        (16, 0, 0, 30, None),
        # Window 1 allows no lead, but the job still runs ahead of the next turn.
        (1, 8, 0, 2, 1),
        (1, 8, 1, 2, None),
        # A small window: the lead is cut to half of it.
        (4, 8, 0, 4, 2),
        (4, 8, 2, 4, None),
    ],
)
def test_a_job_is_due_once_the_summary_is_no_more_than_half_the_lead_ahead(
    window: int, lead: int, through: int, last: int, expected: int | None
) -> None:
    assert job_window_ahead(window, lead, through, last) == expected


def test_ahead_counts_window_entries_the_summary_covers() -> None:
    assert summary_ahead(24, 40, 16) == 0  # the summary ends where the window begins
    assert summary_ahead(30, 40, 16) == 6
    assert summary_ahead(20, 40, 16) == -4  # four entries outside the window wait


# -- the setting -------------------------------------------------------------------------


def test_the_lead_setting_is_read_once_and_checked() -> None:
    assert AgentConfig().summary_lead == 8
    assert AgentConfig.from_env({}).summary_lead == 8
    assert AgentConfig.from_env({"RUNIFOLD_AGENT_SUMMARY_LEAD": "0"}).summary_lead == 0
    assert AgentConfig.from_env({"RUNIFOLD_AGENT_SUMMARY_LEAD": "2048"}).summary_lead == 2048
    for bad in ("-1", "2049", "eight", "8.5"):
        with pytest.raises(SettingsError, match="RUNIFOLD_AGENT_SUMMARY_LEAD"):
            AgentConfig.from_env({"RUNIFOLD_AGENT_SUMMARY_LEAD": bad})


# -- the orchestrator --------------------------------------------------------------------


class Loop:
    """One conversation driven turn after turn, as a chat loop drives it."""

    def __init__(self, lead: int = 8) -> None:
        self.transcripts = FakeTranscripts()
        self.summaries = FakeSummaries(self.transcripts)
        self.model = ScriptedModel(
            respond=lambda request: ChatResponse(
                f"answer {len(request.messages)}", usage=Usage(3, 2, 1)
            )
        )
        self.agent = AgentService(
            self.transcripts,
            self.summaries,
            FakeMemories(),
            self.model,
            AgentConfig(summary_lead=lead),
        )
        self.cid = ""

    async def start(self) -> None:
        self.cid, _ = await self.transcripts.create_conversation(NS, new_id())

    def turn(self, text: str, mode: SummaryMode = SummaryMode.REQUIRE, turn_id: str = "") -> Turn:
        return Turn(
            namespace=NS,
            conversation_id=self.cid,
            input=[Message(Role.USER, text)],
            turn_id=turn_id,
            policy=self.agent.policy(16, 64, 0, mode, 0),
            budget=self.agent.budget(Budget()),
        )

    @property
    def requests(self) -> list[ChatRequest]:
        return self.model.requests

    async def entries(self) -> list[str]:
        return [m.text for m in await self.transcripts.messages(NS, self.cid)]


def ahead_requests(outcome: str) -> float:
    return (
        REGISTRY.get_sample_value("runifold_summary_ahead_requests_total", {"outcome": outcome})
        or 0.0
    )


async def test_a_require_loop_whose_queue_keeps_up_is_never_refused() -> None:
    """40 turns with window 16 under REQUIRE, the queue run between turns (it keeps up):
    no refusal, although every turn from the tenth on pushes entries out of the window.
    Each prompt is one context block plus the 16 newest entries verbatim plus the input:
    the summary runs ahead, the window is never cut for it."""
    loop = Loop()
    await loop.start()
    for k in range(1, 41):
        result = await loop.agent.run(loop.turn(f"message {k}"))
        assert isinstance(result, TurnResult)
        context = result.context
        assert context.summary_through_sequence >= context.window_first_sequence - 1
        await loop.summaries.run_jobs(NS)

    entries = await loop.entries()
    assert len(entries) == 80
    for k, request in enumerate(loop.requests, start=1):
        before = entries[: 2 * (k - 1)]
        window = [m.content for m in request.messages if "trust=" not in m.content]
        assert window == [*before[-16:], f"message {k}"], f"turn {k}"
        assert len(request.messages) <= 1 + 16 + 1
    # Every job asked for summarizes ahead: the turn's window less the lead.
    assert loop.summaries.summaries[loop.cid].through_sequence >= 80 - 16


async def test_the_summary_ahead_says_which_window_messages_it_also_covers() -> None:
    loop = Loop()
    await loop.start()
    for k in range(1, 13):
        await loop.agent.run(loop.turn(f"message {k}"))
        await loop.summaries.run_jobs(NS)
    through = loop.summaries.summaries[loop.cid].through_sequence
    await loop.agent.run(loop.turn("and now?"))
    context = loop.requests[-1].messages[0].content
    # The view was read at sequence 24: its window is entries 9..24.
    covered = through - 8
    assert covered > 0
    assert (
        f'<summary through_sequence="{through}" covers_first_messages_below="{covered}">' in context
    )


async def test_with_the_queue_behind_require_still_refuses_and_auto_summarizes() -> None:
    """The jobs are asked for but never run: the seed's semantics hold as they were."""
    loop = Loop()
    await loop.start()
    for k in range(1, 10):
        await loop.agent.run(loop.turn(f"message {k}"))
    assert loop.summaries.requested, "jobs were asked for ahead of the window"
    assert {window for _, window, _ in loop.summaries.requested} == {8}
    with pytest.raises(DomainError) as refused:
        await loop.agent.run(loop.turn("message 10"))
    assert refused.value.code is Code.FAILED_PRECONDITION
    assert refused.value.reason == "SUMMARY_REQUIRED"
    assert refused.value.metadata["backlog"] == "2"
    result = await loop.agent.run(loop.turn("message 10", SummaryMode.AUTO))
    assert result.context.summary_passes == 1 and result.context.summary_through_sequence == 2


async def test_with_the_lead_off_no_job_is_asked_for_and_turn_ten_is_refused() -> None:
    loop = Loop(lead=0)
    await loop.start()
    for k in range(1, 10):
        await loop.agent.run(loop.turn(f"message {k}"))
        await loop.summaries.run_jobs(NS)
    assert loop.summaries.jobs == []
    with pytest.raises(DomainError) as refused:
        await loop.agent.run(loop.turn("message 10"))
    assert refused.value.reason == "SUMMARY_REQUIRED"


async def test_a_job_ahead_that_cannot_be_enqueued_never_fails_the_committed_turn() -> None:
    loop = Loop()
    await loop.start()
    for k in range(1, 6):
        await loop.agent.run(loop.turn(f"message {k}"))
    loop.summaries.request_error = StoreUnavailable("summary service down")
    failed = ahead_requests("failed")
    result = await loop.agent.run(loop.turn("message 6"))
    assert result.last_sequence == 12 and not result.replayed
    assert ahead_requests("failed") == failed + 1
    assert (await loop.entries())[-2:] == ["message 6", "answer 11"]  # 10 + the input


async def test_a_replayed_turn_asks_for_no_job() -> None:
    loop = Loop()
    await loop.start()
    for k in range(1, 6):
        await loop.agent.run(loop.turn(f"message {k}"))
    first = await loop.agent.run(loop.turn("message 6", turn_id="t-6"))
    assert len(loop.summaries.requested) == 1
    requested = ahead_requests("requested")
    again = await loop.agent.run(loop.turn("message 6", turn_id="t-6"))
    assert again.replayed and again.last_sequence == first.last_sequence
    assert len(loop.summaries.requested) == 1
    assert ahead_requests("requested") == requested
