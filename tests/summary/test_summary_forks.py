"""Summaries and forks (ForkConversation): a summary of the source that lies inside the
prefix a fork shares serves the fork until the fork commits its own; the fork's newer
summaries are its own; the source's never change. On the in-memory stores (the rule is
the service's; the stores see an ordinary commit)."""

from __future__ import annotations

import uuid

import pytest

from services.common.domain import Budget
from services.common.errors import DomainError
from tests.summary.double import InMemorySummaryStore
from tests.summary.support import (
    LocalTranscripts,
    Scripted,
    chat,
    make_service,
    new_conversation,
    reason,
)


async def _fork(transcripts: LocalTranscripts, namespace: str, cid: str, through: int) -> str:
    fork, _ = await transcripts.service.fork_conversation(namespace, cid, through)
    return str(fork.conversation_id)


async def test_a_sources_summary_inside_the_prefix_serves_the_fork(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    service = make_service(store, transcripts)
    source = await new_conversation(transcripts, namespace, chat(12))
    await service.commit_summary(namespace, source, "source through 4", 4, None)
    fork = await _fork(transcripts, namespace, source, 8)
    inherited = await service.get_summary(namespace, fork)
    assert inherited is not None and inherited.text == "source through 4"
    assert inherited.conversation_id == uuid.UUID(source)  # says whose it is
    # A fork point before the summary's end: the summary covers entries it lacks.
    assert (
        await service.get_summary(namespace, await _fork(transcripts, namespace, source, 3)) is None
    )

    # The fork's first summary must be newer, and may name the inherited one.
    with pytest.raises(DomainError) as stale:
        await service.commit_summary(namespace, fork, "fork through 2", 2, None)
    assert reason(stale)[1] == "SUMMARY_NOT_NEWER"
    with pytest.raises(DomainError) as conflict:
        await service.commit_summary(namespace, fork, "fork through 6", 6, 0)
    assert reason(conflict)[1] == "SUMMARY_CONFLICT"
    own = await service.commit_summary(namespace, fork, "fork through 6", 6, 4)
    assert own.written and own.summary.conversation_id == uuid.UUID(fork)
    assert (await service.get_summary(namespace, fork)).text == "fork through 6"  # type: ignore[union-attr]
    # The source's summary is untouched.
    assert (await service.get_summary(namespace, source)).text == "source through 4"  # type: ignore[union-attr]
    # A fork of the fork without a summary of its own: the nearest one within its prefix.
    deeper = await _fork(transcripts, namespace, fork, 7)
    assert (await service.get_summary(namespace, deeper)).text == "fork through 6"  # type: ignore[union-attr]
    deepest = await _fork(transcripts, namespace, deeper, 5)
    assert (await service.get_summary(namespace, deepest)).text == "source through 4"  # type: ignore[union-attr]


async def test_summarizing_a_fork_goes_on_from_the_inherited_summary(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    scripted = Scripted()
    service = make_service(store, transcripts, scripted)
    source = await new_conversation(transcripts, namespace, chat(40))
    await service.summarize(namespace, source, 10, 8, 1, Budget())  # the source: 1..8
    fork = await _fork(transcripts, namespace, source, 30)
    result = await service.summarize(namespace, fork, 10, 8, 1, Budget())
    assert result.passes == 1 and result.summary is not None
    assert result.summary.through_sequence == 16
    assert result.summary.conversation_id == uuid.UUID(fork)
    # The pass was handed the source's summary and the fork's next entries.
    assert scripted.calls[-1][0] == "summary through 8"
    assert scripted.calls[-1][1][0] == 9
    assert (await service.get_summary(namespace, source)).through_sequence == 8  # type: ignore[union-attr]
