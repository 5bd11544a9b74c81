"""The memory writes (UpsertMemory with its sources, validity and supersession,
DeleteMemory, ForgetSource, expiry, request ids, erasures), run against every
MemoryStore.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.common.errors import Code, DomainError
from services.memory.model import ExternalSource, MemorySource
from services.memory.outbox.indexer import Sweeper
from services.memory.writes.inputs import SourceInput, SupersedeInput, ValidityInput
from services.memory.writes.model import MemoryWrite
from tests.memory.cases import BERLIN, PARIS, World, WorldCases, ids, reason
from tests.memory.support import entry_time


class WriteCases(WorldCases):
    """Subclasses provide a `store` fixture."""

    async def test_create_then_compare_and_swap(self, world: World) -> None:
        ns = world.namespace
        written = await world.service.upsert(
            ns, "", "Likes jazz.", world.source(), {"k": "v"}, None
        )
        memory = written.memory
        assert written.created and memory.revision == 1 and memory.memory_id.version == 7
        assert memory.embedding_model == "test/hash-words" and memory.embedding_dimension == 64
        replaced = await world.service.upsert(
            ns, str(memory.memory_id), "Likes bebop.", world.source(), {}, 1
        )
        updated = replaced.memory
        assert not replaced.created and updated.revision == 2 and updated.metadata == {}
        with pytest.raises(DomainError) as conflict:
            await world.service.upsert(ns, str(memory.memory_id), "x", world.source(), {}, 1)
        assert reason(conflict) == (Code.ABORTED, "REVISION_CONFLICT")
        assert conflict.value.metadata["current_revision"] == "2"
        with pytest.raises(DomainError) as exists:
            await world.service.upsert(ns, str(memory.memory_id), "x", world.source(), {}, None)
        assert reason(exists) == (Code.ALREADY_EXISTS, "MEMORY_ALREADY_EXISTS")
        with pytest.raises(DomainError) as missing:
            await world.service.upsert(ns, str(uuid.uuid4()), "x", world.source(), {}, 1)
        assert reason(missing) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")

    async def test_racing_writers_one_wins(self, world: World) -> None:
        mid = await world.add("Start.")

        async def write(i: int) -> object:
            try:
                return await world.service.upsert(
                    world.namespace, str(mid), f"v{i}", world.source(), {}, 1
                )
            except DomainError as error:
                return error

        results = await asyncio.gather(*(write(i) for i in range(6)))
        errors = [r for r in results if isinstance(r, DomainError)]
        assert len(errors) == 5 and all(e.reason == "REVISION_CONFLICT" for e in errors)

    async def test_sources_are_checked(self, world: World) -> None:
        ns = world.namespace
        elsewhere = world.sources.add(f"{ns}-other", 10)
        cases = [
            (world.source(5, 11), (Code.INVALID_ARGUMENT, "SOURCE_OUT_OF_RANGE")),
            (world.source(5, 4), (Code.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE")),
            (world.source(cid=elsewhere), (Code.NOT_FOUND, "SOURCE_NOT_FOUND")),
            ([], (Code.INVALID_ARGUMENT, "NO_SOURCES")),
            (world.source() * 33, (Code.INVALID_ARGUMENT, "TOO_MANY_SOURCES")),
        ]
        for sources, expected in cases:
            with pytest.raises(DomainError) as error:
                await world.service.upsert(ns, "", "A fact.", sources, {}, None)
            assert reason(error) == expected
        assert await world.store.list_memories(ns, None, None, 10) == []

    async def test_a_source_beyond_the_transcript_says_where_it_ends(self, world: World) -> None:
        with pytest.raises(DomainError) as error:
            await world.service.upsert(
                world.namespace, "", "A fact.", world.source(5, 11), {}, None
            )
        assert error.value.metadata["last_sequence"] == "10"
        assert "through_sequence 11" in error.value.message
        assert "last sequence is 10" in error.value.message

    async def test_delete_leaves_a_tombstone_and_erases_history_content(self, world: World) -> None:
        ns = world.namespace
        mid = await world.add("Secret 1.")
        await world.service.upsert(ns, str(mid), "Secret 2.", world.source(), {}, 1)
        with pytest.raises(DomainError) as stale:
            await world.service.delete(ns, str(mid), 1)
        assert reason(stale) == (Code.ABORTED, "REVISION_CONFLICT")
        assert await world.service.delete(ns, str(mid), 2)
        assert not await world.service.delete(ns, str(mid), None)
        history = await world.store.history(ns, mid)
        assert [(h.revision, h.kind, h.content) for h in history] == [
            (1, "write", None),
            (2, "write", None),
            (3, "delete", None),
        ]
        with pytest.raises(DomainError) as gone:
            await world.service.get(ns, str(mid))
        assert reason(gone) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")

    async def test_forget_source_by_range_and_whole(self, world: World) -> None:
        ns = world.namespace
        a = await world.add("A.", sources=world.source(1, 2))
        b = await world.add("B.", sources=world.source(5, 6))
        other = world.sources.add(ns, 3)
        c = await world.add("C.", sources=world.source(1, 1, cid=other))
        assert (await world.service.forget_source(ns, world.cid, 2, 4)).deleted == 1
        assert await world.store.get(ns, a) is None
        assert (await world.service.forget_source(ns, world.cid, 0, 0)).deleted == 1
        assert await world.store.get(ns, b) is None
        assert await world.store.get(ns, c) is not None
        with pytest.raises(DomainError) as bad:
            await world.service.forget_source(ns, world.cid, 0, 3)
        assert reason(bad) == (Code.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE")

    async def test_expired_memories_are_invisible_swept_and_their_ids_reusable(
        self, world: World
    ) -> None:
        ns = world.namespace
        mid = uuid.uuid4()
        past = datetime.now(UTC) - timedelta(seconds=1)
        origin = [MemorySource(uuid.UUID(world.cid), 1, 1)]
        # Written straight to the store: the service refuses a past expiry.
        await world.store.create(MemoryWrite(ns, mid, "Old.", origin, {}, None, past, "m", 1))
        assert await world.store.get(ns, mid) is None
        assert await world.store.list_memories(ns, None, None, 10) == []
        again = await world.add("New.", memory_id=mid)
        assert again == mid
        assert (await world.service.get(ns, str(mid))).revision == 3  # after the tombstone
        other = uuid.uuid4()
        await world.store.create(
            MemoryWrite(
                ns,
                other,
                "Old.",
                [MemorySource(uuid.UUID(world.cid), 1, 1)],
                {},
                None,
                past,
                "m",
                1,
            )
        )
        swept = await Sweeper(world.store, world.config, lambda: None).run_once()
        assert swept >= 1
        assert [h.reason for h in await world.store.history(ns, other)] == ["create", "expired"]

    async def test_default_ttl_per_namespace(self, world: World) -> None:
        ttl_ns = f"{world.namespace}-ttl"
        cid = world.sources.add(ttl_ns, 2)
        before = datetime.now(UTC)
        memory = (
            await world.service.upsert(
                ttl_ns, "", "Short-lived.", [SourceInput(cid, 1, 1)], {}, None
            )
        ).memory
        after = datetime.now(UTC)
        assert memory.expire_time is not None
        # The namespace's TTL counted from the moment of the write, wherever it fell.
        assert before + timedelta(hours=1) <= memory.expire_time <= after + timedelta(hours=1)
        stored = await world.service.get(ttl_ns, str(memory.memory_id))
        assert stored.expire_time == memory.expire_time
        plain = await world.service.get(world.namespace, str(await world.add("Forever.")))
        assert plain.expire_time is None

    async def test_a_request_id_stores_once_and_replays_the_first_result(
        self, world: World
    ) -> None:
        ns = world.namespace

        async def upsert(
            content: str, request_id: str = "r-1", **kw: object
        ) -> tuple[object, bool]:
            written = await world.service.upsert(
                ns,
                str(kw.pop("memory_id", "")),
                content,
                world.source(),
                {},
                kw.pop("expected_revision", None),  # type: ignore[arg-type]
                ttl=timedelta(hours=1),
                request_id_text=request_id,
            )
            return written.memory, written.created

        first, created = await upsert("The user likes tea.")
        # Racing and sequential retries of the same request: the same memory, one row.
        again = await asyncio.gather(*(upsert("The user likes tea.") for _ in range(5)))
        assert created and all(m == first and c for m, c in again)
        page = await world.service.list_memories(ns, 0, "")
        assert [m.memory_id for m in page.memories] == [first.memory_id]  # type: ignore[attr-defined]
        with pytest.raises(DomainError) as reused:
            await upsert("The user likes coffee.")
        assert reason(reused) == (Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
        # A later change does not alter what the first request returns.
        mid = str(first.memory_id)  # type: ignore[attr-defined]
        await upsert("The user likes green tea.", "r-2", memory_id=mid, expected_revision=1)
        replayed, created_again = await upsert("The user likes tea.")
        assert replayed.content == "The user likes tea." and replayed.revision == 1  # type: ignore[attr-defined]
        assert created_again
        # Deleted: the replay finds nothing (and never brings the content back).
        await world.service.delete(ns, mid, None)
        with pytest.raises(DomainError) as gone:
            await upsert("The user likes tea.")
        assert reason(gone) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")
        assert (await world.service.list_memories(ns, 0, "")).memories == []

    async def test_an_erasure_fences_writes_checked_against_the_erased_incarnation(
        self, world: World
    ) -> None:
        """The source check ran (incarnation 1), then the conversation was erased: the
        write is refused, so nothing derived from the erased conversation survives."""
        ns, cid = world.namespace, uuid.UUID(world.cid)
        write = MemoryWrite(
            ns,
            uuid.uuid4(),
            "Checked before the erasure.",
            [MemorySource(cid, 1, 2)],
            {},
            None,
            None,
            "m",
            1,
            source_incarnations={cid: 1},
        )
        await world.service.forget_source(ns, world.cid, 0, 0, incarnation=1)
        with pytest.raises(DomainError) as fenced:
            await world.store.create(write)
        assert reason(fenced) == (Code.NOT_FOUND, "SOURCE_NOT_FOUND")
        assert await world.store.get(ns, write.memory_id) is None
        # The id made again has another incarnation: its memories are stored.
        made = await world.store.create(replace(write, source_incarnations={cid: 2}))
        assert made.created and made.memory.content == "Checked before the erasure."
        with pytest.raises(DomainError) as range_too:
            await world.service.forget_source(ns, world.cid, 1, 2, incarnation=2)
        assert reason(range_too) == (Code.INVALID_ARGUMENT, "INVALID_INCARNATION")

    async def test_valid_time_defaults_to_the_earliest_source_entry(self, world: World) -> None:
        ns = world.namespace
        other = world.sources.add(ns, 10)
        made = await world.service.upsert(
            ns, "", "A fact.", [SourceInput(world.cid, 4, 6), SourceInput(other, 2, 3)], {}, None
        )
        assert made.memory.valid_from_time == entry_time(2)
        assert made.memory.valid_until_time is None and made.memory.superseded_by is None
        # A replace without validity keeps it; with an end, closes it.
        mid = str(made.memory.memory_id)
        kept = await world.service.upsert(ns, mid, "A fact, reworded.", world.source(), {}, 1)
        assert kept.memory.valid_from_time == entry_time(2)
        ended = await world.service.upsert(
            ns,
            mid,
            "A fact, reworded.",
            world.source(),
            {},
            2,
            validity=ValidityInput(valid_until_time=entry_time(8)),
        )
        assert ended.memory.valid_until_time == entry_time(8)
        assert ended.memory.valid_from_time == entry_time(2)
        # An end before the start is refused, given in full, by default, or with the start kept.
        refusals = [
            ("", None, ValidityInput(entry_time(5), entry_time(5))),
            ("", None, ValidityInput(valid_until_time=entry_time(1))),
            (mid, 3, ValidityInput(valid_until_time=entry_time(2))),
        ]
        for memory_id, expected, validity in refusals:
            with pytest.raises(DomainError) as bad:
                await world.service.upsert(
                    ns, memory_id, "x", world.source(), {}, expected, validity=validity
                )
            assert reason(bad) == (Code.INVALID_ARGUMENT, "INVALID_VALIDITY")
        assert (await world.service.get(ns, mid)).revision == 3

    async def test_the_superseded_memory_stays_readable_with_its_validity_closed(
        self, world: World
    ) -> None:
        ns = world.namespace
        paris, berlin = await self.supersede_paris(world)
        old = await world.service.get(ns, str(paris))
        assert (old.content, old.revision) == (PARIS, 2)
        assert (old.valid_from_time, old.valid_until_time) == (entry_time(1), entry_time(5))
        assert old.superseded_by == berlin
        now = await world.service.list_memories(ns, 0, "")
        assert ids(now.memories) == {berlin}
        then = await world.service.list_memories(ns, 0, "", as_of=entry_time(2))
        assert ids(then.memories) == {paris}
        every = await world.service.list_memories(ns, 0, "", ignore_validity=True)
        assert ids(every.memories) == {paris, berlin}
        with pytest.raises(DomainError) as both:
            await world.service.list_memories(ns, 0, "", as_of=entry_time(2), ignore_validity=True)
        assert reason(both) == (Code.INVALID_ARGUMENT, "INVALID_VALIDITY")

    async def test_erasure_removes_history_and_reopens_what_it_superseded(
        self, world: World
    ) -> None:
        ns = world.namespace
        paris, berlin = await self.supersede_paris(world)
        # Erasing the source of the newer fact: it goes, history and all; what it had
        # closed is open again, and its history no longer says by what or when.
        assert (await world.service.forget_source(ns, world.cid, 5, 5)).deleted == 1
        gone = (await world.service.list_revisions(ns, str(berlin), 0, "")).revisions
        assert [(h.kind, h.reason) for h in gone] == [
            ("write", "create"),
            ("delete", "forget_source"),
        ]
        assert all(
            h.erased
            and h.content is None
            and not h.sources
            and (h.valid_from_time, h.valid_until_time, h.superseded_by) == (None, None, None)
            for h in gone
        )
        reopened = await world.service.get(ns, str(paris))
        assert (reopened.revision, reopened.valid_until_time, reopened.superseded_by) == (
            3,
            None,
            None,
        )
        history = (await world.service.list_revisions(ns, str(paris), 0, "")).revisions
        assert [h.reason for h in history] == ["create", "superseded", "reopened"]
        assert all(h.superseded_by is None and h.valid_until_time is None for h in history)
        await world.drain()
        assert await self.found(world) == [paris]
        # Erasing the older fact's source: its history is erased too.
        await world.service.forget_source(ns, world.cid, 0, 0)
        erased = (await world.service.list_revisions(ns, str(paris), 0, "")).revisions
        assert [h.kind for h in erased] == ["write", "write", "write", "delete"]
        assert all(h.erased and h.valid_from_time is None for h in erased)

    async def test_deleting_the_newer_fact_reopens_the_older_one(self, world: World) -> None:
        ns = world.namespace
        paris, berlin = await self.supersede_paris(world)
        assert await world.service.delete(ns, str(berlin), None)
        assert (await world.service.get(ns, str(paris))).valid_until_time is None
        await world.drain()
        assert await self.found(world) == [paris]

    async def test_supersession_is_refused_when_it_cannot_hold(self, world: World) -> None:
        ns = world.namespace
        paris, berlin = await self.supersede_paris(world)
        elsewhere = world.sources.add(f"{ns}-b", 10)
        theirs = (
            await world.service.upsert(
                f"{ns}-b", "", "Their fact.", [SourceInput(elsewhere, 1, 1)], {}, None
            )
        ).memory.memory_id
        rome = await world.add("The user lives in Rome.", sources=world.source(9, 9))
        before = await world.store.backlog()

        async def supersede(*targets: SupersedeInput, **kw: object) -> None:
            await world.service.upsert(
                ns,
                str(kw.pop("memory_id", "")),
                "The user lives in Madrid.",
                kw.pop("sources", None) or world.source(10, 10),  # type: ignore[arg-type]
                {},
                kw.pop("expected_revision", None),  # type: ignore[arg-type]
                validity=ValidityInput(
                    kw.pop("valid_from", None),  # type: ignore[arg-type]
                    supersedes=targets,
                ),
            )

        cases: list[tuple[tuple[SupersedeInput, ...], dict[str, object], tuple[Code, str]]] = [
            # Another namespace's memory, or none: the same NOT_FOUND.
            ((SupersedeInput(str(theirs)),), {}, (Code.NOT_FOUND, "MEMORY_NOT_FOUND")),
            ((SupersedeInput(str(uuid.uuid4())),), {}, (Code.NOT_FOUND, "MEMORY_NOT_FOUND")),
            # Already closed (superseded by Berlin).
            ((SupersedeInput(str(paris)),), {}, (Code.FAILED_PRECONDITION, "VALIDITY_ENDED")),
            # Not at the revision expected.
            ((SupersedeInput(str(berlin), 7),), {}, (Code.ABORTED, "REVISION_CONFLICT")),
            # Valid from after the new fact.
            (
                (SupersedeInput(str(rome)),),
                {"valid_from": entry_time(8)},
                (Code.FAILED_PRECONDITION, "SUPERSEDES_LATER_FACT"),
            ),
            # Itself, twice the same, a bad id.
            (
                (SupersedeInput(str(berlin)),),
                {"memory_id": berlin, "expected_revision": 1},
                (Code.INVALID_ARGUMENT, "SUPERSESSION_CYCLE"),
            ),
            (
                (SupersedeInput(str(rome)), SupersedeInput(str(rome).upper())),
                {},
                (Code.INVALID_ARGUMENT, "INVALID_SUPERSEDES"),
            ),
            ((SupersedeInput("rome"),), {}, (Code.INVALID_ARGUMENT, "INVALID_MEMORY_ID")),
        ]
        for targets, kw, expected in cases:
            with pytest.raises(DomainError) as refused:
                await supersede(*targets, **kw)
            assert reason(refused) == expected, (targets, kw)
        # Each refusal wrote nothing: no new memory, no new revision, no outbox row.
        every = await world.service.list_memories(ns, 0, "", ignore_validity=True)
        assert ids(every.memories) == {paris, berlin, rome}
        assert [(m.memory_id, m.revision) for m in every.memories if m.memory_id == berlin] == [
            (berlin, 1)
        ]
        assert (await world.store.backlog()).depth == before.depth
        # A cycle: Berlin's start moved before Paris's; Paris (superseded by Berlin)
        # superseding Berlin would close a loop.
        await world.service.upsert(
            ns,
            str(berlin),
            BERLIN,
            world.source(5, 5),
            {},
            1,
            validity=ValidityInput(valid_from_time=entry_time(1) - timedelta(hours=1)),
        )
        with pytest.raises(DomainError) as looped:
            await world.service.upsert(
                ns,
                str(paris),
                PARIS,
                world.source(1, 1),
                {},
                2,
                validity=ValidityInput(supersedes=[SupersedeInput(str(berlin))]),
            )
        assert reason(looped) == (Code.INVALID_ARGUMENT, "SUPERSESSION_CYCLE")
        assert (await world.service.get(ns, str(paris))).revision == 2

    async def test_a_supersession_is_part_of_the_request_id(self, world: World) -> None:
        ns = world.namespace
        a = await world.add("The user lives in Oslo.", sources=world.source(1, 1))
        b = await world.add("The user lives in Bergen.", sources=world.source(1, 1))

        async def write(target: uuid.UUID) -> object:
            return await world.service.upsert(
                ns,
                "",
                "The user lives in Tromso.",
                world.source(4, 4),
                {},
                None,
                request_id_text="move-1",
                validity=ValidityInput(supersedes=[SupersedeInput(str(target))]),
            )

        first = await write(a)
        again = await write(a)
        assert again.memory == first.memory  # type: ignore[attr-defined]
        assert (await world.service.get(ns, str(a))).revision == 2  # superseded once
        with pytest.raises(DomainError) as reused:
            await write(b)
        assert reason(reused) == (Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
        assert (await world.service.get(ns, str(b))).superseded_by is None

    # -- sources outside the transcript (issue 30) ------------------------------------

    async def test_an_external_source_is_kept_and_asks_no_transcript(self, world: World) -> None:
        ns = world.namespace
        note = "mcp://notes.example/items/42?rev=3#Top"
        before = datetime.now(UTC)
        made = await world.service.upsert(
            ns, "", "Prefers tea.", [SourceInput("", 0, 0, external_uri=note)], {}, None
        )
        memory = made.memory
        # Kept exactly as sent (no normalization), and nothing asked of TranscriptService.
        assert memory.sources == (ExternalSource(note),)
        assert world.sources.asked == 0
        # No source entry to date it: valid from when it was written.
        assert memory.valid_from_time is not None and memory.valid_from_time >= before
        assert (await world.service.get(ns, str(memory.memory_id))).sources == (
            ExternalSource(note),
        )
        history = (await world.service.list_revisions(ns, str(memory.memory_id), 0, "")).revisions
        assert history[0].sources == (ExternalSource(note),)
        # Mixed with a transcript range, the range is checked and both are kept in order.
        mixed = await world.service.upsert(
            ns,
            "",
            "Prefers green tea.",
            [SourceInput("", 0, 0, external_uri=note), *world.source(2, 3)],
            {},
            None,
        )
        assert mixed.memory.sources == (
            ExternalSource(note),
            MemorySource(uuid.UUID(world.cid), 2, 3),
        )
        assert mixed.memory.valid_from_time == entry_time(2)
        assert world.sources.asked == 1

    async def test_an_external_uri_is_checked_for_its_form(self, world: World) -> None:
        ns = world.namespace
        long_uri = "urn:" + "x" * 2045
        bad = [
            "notes/42",  # no scheme
            "https:",  # nothing after the scheme
            "1http://x",  # a scheme starts with a letter
            "https://a b",  # a space
            "https://a\x00b",  # NUL
            "https://a\tb",  # a control character
            "https://a\x85b",  # a C1 control character
            long_uri,  # 2049 bytes
        ]
        for uri in bad:
            with pytest.raises(DomainError) as refused:
                await world.service.upsert(
                    ns, "", "A fact.", [SourceInput("", 0, 0, external_uri=uri)], {}, None
                )
            assert reason(refused) == (Code.INVALID_ARGUMENT, "INVALID_EXTERNAL_URI"), uri
            assert refused.value.field == "sources[0].external_uri"
        # A source is a range or a URI, never both.
        with pytest.raises(DomainError) as both:
            await world.service.upsert(
                ns, "", "A fact.", [SourceInput(world.cid, 1, 2, external_uri="urn:a")], {}, None
            )
        assert reason(both) == (Code.INVALID_ARGUMENT, "INVALID_EXTERNAL_URI")
        # Still at least one source of one kind.
        with pytest.raises(DomainError) as none:
            await world.service.upsert(ns, "", "A fact.", [], {}, None)
        assert reason(none) == (Code.INVALID_ARGUMENT, "NO_SOURCES")
        # Any absolute URI, up to the limit, non-ASCII letters included.
        for uri in ("urn:" + "x" * 2044, "langgraph://store/ns/kéy", "file:///tmp/a.md"):
            await world.service.upsert(
                ns, "", "A fact.", [SourceInput("", 0, 0, external_uri=uri)], {}, None
            )
        assert world.sources.asked == 0

    async def test_forgetting_an_external_uri_is_exact_and_takes_mixed_memories(
        self, world: World
    ) -> None:
        ns = world.namespace
        uri = "https://docs.example/a"

        def external(value: str) -> SourceInput:
            return SourceInput("", 0, 0, external_uri=value)

        only = await world.add("From the document.", sources=[external(uri)])
        mixed = await world.add(
            "From the document and the chat.", sources=[*world.source(1, 1), external(uri)]
        )
        others = [
            await world.add("Prefix.", sources=[external(uri + "/b")]),
            await world.add("Case.", sources=[external("HTTPS://docs.example/a")]),
            await world.add("Chat only.", sources=world.source(1, 1)),
        ]
        elsewhere = world.sources.add(f"{ns}-b", 3)
        away = await world.service.upsert(
            f"{ns}-b", "", "Another namespace.", [external(uri)], {}, None
        )
        forgotten = await world.service.forget_source(ns, "", 0, 0, external_uri_text=uri)
        assert (forgotten.deleted, forgotten.erasure) == (2, None)
        for gone in (only, mixed):
            with pytest.raises(DomainError) as missing:
                await world.service.get(ns, str(gone))
            assert reason(missing) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")
            history = (await world.service.list_revisions(ns, str(gone), 0, "")).revisions
            assert all(h.erased for h in history)
            assert history[-1].reason == "forget_source"
        for kept in others:
            assert (await world.service.get(ns, str(kept))).revision == 1
        assert (await world.service.get(f"{ns}-b", str(away.memory.memory_id))).revision == 1
        assert elsewhere
        # Nothing left of it; and nothing is fenced: the URI may be named again.
        assert (await world.service.forget_source(ns, "", 0, 0, external_uri_text=uri)).deleted == 0
        await world.add("Read again.", sources=[external(uri)])

    async def test_a_mixed_memory_goes_when_its_conversation_is_forgotten(
        self, world: World
    ) -> None:
        ns = world.namespace
        mixed = await world.add(
            "Both.", sources=[SourceInput("", 0, 0, external_uri="urn:doc:1"), *world.source(3, 4)]
        )
        external_only = await world.add(
            "Document only.", sources=[SourceInput("", 0, 0, external_uri="urn:doc:1")]
        )
        assert (await world.service.forget_source(ns, world.cid, 4, 4)).deleted == 1
        with pytest.raises(DomainError):
            await world.service.get(ns, str(mixed))
        assert (await world.service.get(ns, str(external_only))).revision == 1
        erased = await world.service.forget_source(ns, world.cid, 0, 0, incarnation=1)
        assert erased.deleted == 0 and erased.erasure is not None
        assert (await world.service.get(ns, str(external_only))).revision == 1

    async def test_forgetting_a_uri_names_nothing_else(self, world: World) -> None:
        ns = world.namespace
        for kw in (
            {"conversation_id_text": world.cid},
            {"conversation_id_text": "", "incarnation": 1},
            {"conversation_id_text": "", "from_sequence": 1, "through_sequence": 2},
        ):
            args = {"from_sequence": 0, "through_sequence": 0, **kw}
            with pytest.raises(DomainError) as both:
                await world.service.forget_source(ns, external_uri_text="urn:a", **args)  # type: ignore[arg-type]
            assert reason(both) == (Code.INVALID_ARGUMENT, "INVALID_EXTERNAL_URI")
        with pytest.raises(DomainError) as bad:
            await world.service.forget_source(ns, "", 0, 0, external_uri_text="no scheme")
        assert reason(bad) == (Code.INVALID_ARGUMENT, "INVALID_EXTERNAL_URI")
        assert bad.value.field == "external_uri"

    async def test_a_request_id_tells_a_uri_from_a_range(self, world: World) -> None:
        ns = world.namespace
        await world.service.upsert(
            ns, "", "A fact.", world.source(1, 2), {}, None, request_id_text="r-1"
        )
        with pytest.raises(DomainError) as reused:
            await world.service.upsert(
                ns,
                "",
                "A fact.",
                [SourceInput("", 0, 0, external_uri="urn:a")],
                {},
                None,
                request_id_text="r-1",
            )
        assert reason(reused) == (Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")

    # -- erasure counts (the receipt's memory part) ----------------------------------

    async def test_an_erasure_adds_up_its_counts_and_knows_when_the_index_caught_up(
        self, world: World
    ) -> None:
        ns = world.namespace
        first = await world.add("Fact one.")
        await world.service.upsert(ns, str(first), "Fact one, again.", world.source(), {}, 1)
        await world.add("Fact two.", sources=world.source(3, 4))
        kept = await world.add(
            "Unrelated.", sources=[SourceInput("", 0, 0, external_uri="urn:kept")]
        )
        await world.drain()
        erased = await world.service.forget_source(ns, world.cid, 0, 0, incarnation=1)
        assert erased.deleted == 2 and erased.erasure is not None
        counts = erased.erasure
        # Two memories, three revisions with content (two of the first, one of the second),
        # one index point each; the index has not caught up (the outbox holds their rows).
        assert (counts.memories_deleted, counts.revisions_erased, counts.index_points) == (2, 3, 2)
        assert counts.incarnation == 1 and str(counts.conversation_id) == world.cid
        assert counts.index_complete_time is None
        # A retry finds nothing more and reports the same totals.
        again = await world.service.forget_source(ns, world.cid, 0, 0, incarnation=1)
        assert again.deleted == 0 and again.erasure is not None
        assert (again.erasure.memories_deleted, again.erasure.revisions_erased) == (2, 3)
        assert again.erasure.erase_time == counts.erase_time
        pending = await world.service.erasure(ns, world.cid, 1)
        assert pending.index_complete_time is None
        await world.drain()
        done = await world.service.erasure(ns, world.cid, 1)
        assert done.index_complete_time is not None
        assert (done.memories_deleted, done.revisions_erased, done.index_points) == (2, 3, 2)
        assert (await world.service.erasure(ns, world.cid, 1)).index_complete_time == (
            done.index_complete_time
        )
        assert (await world.service.get(ns, str(kept))).revision == 1
        # Nothing to erase: complete at once. Another namespace, or no such erasure: none.
        empty = world.sources.add(ns, 2)
        nothing = await world.service.forget_source(ns, empty, 0, 0, incarnation=1)
        assert nothing.erasure is not None and nothing.erasure.index_complete_time is not None
        for namespace, cid, incarnation in ((f"{ns}-b", world.cid, 1), (ns, world.cid, 2)):
            with pytest.raises(DomainError) as missing:
                await world.service.erasure(namespace, cid, incarnation)
            assert reason(missing) == (Code.NOT_FOUND, "ERASURE_NOT_FOUND")
        with pytest.raises(DomainError) as zero:
            await world.service.erasure(ns, world.cid, 0)
        assert reason(zero) == (Code.INVALID_ARGUMENT, "INVALID_INCARNATION")
