"""LangGraph checkpoints (TranscriptService): validates puts, reads and deletions and
hands the store one transaction each. Knows nothing of gRPC or SQL (the store is a
`CheckpointStore`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common import validation
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens
from services.common.validation import conversation_id
from services.transcript.checkpoints.model import (
    DEFAULT_PAGE_SIZE,
    MAX_IDS_PER_DELETE,
    ChannelValue,
    CheckpointDeletion,
    CheckpointPage,
    CheckpointQuery,
    CheckpointWrite,
    DeleteRequest,
    NewCheckpoint,
    NewWrites,
    StoredCheckpoint,
    fence,
    name,
    put_too_large,
    too_many_values,
    typed_value,
)
from services.transcript.checkpoints.store import CheckpointStore
from services.transcript.config import TranscriptLimits


class Checkpoints:
    """The checkpoint methods of TranscriptService (services/transcript/service.py)."""

    store: CheckpointStore
    limits: TranscriptLimits
    page_tokens: PageTokens

    async def put_checkpoint(
        self,
        namespace: str,
        conversation_id_text: str,
        checkpoint: StoredCheckpoint,
        run_id: str,
        turn_id: str,
        fencing_token: int | None,
    ) -> int:
        """Store a checkpoint of the conversation (a LangGraph thread) with the values of
        its channels whose version is new (each stored once per version); the number of
        values stored. A repeat replaces the checkpoint's row and keeps the values.

        With a fencing token the put commits only while that turn lease holds
        (TURN_LEASE_LOST otherwise); without, it is refused while another turn holds the
        conversation exclusively (CONVERSATION_BUSY).
        """
        limits = self.limits.checkpoints
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if len(checkpoint.channel_values) > limits.max_values_per_call:
            raise too_many_values("checkpoint.channel_values", limits.max_values_per_call)
        if len(checkpoint.channel_versions) > limits.max_values_per_call * 4:
            raise too_many_values("checkpoint.channel_versions", limits.max_values_per_call * 4)
        metadata = checkpoint.metadata_json or "{}"
        if len(metadata.encode()) > limits.max_metadata_bytes:
            raise invalid_argument(
                "CHECKPOINT_METADATA_TOO_LARGE",
                f"checkpoint.metadata_json is larger than {limits.max_metadata_bytes} bytes "
                "(RUNIFOLD_CHECKPOINT_MAX_METADATA_BYTES)",
                field="checkpoint.metadata_json",
                limit_bytes=limits.max_metadata_bytes,
            )
        validation.json_object(
            metadata,
            "checkpoint.metadata_json",
            "INVALID_CHECKPOINT_METADATA",
            max_depth=self.limits.max_json_depth,
        )
        versions = {
            name(channel, "checkpoint.channel_versions", required=True): name(
                version, "checkpoint.channel_versions", required=True
            )
            for channel, version in checkpoint.channel_versions.items()
        }
        values = tuple(
            ChannelValue(
                name(value.channel, "checkpoint.channel_values.channel", required=True),
                name(value.version, "checkpoint.channel_values.version", required=True),
                typed_value(value.value, "checkpoint.channel_values.value", limits),
            )
            for value in checkpoint.channel_values
        )
        carried = (
            len(checkpoint.checkpoint.value or b"")
            + len(metadata.encode())
            + sum(len(value.value.value or b"") for value in values)
        )
        if carried > self.limits.max_append_bytes:
            raise put_too_large("checkpoint.channel_values", self.limits.max_append_bytes)
        put = NewCheckpoint(
            namespace=namespace,
            conversation_id=cid,
            checkpoint_ns=name(checkpoint.checkpoint_ns, "checkpoint.checkpoint_ns"),
            checkpoint_id=name(checkpoint.checkpoint_id, "checkpoint.checkpoint_id", required=True),
            parent_checkpoint_id=name(
                checkpoint.parent_checkpoint_id or "", "checkpoint.parent_checkpoint_id"
            )
            or None,
            checkpoint=typed_value(checkpoint.checkpoint, "checkpoint.checkpoint", limits),
            metadata_json=metadata,
            run_id=name(run_id, "run_id") or None,
            channel_versions=versions,
            channel_values=values,
            fence=fence(turn_id, fencing_token),
            max_checkpoint_bytes=limits.max_checkpoint_bytes,
        )
        return await self.store.put_checkpoint(put)

    async def put_checkpoint_writes(
        self,
        namespace: str,
        conversation_id_text: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        turn_id: str,
        fencing_token: int | None,
    ) -> int:
        """Store the pending writes of one task against a checkpoint; the number stored.
        A repeat of a (task_id, idx) keeps the first write, except the special channels'
        (negative idx), replaced. Fenced as put_checkpoint."""
        limits = self.limits.checkpoints
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if not writes:
            raise invalid_argument("INVALID_CHECKPOINT", "writes is empty", field="writes")
        if len(writes) > limits.max_values_per_call:
            raise too_many_values("writes", limits.max_values_per_call)
        task_ids = {write.task_id for write in writes}
        task_paths = {write.task_path for write in writes}
        if len(task_ids) != 1 or len(task_paths) != 1:
            raise invalid_argument(
                "INVALID_CHECKPOINT",
                "the writes of one call are one task's (one task_id and task_path)",
                field="writes",
            )
        # A repeat of an idx within the call follows the rule between calls (the first
        # write kept; a special channel's, negative idx, replaced): one row per idx reaches
        # the statement, whose ON CONFLICT may touch a row only once.
        by_idx: dict[int, CheckpointWrite] = {}
        for write in writes:
            if write.idx >= 0 and write.idx in by_idx:
                continue
            by_idx[write.idx] = CheckpointWrite(
                write.task_id,
                write.idx,
                name(write.channel, "writes.channel", required=True),
                typed_value(write.value, "writes.value", limits),
                write.task_path,
            )
        checked = tuple(by_idx.values())
        if sum(len(write.value.value or b"") for write in checked) > self.limits.max_append_bytes:
            raise put_too_large("writes", self.limits.max_append_bytes)
        put = NewWrites(
            namespace=namespace,
            conversation_id=cid,
            checkpoint_ns=name(checkpoint_ns, "checkpoint_ns"),
            checkpoint_id=name(checkpoint_id, "checkpoint_id", required=True),
            task_id=name(task_ids.pop(), "writes.task_id", required=True),
            task_path=name(task_paths.pop(), "writes.task_path"),
            writes=checked,
            fence=fence(turn_id, fencing_token),
            max_checkpoint_bytes=limits.max_checkpoint_bytes,
        )
        return await self.store.put_checkpoint_writes(put)

    async def get_checkpoint(
        self, namespace: str, conversation_id_text: str, checkpoint_ns: str, checkpoint_id: str
    ) -> StoredCheckpoint | None:
        """A checkpoint with its values and pending writes, by id or the newest of
        `checkpoint_ns`; None when there is none (or no such conversation here)."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        return await self.store.get_checkpoint(
            namespace,
            cid,
            name(checkpoint_ns, "checkpoint_ns"),
            name(checkpoint_id, "checkpoint_id"),
        )

    async def list_checkpoints(
        self,
        namespace: str,
        conversation_id_text: str,
        checkpoint_ns: str | None,
        filter_json: str,
        before_checkpoint_id: str,
        size: int,
        token: str,
    ) -> CheckpointPage:
        """A page of the conversation's checkpoints, newest first, filtered by namespace,
        metadata (containment) and `before_checkpoint_id` (AIP-158 paging; a page ends
        early at RUNIFOLD_CHECKPOINT_MAX_BYTES, never before its first checkpoint)."""
        limits = self.limits.checkpoints
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if size < 0:
            raise invalid_argument(
                "INVALID_PAGE_SIZE", "page_size must not be negative", field="page_size"
            )
        limit = min(size or DEFAULT_PAGE_SIZE, limits.max_page_size)
        if filter_json:
            if len(filter_json.encode()) > limits.max_metadata_bytes:
                raise invalid_argument(
                    "INVALID_CHECKPOINT_FILTER",
                    f"filter_json is larger than {limits.max_metadata_bytes} bytes",
                    field="filter_json",
                )
            validation.json_object(
                filter_json,
                "filter_json",
                "INVALID_CHECKPOINT_FILTER",
                max_depth=self.limits.max_json_depth,
            )
        request: Mapping[str, object] = {
            "conversation_id": str(cid),
            "checkpoint_ns": checkpoint_ns,
            "filter": filter_json,
            "before": before_checkpoint_id,
        }
        after: tuple[str, str] | None = None
        if token:
            cursor = self.page_tokens.decode(token, "checkpoints", namespace, request)
            after = (str(cursor["id"]), str(cursor["ns"]))
        page = await self.store.list_checkpoints(
            CheckpointQuery(
                namespace=namespace,
                conversation_id=cid,
                checkpoint_ns=None
                if checkpoint_ns is None
                else name(checkpoint_ns, "checkpoint_ns"),
                filter_json=filter_json or None,
                before_checkpoint_id=name(before_checkpoint_id, "before_checkpoint_id") or None,
                after=after,
                limit=limit,
                max_bytes=limits.max_checkpoint_bytes,
            )
        )
        if page.more and page.checkpoints:
            last = page.checkpoints[-1]
            token = self.page_tokens.encode(
                "checkpoints",
                namespace,
                request,
                {"id": last.checkpoint_id, "ns": last.checkpoint_ns},
            )
            return CheckpointPage(page.checkpoints, True, token)
        return CheckpointPage(page.checkpoints, False)

    async def delete_checkpoints(
        self,
        namespace: str,
        run_ids: Sequence[str],
        conversation_ids: Sequence[str],
        keep_latest: bool,
    ) -> CheckpointDeletion:
        """Delete the checkpoints of runs (anywhere in the namespace) or of conversations
        (all, or all but the newest of each checkpoint_ns), with their pending writes and
        the channel values no checkpoint names any more. Not an erasure: the
        conversations stay."""
        validation.namespace(namespace)
        if run_ids and conversation_ids:
            raise invalid_argument(
                "INVALID_CHECKPOINT_DELETION",
                "name run_ids or conversation_ids, not both",
                field="run_ids",
            )
        if keep_latest and not conversation_ids:
            raise invalid_argument(
                "INVALID_CHECKPOINT_DELETION",
                "keep_latest applies to conversation_ids",
                field="keep_latest",
            )
        for field_name, ids in (("run_ids", run_ids), ("conversation_ids", conversation_ids)):
            if len(ids) > MAX_IDS_PER_DELETE:
                raise invalid_argument(
                    "INVALID_CHECKPOINT_DELETION",
                    f"{field_name} holds more than {MAX_IDS_PER_DELETE} ids",
                    field=field_name,
                    limit=MAX_IDS_PER_DELETE,
                )
        if not run_ids and not conversation_ids:
            return CheckpointDeletion()
        request = DeleteRequest(
            namespace,
            tuple(name(run_id, "run_ids", required=True) for run_id in run_ids),
            tuple(conversation_id(cid, "conversation_ids") for cid in conversation_ids),
            keep_latest,
        )
        return await self.store.delete_checkpoints(request)

    async def copy_checkpoints(self, namespace: str, source_text: str, target_text: str) -> int:
        """Copy every checkpoint, value and pending write of a conversation into another
        of the namespace (LangGraph's copy_thread, after ForkConversation made it); the
        number of checkpoints copied (none from a missing source). Idempotent."""
        validation.namespace(namespace)
        source = conversation_id(source_text)
        target = conversation_id(target_text, "target_conversation_id")
        if source == target:
            raise invalid_argument(
                "INVALID_CHECKPOINT_COPY",
                "target_conversation_id is the source",
                field="target_conversation_id",
            )
        copied = await self.store.copy_checkpoints(namespace, source, target)
        return copied or 0
