"""The offline proposer's rules that need no store: of several values of one exclusive
fact in the entries read, the latest alone is proposed (automatic curation reads a batch
of turns at once, and nothing stored yet could be superseded)."""

from __future__ import annotations

from datetime import UTC, datetime

from services.common.domain import Entry, Message, Role
from services.memory.proposals.offline import offline_proposals

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def entries(*texts: str) -> list[Entry]:
    return [Entry(i, Message(Role.USER, t), NOW) for i, t in enumerate(texts, start=1)]


def test_the_latest_value_of_an_exclusive_fact_in_a_range_is_the_one_proposed() -> None:
    read = entries(
        "I live in Oslo.",
        "I work at Initech.",
        "I like jazz.",
        "I moved to Bergen.",
        "I now work at Hooli.",
        "I like tea.",
    )
    proposed = [
        (p["content"], p["sources"][0]["from_sequence"]) for p in offline_proposals(read, [], 16)
    ]
    assert proposed == [
        ("The user likes jazz.", 3),
        ("The user lives in Bergen.", 4),
        ("The user works at Hooli.", 5),
        ("The user likes tea.", 6),  # not exclusive: both stand
    ]


def test_a_value_stated_again_after_another_is_the_latest() -> None:
    read = entries("I live in Oslo.", "I moved to Bergen.", "I live in Oslo.")
    assert [p["content"] for p in offline_proposals(read, [], 16)] == ["The user lives in Oslo."]
