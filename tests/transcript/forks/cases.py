"""ForkConversation and the reads of a fork (ListEntries, LoadView, the append's tail
check), run against every TranscriptStore: test_forks_domain.py on the in-memory store,
test_forks_store.py on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from services.common.domain import Entry
from services.common.errors import Code, DomainError, VersionConflict
from services.transcript.service import TranscriptService
from tests.transcript.support import (
    ServiceCases,
    assistant,
    created,
    delta,
    new_conversation,
    reason_of,
    tool,
    user,
)


async def entries_of(service: TranscriptService, namespace: str, cid: str) -> list[Entry]:
    """Every entry, through pages of 3 (so that a page crosses a fork point)."""
    found: list[Entry] = []
    token = ""
    while True:
        page = await service.list_entries(namespace, cid, 0, 0, 3, token)
        found.extend(page.entries)
        token = page.next_page_token
        if not token:
            return found


def texts(entries: list[Entry]) -> list[str]:
    return [entry.message.text for entry in entries]


async def three_appends(service: TranscriptService, namespace: str) -> str:
    """A source: v1 = 1..2, v2 = 3..5, v3 = 6."""
    cid = await new_conversation(service, namespace)
    await service.append(namespace, cid, 0, [user("u1"), assistant("a1")], "")
    await service.append(namespace, cid, 1, [user("u2"), assistant("a2"), user("u3")], "")
    await service.append(namespace, cid, 2, [assistant("a3")], "")
    return cid


class ForkCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_a_fork_shares_the_prefix_and_continues_after_it(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        before = await entries_of(service, namespace, source)
        # Inside the second append (3..5): the fork keeps 3..4 of it.
        fork, made = await service.fork_conversation(namespace, source, 4)
        assert made and fork.fork_origin is not None
        assert str(fork.fork_origin.conversation_id) == source
        assert fork.fork_origin.through_sequence == 4
        # Version 1 lies wholly in the prefix; the fork itself is version 2.
        assert (fork.version, fork.last_sequence) == (2, 4)
        fid = str(fork.conversation_id)
        assert texts(await entries_of(service, namespace, fid)) == ["u1", "a1", "u2", "a2"]
        result = await service.append(namespace, fid, 2, [assistant("other")], "")
        assert (result.record.version, result.record.first_sequence) == (3, 5)
        assert texts(await entries_of(service, namespace, fid)) == [
            "u1", "a1", "u2", "a2", "other"
        ]  # fmt: skip
        # The source never changes.
        assert await entries_of(service, namespace, source) == before
        got = await service.get_conversation(namespace, source)
        assert (got.version, got.last_sequence, got.fork_origin) == (3, 6, None)
        assert (await service.get_conversation(namespace, fid)).fork_origin == fork.fork_origin

    async def test_fork_at_the_end_and_at_the_start(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        end, _ = await service.fork_conversation(namespace, source, 6)
        assert (end.version, end.last_sequence) == (4, 6)
        assert texts(await entries_of(service, namespace, str(end.conversation_id))) == texts(
            await entries_of(service, namespace, source)
        )
        # At an append's end: that append is in the prefix, nothing is cut.
        boundary, _ = await service.fork_conversation(namespace, source, 5)
        assert (boundary.version, boundary.last_sequence) == (3, 5)
        start, _ = await service.fork_conversation(namespace, source, 0)
        assert (start.version, start.last_sequence) == (1, 0)
        sid = str(start.conversation_id)
        assert await entries_of(service, namespace, sid) == []
        await service.append(namespace, sid, 1, [user("fresh")], "")
        assert texts(await entries_of(service, namespace, sid)) == ["fresh"]

    async def test_fork_copies_the_state_at_the_fork_point(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await created(service, namespace)
        await service.append(namespace, source, 0, [user("u1")], "", state=delta({"a": 1}))
        await service.append(
            namespace, source, 1, [user("u2"), user("u3")], "", state=delta({"a": 2, "b": 1})
        )
        await service.append(namespace, source, 2, [user("u4")], "")

        async def state_at(through: int) -> dict[str, object]:
            fork, _ = await service.fork_conversation(namespace, source, through)
            assert fork.user_id == "alice"
            got = await service.get_conversation(namespace, str(fork.conversation_id))
            assert got.state_json == fork.state_json
            state: dict[str, object] = json.loads(fork.state_json)
            return state

        assert await state_at(0) == {}
        assert await state_at(1) == {"a": 1}
        # Cutting the second append leaves its state change out: the source's, after.
        assert await state_at(2) == {"a": 1}
        assert await state_at(3) == {"a": 2, "b": 1}
        assert await state_at(4) == {"a": 2, "b": 1}
        # A state change of the fork is its own.
        fork, _ = await service.fork_conversation(namespace, source, 4)
        fid = str(fork.conversation_id)
        await service.append(namespace, fid, fork.version, [], "", state=delta({"a": 3}))
        assert json.loads((await service.get_conversation(namespace, source)).state_json)["a"] == 2
        assert json.loads((await service.get_conversation(namespace, fid)).state_json)["a"] == 3
        # ...and a fork of the fork at its end takes it.
        again, _ = await service.fork_conversation(namespace, fid, 4)
        assert json.loads(again.state_json)["a"] == 3

    async def test_fork_is_idempotent_by_request_id(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        first, made = await service.fork_conversation(namespace, source, 3, "", "edit-1")
        again, made_again = await service.fork_conversation(namespace, source, 3, "", "edit-1")
        assert made and not made_again
        assert again.conversation_id == first.conversation_id
        with pytest.raises(DomainError) as reused:
            await service.fork_conversation(namespace, source, 4, "", "edit-1")
        assert reason_of(reused) == "REQUEST_ID_REUSED"
        # Per source: another source may use the same request id.
        other = await three_appends(service, namespace)
        _, made_other = await service.fork_conversation(namespace, other, 3, "", "edit-1")
        assert made_other
        # A new id that names another conversation.
        with pytest.raises(DomainError) as exists:
            await service.fork_conversation(namespace, source, 3, other)
        assert reason_of(exists) == "CONVERSATION_EXISTS"
        chosen = str(uuid.uuid4())
        named, _ = await service.fork_conversation(namespace, source, 3, chosen, "edit-2")
        assert str(named.conversation_id) == chosen
        repeat, made_repeat = await service.fork_conversation(
            namespace, source, 3, chosen, "edit-2"
        )
        assert not made_repeat and repeat.conversation_id == named.conversation_id

    async def test_fork_refuses_what_it_cannot_fork(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        with pytest.raises(DomainError) as beyond:
            await service.fork_conversation(namespace, source, 7)
        assert reason_of(beyond) == "SEQUENCE_OUT_OF_RANGE"
        assert beyond.value.metadata["last_sequence"] == "6"
        with pytest.raises(DomainError) as negative:
            await service.fork_conversation(namespace, source, -1)
        assert reason_of(negative) == "INVALID_SEQUENCE"
        with pytest.raises(DomainError) as elsewhere:
            await service.fork_conversation(namespace + "-other", source, 1)
        assert reason_of(elsewhere) == "CONVERSATION_NOT_FOUND"

    async def test_fork_of_a_fork(self, service: TranscriptService, namespace: str) -> None:
        source = await three_appends(service, namespace)
        first, _ = await service.fork_conversation(namespace, source, 4)
        fid = str(first.conversation_id)
        await service.append(namespace, fid, 2, [assistant("f5"), user("f6")], "")
        await service.append(namespace, fid, 3, [assistant("f7")], "")
        # Inside the first fork's own append: the source's 1..4, the fork's 5.
        second, _ = await service.fork_conversation(namespace, fid, 5)
        assert (second.version, second.last_sequence) == (3, 5)
        sid = str(second.conversation_id)
        await service.append(namespace, sid, 3, [user("s6")], "")
        assert texts(await entries_of(service, namespace, sid)) == [
            "u1", "a1", "u2", "a2", "f5", "s6"
        ]  # fmt: skip
        # Inside the first fork's prefix: only the source's entries.
        third, _ = await service.fork_conversation(namespace, fid, 3)
        assert (third.version, third.last_sequence) == (2, 3)
        assert texts(await entries_of(service, namespace, str(third.conversation_id))) == [
            "u1", "a1", "u2"
        ]  # fmt: skip
        assert texts(await entries_of(service, namespace, fid)) == [
            "u1", "a1", "u2", "a2", "f5", "f6", "f7"
        ]  # fmt: skip
        view = await service.load_view(namespace, sid, 4, 1, 0)
        assert [e.sequence for e in view.window] == [3, 4, 5, 6]
        assert texts(list(view.window)) == ["u2", "a2", "f5", "s6"]

    async def test_a_view_of_a_fork_reaches_into_the_prefix(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await new_conversation(service, namespace)
        for i in range(10):
            await service.append(namespace, source, i, [user(f"s{i + 1}")], "")
        fork, _ = await service.fork_conversation(namespace, source, 6)
        fid = str(fork.conversation_id)
        await service.append(namespace, fid, fork.version, [user("f7"), user("f8")], "")
        view = await service.load_view(namespace, fid, 5, 2, 1)
        assert texts(list(view.window)) == ["s4", "s5", "s6", "f7", "f8"]
        assert texts(list(view.summary_buffer)) == ["s2", "s3"]
        assert view.summary_backlog == 0
        assert view.version == fork.version + 1 and view.last_sequence == 8
        # Entirely in the prefix, and entirely after it.
        assert texts(list((await service.load_view(namespace, fid, 8, 1, 0)).window))[:2] == [
            "s1",
            "s2",
        ]
        assert texts(list((await service.load_view(namespace, fid, 2, 1, 0)).window)) == [
            "f7",
            "f8",
        ]
        # ListEntries between two sequences across the fork point.
        page = await service.list_entries(namespace, fid, 4, 7, 0, "")
        assert texts(list(page.entries)) == ["s5", "s6", "f7"]

    async def test_fork_at_a_tool_call_takes_its_results(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await new_conversation(service, namespace)
        await service.append(namespace, source, 0, [user("q"), assistant("", "c1")], "")
        await service.append(namespace, source, 1, [tool("c1", "from the source")], "")
        fork, _ = await service.fork_conversation(namespace, source, 2)
        fid = str(fork.conversation_id)
        # The tool call is at the fork's tail (in the prefix): its result continues it.
        await service.append(namespace, fid, None, [tool("c1", "another answer")], "")
        view = await service.load_view(namespace, fid, 1, 1, 0)
        assert texts(list(view.window)) == ["", "another answer"]
        with pytest.raises(DomainError) as unpaired:
            await service.append(namespace, fid, None, [tool("c1", "again")], "")
        assert reason_of(unpaired) == "ORPHANED_TOOL_RESULT"

    async def test_retractions_stay_with_their_conversation(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        await service.append(namespace, source, 3, [], "", retract=[1])
        fork, _ = await service.fork_conversation(namespace, source, 6)
        fid = str(fork.conversation_id)
        # The source retracts after the fork point: not the fork's.
        await service.append(namespace, source, 4, [], "", retract=[3])
        marks = {e.sequence: e.retracted_version for e in await entries_of(service, namespace, fid)}
        assert marks[1] == 4 and marks[3] == 0
        # The fork cannot retract a shared entry (the source's row), only its own.
        with pytest.raises(DomainError) as shared:
            await service.append(namespace, fid, fork.version, [], "", retract=[2])
        assert reason_of(shared) == "ENTRY_NOT_RETRACTABLE"
        await service.append(namespace, fid, fork.version, [user("own")], "")
        await service.append(namespace, fid, fork.version + 1, [], "", retract=[7])
        own = await entries_of(service, namespace, fid)
        assert own[-1].retracted_version == fork.version + 2
        source_marks = {
            e.sequence: e.retracted_version for e in await entries_of(service, namespace, source)
        }
        assert source_marks == {1: 4, 2: 0, 3: 5, 4: 0, 5: 0, 6: 0}
        view = await service.load_view(namespace, fid, 10, 1, 0)
        assert [e.sequence for e in view.window] == [2, 3, 4, 5, 6]

    async def test_fork_and_source_compare_and_swap_apart(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        fork, _ = await service.fork_conversation(namespace, source, 4)
        fid = str(fork.conversation_id)

        async def race(cid: str, version: int, tag: str) -> list[bool]:
            async def one(i: int) -> bool:
                try:
                    await service.append(namespace, cid, version, [user(f"{tag}{i}")], "")
                except VersionConflict:
                    return False
                return True

            return list(await asyncio.gather(*(one(i) for i in range(6))))

        for _ in range(3):
            source_version = (await service.get_conversation(namespace, source)).version
            fork_version = (await service.get_conversation(namespace, fid)).version
            results = await asyncio.gather(
                race(source, source_version, "s"), race(fid, fork_version, "f")
            )
            # Exactly one winner on each: neither conversation's writers see the other's.
            assert [r.count(True) for r in results] == [1, 1]
        source_entries = await entries_of(service, namespace, source)
        fork_entries = await entries_of(service, namespace, fid)
        assert [e.sequence for e in source_entries] == list(range(1, 10))
        assert [e.sequence for e in fork_entries] == list(range(1, 8))
        assert all(t.startswith("s") for t in texts(source_entries)[6:])
        assert all(t.startswith("f") for t in texts(fork_entries)[4:])

    async def test_erasing_a_conversation_erases_its_forks(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await three_appends(service, namespace)
        first, _ = await service.fork_conversation(namespace, source, 4)
        fid = str(first.conversation_id)
        await service.append(namespace, fid, 2, [user("f5")], "")
        second, _ = await service.fork_conversation(namespace, fid, 5)
        unrelated = await three_appends(service, namespace)
        other_fork, _ = await service.fork_conversation(namespace, unrelated, 2)
        # What erasing it would erase with it: every fork, at any depth, a fork before its
        # own, each with its incarnation and source (AgentService erases what was derived
        # from them first); the unrelated conversation's fork is not among them.
        listed = (await service.list_forks(namespace, source)).forks
        assert [
            (str(f.conversation_id), f.incarnation, str(f.source_id), f.through_sequence)
            for f in listed
        ] == [
            (fid, first.incarnation, source, 4),
            (str(second.conversation_id), second.incarnation, fid, 5),
        ]
        assert [
            str(f.conversation_id) for f in (await service.list_forks(namespace, fid)).forks
        ] == [str(second.conversation_id)]
        assert (await service.list_forks(namespace, str(second.conversation_id))).forks == []
        assert (await service.list_forks(namespace, str(uuid.uuid4()))).forks == []
        # Erasing a fork leaves its source.
        lone, _ = await service.fork_conversation(namespace, source, 1)
        lone_erased = await service.delete_conversation(namespace, str(lone.conversation_id))
        assert (lone_erased.entries, lone_erased.appends, lone_erased.forks) == (0, 1, 0)
        assert (await service.get_conversation(namespace, source)).last_sequence == 6
        # The source's 6 entries and 3 appends; the first fork's own entry and its 2 own
        # appends (the fork append and one); the second fork's fork append; 2 forks.
        erased = await service.delete_conversation(namespace, source)
        assert (erased.entries, erased.appends, erased.forks) == (7, 6, 2)
        for gone in (source, fid, str(second.conversation_id)):
            with pytest.raises(DomainError) as error:
                await service.get_conversation(namespace, gone)
            assert reason_of(error) == "CONVERSATION_NOT_FOUND"
        assert texts(await entries_of(service, namespace, str(other_fork.conversation_id))) == [
            "u1",
            "a1",
        ]
        # A conversation made again under the source's id has no forks.
        await service.create_conversation(namespace, source, {})
        assert await entries_of(service, namespace, source) == []
        assert (await service.list_forks(namespace, source)).forks == []

    async def test_a_deletion_naming_its_erased_forks_refuses_a_fork_not_among_them(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """An erasure's deletion names the forks whose derived data it erased: a fork made
        since (here a fork of a fork) makes it FORKS_CHANGED in its transaction, and nothing
        is deleted; named (a fork erased meanwhile need not be), it deletes them all."""
        source = await three_appends(service, namespace)
        first, _ = await service.fork_conversation(namespace, source, 4)
        gone, _ = await service.fork_conversation(namespace, source, 2)
        listed = [
            (str(f.conversation_id), f.incarnation)
            for f in (await service.list_forks(namespace, source)).forks
        ]
        late, _ = await service.fork_conversation(namespace, str(first.conversation_id), 3)
        with pytest.raises(DomainError) as error:
            await service.delete_conversation(namespace, source, erased_forks=listed)
        assert (error.value.code, reason_of(error)) == (Code.FAILED_PRECONDITION, "FORKS_CHANGED")
        assert error.value.metadata["forks_not_erased"] == "1"
        for kept in (source, str(first.conversation_id), str(late.conversation_id)):
            assert (await service.get_conversation(namespace, kept)).conversation_id
        # The same fork id made again (a new incarnation) is another fork.
        await service.delete_conversation(namespace, str(gone.conversation_id))
        stale = [(fid, inc + 1) for fid, inc in listed]
        with pytest.raises(DomainError) as error:
            await service.delete_conversation(namespace, source, erased_forks=stale)
        assert reason_of(error) == "FORKS_CHANGED"
        everything = [*listed, (str(late.conversation_id), late.incarnation)]
        erased = await service.delete_conversation(namespace, source, erased_forks=everything)
        assert erased.deleted and erased.forks == 2

    async def test_forks_are_listed_in_pages_in_the_order_they_were_made(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """ListForks pages (AIP-158) in the order forks were made, a fork before its own
        forks even when it was made after its source's other forks; the token is bound to
        its listing."""
        source = await three_appends(service, namespace)
        first, _ = await service.fork_conversation(namespace, source, 2)
        second, _ = await service.fork_conversation(namespace, source, 4)
        # A fork of the first fork, made after the second: key order, not level order.
        nested, _ = await service.fork_conversation(namespace, str(first.conversation_id), 1)
        third, _ = await service.fork_conversation(namespace, source, 6)
        made = [str(c.conversation_id) for c in (first, second, nested, third)]
        listed: list[str] = []
        token = ""
        pages = 0
        while pages < 3:  # at most one page more than needed: no endless listing
            page = await service.list_forks(namespace, source, 3, token)
            assert len(page.forks) <= 3
            listed.extend(str(f.conversation_id) for f in page.forks)
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert (listed, pages) == (made, 2)
        everything = await service.list_forks(namespace, source)
        assert [str(f.conversation_id) for f in everything.forks] == made
        assert everything.next_page_token == ""
        # A page that holds the last fork has no token.
        full = await service.list_forks(namespace, source, 4)
        assert full.next_page_token == ""
        first_page = await service.list_forks(namespace, source, 1)
        with pytest.raises(DomainError) as error:
            await service.list_forks(namespace, made[0], 1, first_page.next_page_token)
        assert reason_of(error) == "INVALID_PAGE_TOKEN"
        with pytest.raises(DomainError) as error:
            await service.list_forks(namespace, source, -1)
        assert reason_of(error) == "INVALID_PAGE_SIZE"
