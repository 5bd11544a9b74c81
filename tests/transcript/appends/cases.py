"""Behaviour of the transcript domain, run against every TranscriptStore.

tests/unit runs these cases on the in-memory store, tests/integration on
PostgreSQL: both stores must give the domain the same guarantees.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from services.common.domain import Message, Role, ToolCall, Usage
from services.common.errors import Code, DomainError, VersionConflict
from services.common.pagination import PageTokens
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from services.transcript.store import TranscriptStore


def user(text: str = "hello") -> Message:
    return Message(Role.USER, text)


def assistant(text: str = "hi", *calls: str) -> Message:
    return Message(
        Role.ASSISTANT, text, tool_calls=tuple(ToolCall(c, "lookup", '{"q": 1}') for c in calls)
    )


def tool(call_id: str, text: str = "result") -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id)


def make_service(store: TranscriptStore, **limits: Any) -> TranscriptService:
    return TranscriptService(
        store, TranscriptLimits(**limits), PageTokens(b"secret-for-tests-0123")
    )


async def new_conversation(service: TranscriptService, namespace: str) -> str:
    conversation, created = await service.create_conversation(namespace, "", {})
    assert created
    return str(conversation.conversation_id)


def reason_of(error: pytest.ExceptionInfo[DomainError]) -> str:
    return error.value.reason


class TranscriptCases:
    """Subclasses provide a `store` fixture."""

    @pytest.fixture
    def service(self, store: TranscriptStore) -> TranscriptService:
        return make_service(store)

    async def test_create_is_idempotent_per_namespace(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = str(uuid.uuid4())
        first, created = await service.create_conversation(namespace, cid, {"a": "b"})
        again, created_again = await service.create_conversation(namespace, cid, {})
        assert created and not created_again
        assert again.conversation_id == first.conversation_id and again.labels == {"a": "b"}
        # The same id in another namespace is another conversation, not a conflict.
        other, created_other = await service.create_conversation(namespace + "-b", cid, {})
        assert created_other and other.namespace == namespace + "-b"

    async def test_server_made_ids_are_uuid7(
        self, service: TranscriptService, namespace: str
    ) -> None:
        conversation, _ = await service.create_conversation(namespace, "", {})
        assert conversation.conversation_id.version == 7

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

    async def test_other_namespace_sees_not_found(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        other = namespace + "-other"
        calls = [
            service.get_conversation(other, cid),
            service.append(other, cid, 0, [user()], ""),
            service.list_entries(other, cid, 0, 0, 0, ""),
            service.load_view(other, cid, 4, 4, 0),
        ]
        for call in calls:
            with pytest.raises(DomainError) as caught:
                await call
            assert caught.value.code is Code.NOT_FOUND
            assert reason_of(caught) == "CONVERSATION_NOT_FOUND"
        assert await service.delete_conversation(other, cid) is None
        assert (await service.get_conversation(namespace, cid)).version == 0

    @pytest.mark.parametrize("bad", ["", "a" * 129, "tenant/1", "tenant 1", "ténant", "a\x00"])
    async def test_invalid_namespaces_are_rejected(
        self, service: TranscriptService, bad: str
    ) -> None:
        with pytest.raises(DomainError) as caught:
            await service.create_conversation(bad, "", {})
        assert reason_of(caught) == "INVALID_NAMESPACE"

    @pytest.mark.parametrize(
        "bad", ["x", "123", "{" + str(uuid.uuid4()) + "}", str(uuid.uuid4()).replace("-", "")]
    )
    async def test_invalid_conversation_ids_are_rejected(
        self, service: TranscriptService, namespace: str, bad: str
    ) -> None:
        with pytest.raises(DomainError) as caught:
            await service.get_conversation(namespace, bad)
        assert reason_of(caught) == "INVALID_CONVERSATION_ID"

    async def test_conversation_ids_are_case_insensitive(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        found = await service.get_conversation(namespace, cid.upper())
        assert str(found.conversation_id) == cid

    async def test_list_entries_pages_with_tokens_bound_to_the_request(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(str(i)) for i in range(25)], "")
        seen, token = [], ""
        while True:
            page = await service.list_entries(namespace, cid, 3, 0, 10, token)
            seen += [e.sequence for e in page.entries]
            token = page.next_page_token
            if not token:
                break
        assert seen == list(range(4, 26))
        first = await service.list_entries(namespace, cid, 0, 0, 5, "")
        for args in [
            (namespace + "x", cid, 0, 0, 5),
            (namespace, cid, 1, 0, 5),
            (namespace, cid, 0, 7, 5),
        ]:
            with pytest.raises(DomainError) as caught:
                await service.list_entries(*args, first.next_page_token)
            assert reason_of(caught) in {"INVALID_PAGE_TOKEN", "CONVERSATION_NOT_FOUND"}
        tampered = (
            first.next_page_token[:-2]
            + ("A" if first.next_page_token[-2] != "A" else "B")
            + first.next_page_token[-1]
        )
        with pytest.raises(DomainError) as caught:
            await service.list_entries(namespace, cid, 0, 0, 5, tampered)
        assert reason_of(caught) == "INVALID_PAGE_TOKEN"
        bounded = await service.list_entries(namespace, cid, 0, 7, 0, "")
        assert [e.sequence for e in bounded.entries] == list(range(1, 8))

    async def test_list_conversations_pages_inside_the_namespace(
        self, service: TranscriptService, namespace: str
    ) -> None:
        made = {await new_conversation(service, namespace) for _ in range(7)}
        await new_conversation(service, namespace + "-other")
        seen, token = [], ""
        while True:
            page = await service.list_conversations(namespace, 3, token)
            seen += [str(c.conversation_id) for c in page.conversations]
            token = page.next_page_token
            if not token:
                break
        assert set(seen) == made and seen == sorted(seen, key=uuid.UUID)
        with pytest.raises(DomainError) as caught:
            await service.list_conversations(
                namespace + "-other",
                3,
                (await service.list_conversations(namespace, 3, "")).next_page_token,
            )
        assert reason_of(caught) == "INVALID_PAGE_TOKEN"

    async def test_delete_erases_entries_and_is_idempotent(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant()], "r")
        assert await service.delete_conversation(namespace, cid) == 2
        assert await service.delete_conversation(namespace, cid) is None
        with pytest.raises(DomainError):
            await service.get_conversation(namespace, cid)
        # Re-creating the id starts a new, empty transcript.
        conversation, created = await service.create_conversation(namespace, cid, {})
        assert created and conversation.version == 0
        again = await service.append(namespace, cid, 0, [user()], "r")
        assert not again.replayed and again.record.version == 1

    # -- views ------------------------------------------------------------------

    async def test_view_splits_window_buffer_and_backlog(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(str(i)) for i in range(1, 101)], "")
        view = await service.load_view(namespace, cid, 16, 30, 10)
        assert view.version == 1 and view.last_sequence == 100
        assert [e.sequence for e in view.window] == list(range(85, 101))
        assert [e.sequence for e in view.summary_buffer] == list(range(11, 41))
        assert view.summary_backlog == 84 - 40
        caught_up = await service.load_view(namespace, cid, 16, 100, 84)
        assert caught_up.summary_buffer == [] and caught_up.summary_backlog == 0
        short = await service.load_view(namespace, cid, 200, 10, 0)
        assert len(short.window) == 100 and short.summary_buffer == []

    async def test_empty_conversation_view(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        view = await service.load_view(namespace, cid, 16, 16, 0)
        assert (
            view.version,
            view.last_sequence,
            list(view.window),
            list(view.summary_buffer),
            view.summary_backlog,
        ) == (0, 0, [], [], 0)

    async def test_window_never_starts_with_an_orphaned_tool_result(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(
            namespace,
            cid,
            0,
            [
                user("q"),
                assistant("", "a", "b"),
                tool("a"),
                tool("b"),
                assistant("answer"),
            ],
            "",
        )
        # Window 3 would start at the first result (3): it starts after the results.
        view = await service.load_view(namespace, cid, 3, 10, 0)
        assert [e.sequence for e in view.window] == [5]
        assert [e.sequence for e in view.summary_buffer] == [1, 2, 3, 4]
        # Window 2 would start at a result with nothing after the group but the answer.
        view = await service.load_view(namespace, cid, 2, 10, 0)
        assert [e.sequence for e in view.window] == [5]
        await service.append(namespace, cid, 1, [user("q2"), assistant("", "c")], "")
        await service.append(namespace, cid, 2, [tool("c")], "")
        # The transcript ends inside a group: shrinking would empty the window,
        # so it starts at the call instead.
        view = await service.load_view(namespace, cid, 1, 10, 0)
        assert [e.sequence for e in view.window] == [7, 8]
        assert view.window[0].message.tool_calls

    async def test_buffer_never_separates_a_tool_call_from_its_results(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(
            namespace,
            cid,
            0,
            [
                user("1"),
                user("2"),
                assistant("", "a", "b"),
                tool("a"),
                tool("b"),
                user("6"),
                user("7"),
                user("8"),
            ],
            "",
        )
        # A batch of 4 would end after result "a": it ends before the call.
        view = await service.load_view(namespace, cid, 1, 4, 0)
        assert [e.sequence for e in view.summary_buffer] == [1, 2]
        assert view.summary_backlog == 7 - 2
        # From the call on, a batch of 1 cannot shrink: it takes the whole group.
        view = await service.load_view(namespace, cid, 1, 1, 2)
        assert [e.sequence for e in view.summary_buffer] == [3, 4, 5]
        assert view.summary_backlog == 2

    async def test_view_reports_a_committed_request(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant()], "turn-1", Usage(3, 4, 1))
        view = await service.load_view(namespace, cid, 4, 4, 0, "turn-1")
        assert view.prior_append is not None
        assert (
            view.prior_append.first_sequence,
            view.prior_append.last_sequence,
            view.prior_append.usage,
        ) == (1, 2, Usage(3, 4, 1))
        assert (await service.load_view(namespace, cid, 4, 4, 0, "turn-2")).prior_append is None

    @pytest.mark.parametrize(
        ("window", "batch", "through", "reason"),
        [
            (0, 1, 0, "INVALID_WINDOW"),
            (4097, 1, 0, "INVALID_WINDOW"),
            (1, 0, 0, "INVALID_SUMMARY_BATCH"),
            (1, 4097, 0, "INVALID_SUMMARY_BATCH"),
            (1, 1, -1, "INVALID_SEQUENCE"),
            (1, 1, 99, "SEQUENCE_OUT_OF_RANGE"),
        ],
    )
    async def test_view_bounds(
        self,
        service: TranscriptService,
        namespace: str,
        window: int,
        batch: int,
        through: int,
        reason: str,
    ) -> None:
        cid = await new_conversation(service, namespace)
        with pytest.raises(DomainError) as caught:
            await service.load_view(namespace, cid, window, batch, through)
        assert reason_of(caught) == reason
