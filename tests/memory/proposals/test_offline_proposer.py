"""The offline proposer's rules, as a pure function: habits ("I always ...") are durable
first-person statements too (issue 29: ADK's add_session_to_memory stored nothing for
"I always drink green tea in the morning.")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.common.domain import Entry, Message, Role
from services.memory.proposals.offline import offline_proposals


def _said(*texts: str) -> list[Entry]:
    return [
        Entry(
            sequence=sequence,
            message=Message(role=Role.USER, text=text),
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for sequence, text in enumerate(texts, start=1)
    ]


@pytest.mark.parametrize(
    ("said", "fact"),
    [
        (
            "I always drink green tea in the morning.",
            "The user always drinks green tea in the morning.",
        ),
        ("I usually go running on Sundays.", "The user usually goes running on Sundays."),
        ("I never watch horror films.", "The user never watches horror films."),
        ("I often study late", "The user often studies late."),
        ("I rarely have time for lunch.", "The user rarely has time for lunch."),
        ("I always play chess with Sam.", "The user always plays chess with Sam."),
        ("I never can't sleep after coffee.", "The user never can't sleep after coffee."),
    ],
)
def test_a_habit_is_a_durable_statement(said: str, fact: str) -> None:
    (proposal,) = offline_proposals(_said("Hello.", said), [], 10)
    assert proposal["content"] == fact
    assert proposal["sources"] == [{"from_sequence": 2, "through_sequence": 2}]
    assert proposal["action"] == "ADD" and proposal["reason"] == "a habit the user stated"


def test_a_question_about_a_habit_states_nothing() -> None:
    assert offline_proposals(_said("Do I always drink tea?", "I always wonder?"), [], 10) == []
