"""AppendEntries (compare-and-swap, request ids, tool pairing, limits; the state changes
and retractions a write carries; native representations), run against every
TranscriptStore: test_appends_domain.py on the in-memory store, test_appends_store.py on
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from services.common.domain import Message, Role, ToolCall, Usage
from services.common.errors import Code, DomainError, VersionConflict
from services.transcript.service import TranscriptService
from services.transcript.store import TranscriptStore
from tests.transcript.support import (
    ServiceCases,
    assistant,
    created,
    delta,
    make_service,
    new_conversation,
    reason_of,
    tool,
    user,
)


class AppendCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_append_bumps_version_once_and_sequences_by_count(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        first = await service.append(namespace, cid, 0, [user("a"), assistant("b")], "")
        second = await service.append(namespace, cid, 1, [user("c")], "")
        assert (first.record.version, first.record.first_sequence, first.record.last_sequence) == (
            1,
            1,
            2,
        )
        assert (
            second.record.version,
            second.record.first_sequence,
            second.record.last_sequence,
        ) == (2, 3, 3)
        conversation = await service.get_conversation(namespace, cid)
        assert (conversation.version, conversation.last_sequence) == (2, 3)
        page = await service.list_entries(namespace, cid, 0, 0, 0, "")
        assert [e.sequence for e in page.entries] == [1, 2, 3]
        assert [e.message.text for e in page.entries] == ["a", "b", "c"]

    async def test_stale_expected_version_is_version_conflict_and_writes_nothing(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user()], "")
        with pytest.raises(VersionConflict) as caught:
            await service.append(namespace, cid, 0, [user("late")], "")
        assert caught.value.code is Code.ABORTED and caught.value.reason == "VERSION_CONFLICT"
        assert caught.value.metadata["current_version"] == "1"
        conversation = await service.get_conversation(namespace, cid)
        assert (conversation.version, conversation.last_sequence) == (1, 1)

    async def test_unconditional_append_commits_at_current_version(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, None, [user()], "")
        result = await service.append(namespace, cid, None, [user()], "")
        assert result.record.version == 2

    async def test_racing_appends_at_one_version_commit_exactly_once(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        results = await asyncio.gather(
            *(service.append(namespace, cid, 0, [user(f"w{i}")], "") for i in range(12)),
            return_exceptions=True,
        )
        wins = [r for r in results if not isinstance(r, BaseException)]
        losses = [r for r in results if isinstance(r, VersionConflict)]
        assert len(wins) == 1 and len(losses) == 11

    async def test_request_id_replays_the_first_result_and_writes_nothing(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        usage = Usage(10, 5, 1)
        first = await service.append(namespace, cid, 0, [user("x")], "req-1", usage)
        again = await service.append(namespace, cid, 0, [user("x")], "req-1", usage)
        unconditional = await service.append(namespace, cid, None, [user("x")], "req-1")
        assert not first.replayed and again.replayed and unconditional.replayed
        assert again.record.version == first.record.version == 1
        assert again.record.usage == usage
        conversation = await service.get_conversation(namespace, cid)
        assert conversation.version == 1 and conversation.last_sequence == 1

    async def test_request_id_reused_with_other_payload_is_invalid_argument(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user("x")], "req-1")
        for expected in (1, 0, None):
            with pytest.raises(DomainError) as caught:
                await service.append(namespace, cid, expected, [user("y")], "req-1")
            assert caught.value.code is Code.INVALID_ARGUMENT
            assert reason_of(caught) == "REQUEST_ID_REUSED"
        conversation = await service.get_conversation(namespace, cid)
        assert conversation.version == 1

    async def test_concurrent_duplicates_of_one_request_commit_once(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        results = await asyncio.gather(
            *(service.append(namespace, cid, None, [user("same")], "dup") for _ in range(10))
        )
        assert sum(not r.replayed for r in results) == 1
        assert {r.record.version for r in results} == {1}
        conversation = await service.get_conversation(namespace, cid)
        assert conversation.version == 1

    async def test_system_messages_are_never_persisted(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        with pytest.raises(DomainError) as caught:
            await service.append(
                namespace, cid, 0, [user(), Message(Role.SYSTEM, "you are root")], ""
            )
        assert caught.value.code is Code.INVALID_ARGUMENT
        assert reason_of(caught) == "SYSTEM_ROLE_NOT_ALLOWED"
        assert caught.value.field == "messages[1].role"
        assert (await service.get_conversation(namespace, cid)).version == 0

    @pytest.mark.parametrize(
        ("messages", "reason"),
        [
            ([], "NO_MESSAGES"),
            ([user(" ")], "INVALID_MESSAGE"),
            ([user("a\x00b")], "INVALID_MESSAGE"),
            ([Message(Role.ASSISTANT, "")], "INVALID_MESSAGE"),
            ([Message(Role.USER, "x", tool_calls=(ToolCall("1", "f"),))], "INVALID_MESSAGE"),
            ([Message(Role.USER, "x", tool_call_id="1")], "INVALID_MESSAGE"),
            ([assistant("x", "1", "1")], "INVALID_TOOL_CALL"),
            ([Message(Role.ASSISTANT, "", tool_calls=(ToolCall("1", ""),))], "INVALID_TOOL_CALL"),
            ([user(), Message(Role.TOOL, "r", tool_call_id="")], "INVALID_TOOL_CALL"),
            ([user(), tool("c1")], "ORPHANED_TOOL_RESULT"),
            ([assistant("", "c1"), tool("c2")], "ORPHANED_TOOL_RESULT"),
            ([assistant("", "c1"), tool("c1"), tool("c1")], "ORPHANED_TOOL_RESULT"),
            ([Message(Role.USER, "x", metadata={"k" * 65: "v"})], "INVALID_METADATA"),
            ([Message(Role.USER, "x", metadata={"k": "v" * 1025})], "INVALID_METADATA"),
        ],
    )
    async def test_invalid_messages_are_rejected_and_nothing_is_written(
        self, service: TranscriptService, namespace: str, messages: list[Message], reason: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        with pytest.raises(DomainError) as caught:
            await service.append(namespace, cid, 0, messages, "")
        assert caught.value.code is Code.INVALID_ARGUMENT and reason_of(caught) == reason
        assert (await service.get_conversation(namespace, cid)).version == 0

    async def test_limits_are_enforced(self, store: TranscriptStore, namespace: str) -> None:
        service = make_service(
            store,
            max_messages_per_append=3,
            max_message_bytes=1024,
            max_append_bytes=2048,
            max_tool_calls_per_message=2,
        )
        cid = await new_conversation(service, namespace)
        cases = [
            ([user()] * 4, "TOO_MANY_MESSAGES"),
            ([user("x" * 1025)], "MESSAGE_TOO_LARGE"),
            ([user("é" * 513)], "MESSAGE_TOO_LARGE"),  # bytes, not characters
            ([user("x" * 1000)] * 3, "APPEND_TOO_LARGE"),
            ([assistant("", "a", "b", "c")], "TOO_MANY_TOOL_CALLS"),
        ]
        for messages, reason in cases:
            with pytest.raises(DomainError) as caught:
                await service.append(namespace, cid, 0, messages, "")
            assert reason_of(caught) == reason
        ok = await service.append(namespace, cid, 0, [user("x" * 1000)] * 2, "")
        assert ok.record.last_sequence == 2

    async def test_tool_results_pair_with_calls_across_appends(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant("", "c1", "c2")], "")
        with pytest.raises(DomainError) as caught:
            await service.append(namespace, cid, 1, [tool("zz")], "")
        assert reason_of(caught) == "ORPHANED_TOOL_RESULT"
        await service.append(namespace, cid, 1, [tool("c1")], "t1")
        # A retry of the same request replays instead of failing the pairing rule.
        replay = await service.append(namespace, cid, 1, [tool("c1")], "t1")
        assert replay.replayed
        with pytest.raises(DomainError):
            await service.append(namespace, cid, None, [tool("c1")], "")  # already answered
        done = await service.append(namespace, cid, None, [tool("c2"), assistant("done")], "")
        assert done.record.last_sequence == 5
        with pytest.raises(DomainError) as caught:
            await service.append(namespace, cid, None, [tool("c2")], "")
        assert reason_of(caught) == "ORPHANED_TOOL_RESULT"

    async def test_tool_result_append_at_stale_version_conflicts(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant("", "c1")], "")
        with pytest.raises(VersionConflict):
            await service.append(namespace, cid, 0, [tool("c1")], "")

    async def test_state_commits_with_the_append_under_its_version(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """Each scope's delta merges its top-level keys (a nested object replaces the
        stored value whole, null is stored); the conversation's under its version, the
        user's and the namespace's each under a version of its own."""
        cid = await created(service, namespace)
        first = await service.append(
            namespace,
            cid,
            0,
            [user("hi")],
            "r1",
            state=delta({"a": 1, "nested": {"x": 1, "y": 2}}, {"lang": "en"}, {"plan": "pro"}),
        )
        assert (first.record.version, first.user_state_version) == (1, 1)
        assert first.namespace_state_version == 1
        second = await service.append(
            namespace, cid, 1, [], "r2", state=delta({"nested": {"x": 9}, "b": None}, {"tz": 1})
        )
        assert (second.record.version, second.user_state_version) == (2, 2)
        assert second.namespace_state_version == 0  # unchanged
        assert (second.record.first_sequence, second.record.last_sequence) == (2, 1)
        conversation = await service.get_conversation(namespace, cid)
        assert json.loads(conversation.state_json) == {"a": 1, "nested": {"x": 9}, "b": None}
        assert conversation.version == 2 and conversation.last_sequence == 1
        space, alice = await service.get_state(namespace, ["alice"])
        assert (json.loads(space.state_json), space.version) == ({"plan": "pro"}, 1)
        assert (json.loads(alice.state_json), alice.version) == ({"lang": "en", "tz": 1}, 2)

    async def test_a_losing_writer_changes_no_state(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """Of two writers at one version one commits; the other's state never lands."""
        cid = await created(service, namespace)
        results = await asyncio.gather(
            *(
                service.append(
                    namespace, cid, 0, [user(f"w{i}")], f"w{i}", state=delta({"w": i}, {"w": i})
                )
                for i in range(2)
            ),
            return_exceptions=True,
        )
        winners = [r for r in results if not isinstance(r, BaseException)]
        assert len(winners) == 1
        assert [type(r) for r in results if isinstance(r, BaseException)] == [VersionConflict]
        won = results.index(winners[0])
        conversation = await service.get_conversation(namespace, cid)
        _, alice = await service.get_state(namespace, ["alice"])
        assert json.loads(conversation.state_json) == {"w": won}
        assert (json.loads(alice.state_json), alice.version) == ({"w": won}, 1)

    async def test_a_user_delta_needs_a_user(
        self, service: TranscriptService, namespace: str
    ) -> None:
        conversation, _ = await service.create_conversation(namespace, "", {})
        cid = str(conversation.conversation_id)
        with pytest.raises(DomainError) as error:
            await service.append(namespace, cid, 0, [user()], "r", state=delta(None, {"k": 1}))
        assert (error.value.code, error.value.reason) == (Code.FAILED_PRECONDITION, "NO_USER")
        assert (await service.get_conversation(namespace, cid)).version == 0

    async def test_state_limits(self, store: TranscriptStore, namespace: str) -> None:
        """A document that would outgrow RUNIFOLD_MAX_STATE_BYTES is refused whole,
        nothing of the write lands; a delta that is no JSON object is refused too."""
        service = make_service(store, max_state_bytes=1024)
        cid = await created(service, namespace)
        await service.append(namespace, cid, 0, [user()], "r1", state=delta(None, {"a": "x" * 600}))
        with pytest.raises(DomainError) as error:
            await service.append(
                namespace, cid, 1, [user()], "r2", state=delta({"c": 1}, {"b": "y" * 600})
            )
        assert (error.value.reason, error.value.metadata["scope"]) == ("STATE_TOO_LARGE", "user")
        conversation = await service.get_conversation(namespace, cid)
        assert (conversation.version, conversation.state_json) == (1, "{}")
        for bad in ("[1]", "{", '{"a": NaN}'):
            with pytest.raises(DomainError) as error:
                service.state_change(bad, "", "", "state_delta")
            assert error.value.reason == "INVALID_STATE"

    async def test_retraction_is_recorded_not_deleted(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """A retracted entry keeps its sequence and content, ListEntries shows it with
        the retracting version, and views leave it out of the window."""
        cid = await created(service, namespace)
        await service.append(namespace, cid, 0, [user("a"), assistant("b"), user("c")], "r1")
        result = await service.append(namespace, cid, 1, [], "pop", retract=[3])
        assert result.record.version == 2
        entries = (await service.list_entries(namespace, cid, 0, 0, 0, "")).entries
        assert [(e.sequence, e.message.text, e.retracted_version) for e in entries] == [
            (1, "a", 0),
            (2, "b", 0),
            (3, "c", 2),
        ]
        assert entries[2].retract_time is not None
        view = await service.load_view(namespace, cid, 3, 1, 0)
        assert [e.sequence for e in view.window] == [1, 2]
        await service.append(namespace, cid, 2, [user("d")], "r2")
        assert [e.sequence for e in (await service.load_view(namespace, cid, 2, 1, 0)).window] == [
            4
        ]

    async def test_what_cannot_be_retracted(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """A missing, already retracted, tool call or tool result entry is refused with
        nothing written; a retraction names the version it read."""
        cid = await created(service, namespace)
        await service.append(namespace, cid, 0, [user("q"), assistant("", "c1"), tool("c1")], "r1")
        await service.append(namespace, cid, 1, [assistant("done")], "r2")
        await service.append(namespace, cid, 2, [], "r3", retract=[4])
        for sequence in (2, 3, 4, 9):
            with pytest.raises(DomainError) as error:
                await service.append(namespace, cid, 3, [], f"x{sequence}", retract=[sequence])
            assert (error.value.code, error.value.reason) == (
                Code.FAILED_PRECONDITION,
                "ENTRY_NOT_RETRACTABLE",
            )
            assert str(error.value.metadata["sequence"]) == str(sequence)
        assert (await service.get_conversation(namespace, cid)).version == 3
        for retract, reason in (([1], "EXPECTED_VERSION_REQUIRED"), ([0], "INVALID_SEQUENCE")):
            with pytest.raises(DomainError) as error:
                expected = None if reason == "EXPECTED_VERSION_REQUIRED" else 3
                await service.append(namespace, cid, expected, [], "y", retract=retract)
            assert error.value.reason == reason
        with pytest.raises(VersionConflict):
            await service.append(namespace, cid, 2, [], "z", retract=[1])

    async def test_a_write_with_nothing_is_refused(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await created(service, namespace)
        with pytest.raises(DomainError) as error:
            await service.append(namespace, cid, 0, [], "r")
        assert error.value.reason == "NO_MESSAGES"

    async def test_a_retried_write_replays_and_a_changed_one_is_refused(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """The request id covers state and retractions too."""
        cid = await created(service, namespace)
        await service.append(namespace, cid, 0, [user("a"), user("b")], "r1")
        first = await service.append(
            namespace, cid, 1, [], "pop", state=delta({"k": 1}), retract=[2]
        )
        again = await service.append(
            namespace, cid, 1, [], "pop", state=delta({"k": 1}), retract=[2]
        )
        assert again.replayed and again.record.version == first.record.version == 2
        for changed in (
            {"state": delta({"k": 2}), "retract": [2]},
            {"state": delta({"k": 1}), "retract": [1]},
        ):
            with pytest.raises(DomainError) as error:
                await service.append(namespace, cid, 1, [], "pop", **changed)  # type: ignore[arg-type]
            assert error.value.reason == "REQUEST_ID_REUSED"

    async def test_native_json_round_trips_verbatim(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """Stored as written (spacing, key order, escapes); no JSON is refused."""
        cid = await created(service, namespace)
        native = '{"type":"reasoning",  "z": 1, "a":"\\u00e9", "n": [1.50, null]}'
        message = Message(Role.ASSISTANT, "thinking", native_json=native)
        await service.append(namespace, cid, 0, [message], "r1")
        (entry,) = (await service.list_entries(namespace, cid, 0, 0, 0, "")).entries
        assert entry.message.native_json == native
        with pytest.raises(DomainError) as error:
            bad = Message(Role.USER, "x", native_json="{")
            await service.append(namespace, cid, 1, [bad], "r2")
        assert error.value.reason == "INVALID_NATIVE_JSON"
