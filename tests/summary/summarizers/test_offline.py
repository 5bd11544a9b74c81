"""The offline summarizer: its digest (readable, deterministic, bounded) and its usage."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.domain import Entry
from services.summary.summarizers.offline import OfflineSummarizer, offline_digest
from tests.summary.support import (
    assistant,
    chat,
    tool,
    user,
)


def entries(messages: Sequence[object], start: int = 1) -> list[Entry]:
    from datetime import UTC, datetime

    return [
        Entry(start + i, m, datetime.now(UTC))  # type: ignore[arg-type]
        for i, m in enumerate(messages)
    ]


def test_offline_digest_is_readable_deterministic_and_bounded() -> None:
    first = entries(
        [
            user("How do I rotate the API keys of the billing service?"),
            assistant("", "k1"),
            tool("k1", "keys rotated at 10:00"),
            assistant("Done: the keys were rotated."),
        ]
    )
    digest = offline_digest(None, first, 4096)
    assert digest == offline_digest(None, first, 4096)
    assert "through entry 4" in digest
    assert "How do I rotate the API keys of the billing service?" in digest
    assert "assistant called lookup" in digest and "keys rotated at 10:00" in digest
    assert "Tools called: lookup (1)." in digest

    many = entries([user(f"message number {i} " + "word " * 60) for i in range(500)], start=5)
    grown = offline_digest(digest, many, 2048)
    assert len(grown.encode()) <= 2048
    assert "through entry 504" in grown
    assert "Counted: 501 user messages, 2 assistant messages, 1 tool results." in grown
    assert "How do I rotate" in grown  # the opening is kept
    assert "message number 499" in grown  # the most recent is kept
    assert "message number 10 " not in grown  # the middle made room

    foreign = offline_digest("A summary a model wrote.", first, 4096)
    assert "Earlier summary (excerpt): A summary a model wrote." in foreign


async def test_offline_summarizer_reports_usage() -> None:
    summarizer = OfflineSummarizer()
    prompt = summarizer.prepare(None, entries(chat(6)), max_output_tokens=1024)
    output = await summarizer.summarize(prompt, timeout=1.0)
    assert output.usage.model_calls == 1
    assert output.usage.input_tokens > 0 and output.usage.output_tokens > 0
    assert output.text.startswith("Conversation summary through entry 6")
