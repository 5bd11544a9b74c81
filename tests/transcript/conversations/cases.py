"""State, users, retractions and native representations of the transcript domain,
run against every TranscriptStore (tests/unit: in memory; tests/integration: PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from services.common.domain import Message, Role
from services.common.errors import Code, DomainError, VersionConflict
from services.transcript.conversations.model import StateChange
from services.transcript.service import TranscriptService
from services.transcript.store import TranscriptStore
from tests.transcript.appends.cases import assistant, make_service, tool, user


def delta(
    conversation: object = None, user_state: object = None, namespace: object = None
) -> StateChange:
    """A StateChange of JSON objects (None: no change of that scope)."""
    parts = (conversation, user_state, namespace)
    return StateChange(*(None if part is None else json.dumps(part) for part in parts))


async def created(service: TranscriptService, namespace: str, user_id: str = "alice") -> str:
    conversation, _ = await service.create_conversation(namespace, "", {}, user_id)
    return str(conversation.conversation_id)


class TranscriptStateCases:
    """Subclasses provide a `store` fixture."""

    @pytest.fixture
    def service(self, store: TranscriptStore) -> TranscriptService:
        return make_service(store)

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

    async def test_user_state_is_shared_by_the_users_conversations_only(
        self, service: TranscriptService, namespace: str
    ) -> None:
        mine, other = await created(service, namespace), await created(service, namespace, "bob")
        await service.append(namespace, mine, 0, [user()], "a", state=delta(None, {"k": "a"}))
        _, alice, bob, nobody = await service.get_state(namespace, ["alice", "bob", "carol"])
        assert json.loads(alice.state_json) == {"k": "a"}
        assert (bob.state_json, bob.version, nobody.version) == ("{}", 0, 0)
        assert bob.user_id == "bob" and nobody.update_time is None
        await service.append(namespace, other, 0, [user()], "b", state=delta(None, {"k": "b"}))
        _, alice = await service.get_state(namespace, ["alice"])
        assert json.loads(alice.state_json) == {"k": "a"}

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

    async def test_create_with_state_and_a_user_filter(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """The initial state applies only when the call creates; ListConversations
        filters by user and returns the state only in the full view."""
        cid = str(uuid.uuid4())
        conversation, made = await service.create_conversation(
            namespace, cid, {}, "alice", delta({"s": 1}, {"u": 1}, {"n": 1})
        )
        assert made and json.loads(conversation.state_json) == {"s": 1}
        again, made = await service.create_conversation(
            namespace, cid, {}, "alice", delta({"s": 2}, {"u": 2}, {"n": 2})
        )
        assert not made and json.loads(again.state_json) == {"s": 1}
        space, alice = await service.get_state(namespace, ["alice"])
        assert (json.loads(space.state_json), json.loads(alice.state_json)) == ({"n": 1}, {"u": 1})
        await created(service, namespace, "bob")
        page = await service.list_conversations(namespace, 0, "", "alice")
        assert [str(c.conversation_id) for c in page.conversations] == [cid]
        assert page.conversations[0].state_json == "" and page.conversations[0].user_id == "alice"
        full = await service.list_conversations(namespace, 0, "", "alice", with_state=True)
        assert json.loads(full.conversations[0].state_json) == {"s": 1}
        assert len((await service.list_conversations(namespace, 0, "")).conversations) == 2

    async def test_a_user_filtered_page_token_continues_only_that_listing(
        self, service: TranscriptService, namespace: str
    ) -> None:
        for _ in range(3):
            await created(service, namespace)
        page = await service.list_conversations(namespace, 1, "", "alice")
        assert page.next_page_token
        rest = await service.list_conversations(namespace, 5, page.next_page_token, "alice")
        assert len(rest.conversations) == 2
        with pytest.raises(DomainError) as error:
            await service.list_conversations(namespace, 5, page.next_page_token)
        assert error.value.code == Code.INVALID_ARGUMENT

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
