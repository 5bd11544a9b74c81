"""Conversations (create, get, list, erase; the state of a user and of a namespace), run
against every TranscriptStore: test_conversations_domain.py on the in-memory store,
test_conversations_store.py on PostgreSQL.
"""

from __future__ import annotations

import json
import uuid

import pytest

from services.common.errors import Code, DomainError
from services.transcript.conversations.model import (
    PREVIEW_CHARS,
    PREVIEW_ENTRIES,
    ConversationOrder,
)
from services.transcript.service import TranscriptService
from tests.transcript.support import (
    ServiceCases,
    assistant,
    created,
    delta,
    new_conversation,
    reason_of,
    user,
)

NEWEST = int(ConversationOrder.NEWEST_FIRST)


class ConversationCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

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
        assert not (await service.delete_conversation(other, cid)).deleted
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
        erased = await service.delete_conversation(namespace, cid)
        assert (erased.deleted, erased.entries, erased.appends, erased.receipt) == (
            True,
            2,
            1,
            None,
        )
        assert not (await service.delete_conversation(namespace, cid)).deleted
        with pytest.raises(DomainError):
            await service.get_conversation(namespace, cid)
        # Re-creating the id starts a new, empty transcript.
        conversation, created = await service.create_conversation(namespace, cid, {})
        assert created and conversation.version == 0
        again = await service.append(namespace, cid, 0, [user()], "r")
        assert not again.replayed and again.record.version == 1

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

    # -- listings for people: newest first, previews, namespaces ------------------------

    async def test_newest_first_pages_by_creation_time_and_continues_only_that_order(
        self, service: TranscriptService, namespace: str
    ) -> None:
        # Ids that do not sort by creation (random UUIDs, as clients often give).
        made = []
        for _ in range(7):
            conversation, _ = await service.create_conversation(namespace, str(uuid.uuid4()), {})
            made.append(conversation)
        await new_conversation(service, namespace + "-other")
        seen, token = [], ""
        while True:
            page = await service.list_conversations(namespace, 3, token, order=NEWEST)
            seen += list(page.conversations)
            token = page.next_page_token
            if not token:
                break
        expected = sorted(made, key=lambda c: (c.create_time, c.conversation_id), reverse=True)
        assert [c.conversation_id for c in seen] == [c.conversation_id for c in expected]
        first = await service.list_conversations(namespace, 3, "", order=NEWEST)
        with pytest.raises(DomainError) as caught:
            await service.list_conversations(namespace, 3, first.next_page_token)
        assert reason_of(caught) == "INVALID_PAGE_TOKEN"
        by_id = await service.list_conversations(namespace, 3, "")
        with pytest.raises(DomainError) as caught:
            await service.list_conversations(namespace, 3, by_id.next_page_token, order=NEWEST)
        assert reason_of(caught) == "INVALID_PAGE_TOKEN"
        with pytest.raises(DomainError) as caught:
            await service.list_conversations(namespace, 3, "", order=7)
        assert reason_of(caught) == "INVALID_ORDER"

    async def test_newest_first_of_one_user(
        self, service: TranscriptService, namespace: str
    ) -> None:
        alice = [await created(service, namespace) for _ in range(3)]
        await created(service, namespace, "bob")
        page = await service.list_conversations(namespace, 2, "", "alice", order=NEWEST)
        rest = await service.list_conversations(
            namespace, 2, page.next_page_token, "alice", order=NEWEST
        )
        listed = [str(c.conversation_id) for c in [*page.conversations, *rest.conversations]]
        assert sorted(listed) == sorted(alice) and not rest.next_page_token
        times = [c.create_time for c in [*page.conversations, *rest.conversations]]
        assert times == sorted(times, reverse=True)

    async def test_a_preview_is_the_first_standing_user_message_clipped(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """The first user message (not a tool's or the assistant's, not a retracted one),
        whitespace made single spaces, at most PREVIEW_CHARS characters; none when there
        is no user message among the first PREVIEW_ENTRIES entries. Markup stays text."""
        hostile = '<script>alert("x")</script>\n\n  first   line'
        plain = await new_conversation(service, namespace)
        await service.append(namespace, plain, 0, [user(hostile), assistant("ok")], "")
        await service.append(namespace, plain, 1, [user("second question")], "")
        long = await new_conversation(service, namespace)
        await service.append(namespace, long, 0, [user("word " * 100)], "")
        exact = await new_conversation(service, namespace)
        await service.append(namespace, exact, 0, [user("x" * PREVIEW_CHARS)], "")
        retracted = await new_conversation(service, namespace)
        await service.append(namespace, retracted, 0, [user("secret"), user("kept")], "")
        await service.append(namespace, retracted, 1, [], "", retract=[1])
        late = await new_conversation(service, namespace)
        await service.append(
            namespace, late, 0, [assistant(f"a{i}") for i in range(PREVIEW_ENTRIES)], ""
        )
        await service.append(namespace, late, 1, [user("too late to preview")], "")
        empty = await new_conversation(service, namespace)

        page = await service.list_conversations(namespace, 0, "")
        previews = {str(c.conversation_id): c.preview for c in page.conversations}
        assert previews[plain] == '<script>alert("x")</script> first line'
        clipped = previews[long]
        assert len(clipped) == PREVIEW_CHARS and clipped.endswith("\u2026")
        assert clipped.startswith("word word ")
        assert previews[exact] == "x" * PREVIEW_CHARS
        assert previews[retracted] == "kept"
        assert previews[late] == "" and previews[empty] == ""
        # Newest first and with the state alike; GetConversation has none.
        newest = await service.list_conversations(namespace, 0, "", order=NEWEST)
        assert {str(c.conversation_id): c.preview for c in newest.conversations} == previews
        full = await service.list_conversations(namespace, 0, "", with_state=True)
        assert {str(c.conversation_id): c.preview for c in full.conversations} == previews
        assert (await service.get_conversation(namespace, plain)).preview == ""

    async def test_namespaces_with_conversations_are_listed_by_name_among_the_grants(
        self, service: TranscriptService, namespace: str
    ) -> None:
        names = [f"{namespace}-{letter}" for letter in "abcde"]
        for name in names:
            await new_conversation(service, name)
        gone = f"{namespace}-f"
        await service.delete_conversation(gone, await new_conversation(service, gone))
        # Every namespace (authentication off): paged in name order, ours among them.
        listed: list[str] = []
        token = ""
        while True:
            page = await service.list_namespaces(2, token, None)
            listed += page.namespaces
            token = page.next_page_token
            if not token:
                break
        assert listed == sorted(set(listed))
        assert [n for n in listed if n.startswith(namespace)] == names
        # Among an identity's grants: only those, only with conversations.
        granted = frozenset({names[3], names[1], gone, namespace + "-never"})
        page = await service.list_namespaces(1, "", granted)
        assert page.namespaces == [names[1]] and page.next_page_token
        rest = await service.list_namespaces(5, page.next_page_token, granted)
        assert rest.namespaces == [names[3]] and not rest.next_page_token
        # A token continues the listing of the same grants only.
        for other in (None, frozenset({names[1]})):
            with pytest.raises(DomainError) as caught:
                await service.list_namespaces(5, page.next_page_token, other)
            assert reason_of(caught) == "INVALID_PAGE_TOKEN"
        assert (await service.list_namespaces(0, "", frozenset())).namespaces == []
