"""LangGraph checkpoints (services/transcript/checkpoints/), run against every
TranscriptStore: test_checkpoints_domain.py on the in-memory store,
test_checkpoints_store.py on PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from services.common.errors import DomainError
from services.transcript.checkpoints.model import (
    ChannelValue,
    CheckpointWrite,
    StoredCheckpoint,
    TypedValue,
)
from services.transcript.leases.model import LeaseMode
from services.transcript.service import TranscriptService
from tests.transcript.support import ServiceCases, make_service, new_conversation, reason_of


def checkpoint(
    checkpoint_id: str,
    values: dict[str, tuple[str, bytes]],
    versions: dict[str, str],
    *,
    ns: str = "",
    parent: str | None = None,
    metadata: dict[str, object] | None = None,
) -> StoredCheckpoint:
    """A checkpoint as PutCheckpoint carries it: `values` the new ones, by channel."""
    return StoredCheckpoint(
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent,
        checkpoint=TypedValue("msgpack", f"cp-{checkpoint_id}".encode()),
        metadata_json=json.dumps(metadata or {"source": "loop"}),
        channel_versions=versions,
        channel_values=tuple(
            ChannelValue(c, versions[c], TypedValue(t, v)) for c, (t, v) in values.items()
        ),
        pending_writes=(),
        create_time=datetime.now(UTC),
    )


class CheckpointCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_values_are_stored_once_per_version_and_read_back_verbatim(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        big = ("bytes", bytes(range(256)))
        first = checkpoint("1", {"doc": big, "n": ("json", b"1")}, {"doc": "1", "n": "1"})
        assert await service.put_checkpoint(namespace, cid, first, "run-a", "", None) == 2
        second = checkpoint("2", {"n": ("json", b"2")}, {"doc": "1", "n": "2"}, parent="1")
        assert await service.put_checkpoint(namespace, cid, second, "run-a", "", None) == 1
        # A repeat stores no value again.
        assert await service.put_checkpoint(namespace, cid, second, "run-a", "", None) == 0
        await service.put_checkpoint_writes(
            namespace,
            cid,
            "",
            "2",
            [
                CheckpointWrite("t", 0, "n", TypedValue("json", b"3"), "p"),
                CheckpointWrite("t", -1, "__error__", TypedValue("json", b'"x"'), "p"),
            ],
            "",
            None,
        )
        newest = await service.get_checkpoint(namespace, cid, "", "")
        assert newest is not None and newest.checkpoint_id == "2"
        assert newest.checkpoint == TypedValue("msgpack", b"cp-2")
        assert newest.parent_checkpoint_id == "1"
        assert {v.channel: v.value for v in newest.channel_values} == {
            "doc": TypedValue("bytes", bytes(range(256))),
            "n": TypedValue("json", b"2"),
        }
        assert [(w.idx, w.channel) for w in newest.pending_writes] == [(-1, "__error__"), (0, "n")]
        older = await service.get_checkpoint(namespace, cid, "", "1")
        assert older is not None
        assert {v.channel: v.value.value for v in older.channel_values}["n"] == b"1"
        assert await service.get_checkpoint(namespace, cid, "", "nope") is None
        assert await service.get_checkpoint(namespace, cid, "child", "") is None

    async def test_writes_keep_the_first_but_special_channels_are_replaced(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.put_checkpoint(namespace, cid, checkpoint("1", {}, {}), "", "", None)

        async def write(idx: int, value: bytes) -> int:
            return await service.put_checkpoint_writes(
                namespace,
                cid,
                "",
                "1",
                [CheckpointWrite("t", idx, "c", TypedValue("json", value))],
                "",
                None,
            )

        assert await write(0, b"1") == 1
        assert await write(0, b"2") == 0
        assert await write(-3, b"1") == 1
        assert await write(-3, b"2") == 1
        found = await service.get_checkpoint(namespace, cid, "", "1")
        assert found is not None
        assert [(w.idx, w.value.value) for w in found.pending_writes] == [(-3, b"2"), (0, b"1")]

    async def test_a_repeated_idx_within_one_call_follows_the_same_rule(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """Two writes of one idx in one call (PostgreSQL's ON CONFLICT may touch a row
        once per statement): the first kept, a special channel's last, no error."""
        cid = await new_conversation(service, namespace)
        await service.put_checkpoint(namespace, cid, checkpoint("1", {}, {}), "", "", None)
        stored = await service.put_checkpoint_writes(
            namespace,
            cid,
            "",
            "1",
            [
                CheckpointWrite("t", idx, "c", TypedValue("json", value))
                for idx, value in ((0, b"1"), (0, b"2"), (-3, b"1"), (-3, b"2"))
            ],
            "",
            None,
        )
        assert stored == 2
        found = await service.get_checkpoint(namespace, cid, "", "1")
        assert found is not None
        assert [(w.idx, w.value.value) for w in found.pending_writes] == [(-3, b"2"), (0, b"1")]

    async def test_list_filters_pages_and_orders_newest_first(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        for i in range(5):
            meta: dict[str, object] = {"source": "input" if i % 2 == 0 else "loop", "step": i}
            await service.put_checkpoint(
                namespace, cid, checkpoint(f"{i}", {}, {}, metadata=meta), "", "", None
            )
        await service.put_checkpoint(
            namespace, cid, checkpoint("9", {}, {}, ns="child"), "", "", None
        )
        ids, token = [], ""
        while True:
            page = await service.list_checkpoints(namespace, cid, "", "", "", 2, token)
            ids += [c.checkpoint_id for c in page.checkpoints]
            token = page.next_page_token
            if not token:
                break
        assert ids == ["4", "3", "2", "1", "0"]
        everything = await service.list_checkpoints(namespace, cid, None, "", "", 0, "")
        assert [c.checkpoint_id for c in everything.checkpoints] == ["9", "4", "3", "2", "1", "0"]
        inputs = await service.list_checkpoints(
            namespace, cid, "", '{"source": "input"}', "3", 0, ""
        )
        assert [c.checkpoint_id for c in inputs.checkpoints] == ["2", "0"]
        with pytest.raises(DomainError) as bad:
            await service.list_checkpoints(namespace, cid, "", "[]", "", 0, "")
        assert reason_of(bad) == "INVALID_CHECKPOINT_FILTER"

    async def test_a_page_is_cut_by_weight_never_before_its_first(
        self, store: object, namespace: str
    ) -> None:
        service = make_service(store)  # type: ignore[arg-type]
        small = make_service(store, checkpoints=_limits(max_checkpoint_bytes=2048))  # type: ignore[arg-type]
        cid = await new_conversation(service, namespace)
        for i in range(3):
            value = ("bytes", bytes(1500))
            await service.put_checkpoint(
                namespace, cid, checkpoint(f"{i}", {f"c{i}": value}, {f"c{i}": "1"}), "", "", None
            )
        page = await small.list_checkpoints(namespace, cid, "", "", "", 10, "")
        assert [c.checkpoint_id for c in page.checkpoints] == ["2"] and page.next_page_token
        with pytest.raises(DomainError) as refused:
            await small.put_checkpoint(
                namespace,
                cid,
                checkpoint("3", {}, {"c0": "1", "c1": "1"}),
                "",
                "",
                None,
            )
        assert reason_of(refused) == "CHECKPOINT_TOO_LARGE"
        assert await service.get_checkpoint(namespace, cid, "", "3") is None

    async def test_writes_against_one_checkpoint_are_bounded_as_its_put(
        self, store: object, namespace: str
    ) -> None:
        """A read returns a checkpoint with all its writes: calls of many tasks cannot
        pile them up past what a put may weigh (nothing of the refused call is kept),
        nor against a checkpoint whose put has not landed."""
        small = make_service(store, checkpoints=_limits(max_checkpoint_bytes=2048))  # type: ignore[arg-type]
        cid = await new_conversation(small, namespace)
        await small.put_checkpoint(namespace, cid, checkpoint("1", {}, {}), "", "", None)

        async def write(checkpoint_id: str, task: str) -> int:
            return await small.put_checkpoint_writes(
                namespace,
                cid,
                "",
                checkpoint_id,
                [CheckpointWrite(task, 0, "c", TypedValue("bytes", bytes(600)))],
                "",
                None,
            )

        for checkpoint_id in ("1", "not-put-yet"):
            assert [await write(checkpoint_id, f"t{i}") for i in range(3)] == [1, 1, 1]
            with pytest.raises(DomainError) as refused:
                await write(checkpoint_id, "t3")
            assert reason_of(refused) == "CHECKPOINT_TOO_LARGE"
        found = await small.get_checkpoint(namespace, cid, "", "1")
        assert found is not None and len(found.pending_writes) == 3

    async def test_delete_by_runs_and_prune_take_the_unnamed_values(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        other = await new_conversation(service, namespace)
        for i, run in enumerate(("r1", "r1", "r2")):
            await service.put_checkpoint(
                namespace,
                cid,
                checkpoint(f"{i}", {"v": ("json", f"{i}".encode())}, {"v": f"{i}"}),
                run,
                "",
                None,
            )
        await service.put_checkpoint(
            namespace, other, checkpoint("0", {"v": ("json", b"0")}, {"v": "0"}), "r1", "", None
        )
        deleted = await service.delete_checkpoints(namespace, ["r1"], [], False)
        assert (deleted.checkpoints, deleted.channel_values) == (3, 3)
        left = await service.list_checkpoints(namespace, cid, None, "", "", 0, "")
        assert [c.checkpoint_id for c in left.checkpoints] == ["2"]
        for i in (3, 4):
            await service.put_checkpoint(
                namespace,
                cid,
                checkpoint(f"{i}", {"v": ("json", f"{i}".encode())}, {"v": f"{i}"}),
                "",
                "",
                None,
            )
        pruned = await service.delete_checkpoints(namespace, [], [cid], True)
        assert (pruned.checkpoints, pruned.channel_values) == (2, 2)
        kept = await service.get_checkpoint(namespace, cid, "", "")
        assert kept is not None and kept.checkpoint_id == "4"
        assert [v.value.value for v in kept.channel_values] == [b"4"]
        with pytest.raises(DomainError) as both:
            await service.delete_checkpoints(namespace, ["r"], [cid], False)
        assert reason_of(both) == "INVALID_CHECKPOINT_DELETION"

    async def test_copy_copies_everything_once(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await new_conversation(service, namespace)
        target = await new_conversation(service, namespace)
        await service.put_checkpoint(
            namespace, source, checkpoint("1", {"v": ("json", b"1")}, {"v": "1"}), "", "", None
        )
        await service.put_checkpoint_writes(
            namespace,
            source,
            "",
            "1",
            [CheckpointWrite("t", 0, "v", TypedValue("json", b"w"))],
            "",
            None,
        )
        assert await service.copy_checkpoints(namespace, source, target) == 1
        assert await service.copy_checkpoints(namespace, source, target) == 0
        copied = await service.get_checkpoint(namespace, target, "", "")
        assert copied is not None and copied.pending_writes[0].value.value == b"w"
        assert copied.channel_values[0].value.value == b"1"

    async def test_a_put_under_a_lost_lease_or_beside_a_held_one_is_refused(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        lease = await service.leases.acquire_turn_lease(
            namespace, cid, "run-1", int(LeaseMode.EXCLUSIVE), 30.0, b"", False
        )
        token = lease.fencing_token  # type: ignore[union-attr]
        await service.put_checkpoint(namespace, cid, checkpoint("1", {}, {}), "", "run-1", token)
        with pytest.raises(DomainError) as busy:
            await service.put_checkpoint(namespace, cid, checkpoint("2", {}, {}), "", "", None)
        assert reason_of(busy) == "CONVERSATION_BUSY"
        with pytest.raises(DomainError) as wrong:
            await service.put_checkpoint(
                namespace, cid, checkpoint("2", {}, {}), "", "run-1", token + 1
            )
        assert reason_of(wrong) == "TURN_LEASE_LOST"
        assert await service.leases.release_turn_lease(namespace, cid, "run-1", token, None, False)
        with pytest.raises(DomainError) as lost:
            await service.put_checkpoint_writes(
                namespace,
                cid,
                "",
                "1",
                [CheckpointWrite("t", 0, "v", TypedValue("json", b"1"))],
                "run-1",
                token,
            )
        assert reason_of(lost) == "TURN_LEASE_LOST"
        await service.put_checkpoint(namespace, cid, checkpoint("2", {}, {}), "", "", None)

    async def test_erasure_takes_the_checkpoints(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.put_checkpoint(
            namespace, cid, checkpoint("1", {"v": ("json", b"1")}, {"v": "1"}), "", "", None
        )
        erased = await service.delete_conversation(namespace, cid)
        assert erased.checkpoints == 1  # deleted (and counted) with the transcript
        assert await service.get_checkpoint(namespace, cid, "", "") is None
        again, _ = await service.create_conversation(namespace, cid, {})
        assert await service.get_checkpoint(namespace, str(again.conversation_id), "", "") is None
        assert (
            await service.copy_checkpoints(
                namespace, cid, await new_conversation(service, namespace)
            )
            == 0
        )
        with pytest.raises(DomainError) as missing:
            await service.put_checkpoint(
                namespace, await _gone(service, namespace), checkpoint("1", {}, {}), "", "", None
            )
        assert reason_of(missing) == "CONVERSATION_NOT_FOUND"

    async def test_a_growing_value_reads_back_exactly_at_every_version_through_deletions(
        self, service: TranscriptService, namespace: str
    ) -> None:
        """A list that grows by an item at each step (stored as deltas on PostgreSQL):
        every version reads back byte for byte, before and after the checkpoints its
        chain started from are deleted."""
        cid = await new_conversation(service, namespace)
        items: list[bytes] = []
        values: dict[str, bytes] = {}
        parent = None
        for i in range(40):
            items.append(f"message {i} ".encode() * 20)
            # A msgpack-like list: a header that changes with the length, then the items.
            data = bytes([0x90 + min(len(items), 15)]) + b"".join(items)
            version = f"{i + 1:03}"
            values[version] = data
            await service.put_checkpoint(
                namespace,
                cid,
                checkpoint(
                    f"{i:03}", {"messages": ("msgpack", data)}, {"messages": version}, parent=parent
                ),
                f"run-{i // 10}",
                "",
                None,
            )
            parent = f"{i:03}"
        for i in range(40):
            found = await service.get_checkpoint(namespace, cid, "", f"{i:03}")
            assert found is not None
            assert found.channel_values[0].value.value == values[f"{i + 1:03}"], i
        await service.delete_checkpoints(namespace, ["run-0", "run-2"], [], False)
        listed = await service.list_checkpoints(namespace, cid, "", "", "", 100, "")
        assert len(listed.checkpoints) == 20
        for found in listed.checkpoints:
            version = found.channel_versions["messages"]
            assert found.channel_values[0].value.value == values[version], version
        await service.delete_checkpoints(namespace, [], [cid], True)
        newest = await service.get_checkpoint(namespace, cid, "", "")
        assert newest is not None and newest.channel_values[0].value.value == values["040"]


async def _gone(service: TranscriptService, namespace: str) -> str:
    cid = await new_conversation(service, namespace)
    await service.delete_conversation(namespace, cid)
    return cid


def _limits(**values: int) -> object:
    from services.transcript.checkpoints.model import CheckpointLimits

    return CheckpointLimits(**values)
