"""An in-memory TranscriptStore, for the domain unit tests.

It obeys the same protocol and atomicity as the PostgreSQL store (one lock
around every write), so the domain tests exercise the real rules.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from services.common.domain import Entry, Role, Usage
from services.common.errors import VersionConflict
from services.transcript.appends.model import (
    AppendResult,
    NewAppend,
    entry_not_retractable,
    no_user,
)
from services.transcript.checkpoints.model import (
    ChannelValue,
    CheckpointDeletion,
    CheckpointPage,
    CheckpointQuery,
    CheckpointWrite,
    DeleteRequest,
    Fence,
    NewCheckpoint,
    NewWrites,
    StoredCheckpoint,
    TypedValue,
    checkpoint_too_large,
)
from services.transcript.conversations.model import (
    NO_STATE_CHANGE,
    PREVIEW_CHARS,
    PREVIEW_ENTRIES,
    AppendRecord,
    Conversation,
    Deletion,
    ForkOrigin,
    ScopedState,
    StateChange,
    conversation_erased,
    conversation_not_found,
    preview,
    request_id_reused,
    state_too_large,
)
from services.transcript.conversations.store import mark_refused
from services.transcript.digests.model import GENESIS, ChainLink, body, chain_step, links
from services.transcript.forks.model import (
    ForkRef,
    NewFork,
    conversation_exists,
    fork_point_out_of_range,
    forks_changed,
)
from services.transcript.leases.model import (
    EndedTurn,
    Enqueue,
    Granted,
    LeaseAttempt,
    LeaseRequest,
    TurnLease,
    TurnRow,
    Waiting,
    conversation_busy,
    decide_lease,
    interrupted,
    turn_lease_lost,
)
from services.transcript.leases.store import WAIT_LEASE_S
from services.transcript.receipts.model import (
    APPENDS,
    CHECKPOINTS,
    ENTRIES,
    FORKS,
    ErasureProgress,
    ErasureReceipt,
    merge,
)
from services.transcript.views.model import ViewRead, view_ranges

# Queue tickets, one counter for every conversation (transcript.turn_tickets).
_TICKETS = itertools.count(1)
# Conversation keys in the order conversations were made, like the store's identity.
_KEYS = itertools.count(1)


def _random_token() -> int:
    """Incarnations and fencing tokens (transcript.random_token())."""
    return secrets.randbits(62) + 1


def _interrupt(turn: _Turn, until: datetime) -> None:
    """End a lapsed running turn whose holder began its model call (the store's
    INTERRUPT): kept, with the interrupted outcome, until `until`."""
    turn.state, turn.ended, turn.until = "ended", interrupted(), until


@dataclass
class _Turn:
    state: str
    exclusive: bool
    payload_hash: bytes
    until: datetime
    ticket: int | None = None  # its place in the queue, while it waits
    fencing_token: int | None = None  # its grant's, once granted
    ended: EndedTurn | None = None
    model_called: bool = False  # its holder began its model call

    def row(self, turn_id: str, now: datetime) -> TurnRow:
        return TurnRow(
            turn_id,
            self.state,
            self.exclusive,
            self.ticket,
            self.fencing_token,
            self.payload_hash,
            self.until >= now,
            self.ended,
            self.model_called,
        )


@dataclass
class _Stored:
    conversation: Conversation
    entries: list[Entry] = field(default_factory=list)
    appends: dict[str, AppendRecord] = field(default_factory=dict)
    provisional: str | None = None
    turns: dict[str, _Turn] = field(default_factory=dict)
    # Every append in version order, and the state after each version ([0]: at creation).
    records: list[AppendRecord] = field(default_factory=list)
    retracted: list[tuple[int, ...]] = field(default_factory=list)  # per version
    states: list[str] = field(default_factory=lambda: ["{}"])
    # A fork's shared prefix ends here (its entries cannot be retracted by the fork); the
    # forks made of this one (by id, incarnation), and its forks' request ids.
    prefix_end: int = 0
    shared_versions: int = 0  # the appends of the prefix (its source's)
    forks: list[tuple[uuid.UUID, int]] = field(default_factory=list)
    fork_requests: dict[str, tuple[bytes, uuid.UUID, int]] = field(default_factory=dict)
    key: int = field(default_factory=lambda: next(_KEYS))
    # LangGraph checkpoints (checkpoints/): by (checkpoint_ns, checkpoint_id), their
    # values by (checkpoint_ns, channel, version), their writes by checkpoint and task.
    checkpoints: dict[tuple[str, str], StoredCheckpoint] = field(default_factory=dict)
    run_ids: dict[tuple[str, str], str | None] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str], TypedValue] = field(default_factory=dict)
    writes: dict[tuple[str, str, str, int], CheckpointWrite] = field(default_factory=dict)

    def live_holder(self, now: datetime) -> tuple[str, _Turn] | None:
        """The turn holding an exclusive lease that has not lapsed."""
        for turn_id, turn in self.turns.items():
            if turn.state == "running" and turn.exclusive and turn.until >= now:
                return turn_id, turn
        return None


def _preview(entries: Sequence[Entry]) -> str:
    """A listing's preview, as the store makes it: of the first standing user message
    among the first PREVIEW_ENTRIES entries (the start the statement reads)."""
    for entry in entries[:PREVIEW_ENTRIES]:
        if entry.message.role == Role.USER and not entry.retracted_version:
            return preview(entry.message.text[: PREVIEW_CHARS + 1])
    return ""


def _merged(stored: str, delta: str | None) -> str:
    """A state document with a delta's top-level keys replaced (jsonb ||)."""
    if delta is None:
        return stored
    return json.dumps({**json.loads(stored), **json.loads(delta)})


class InMemoryTranscriptStore:
    """TranscriptStore held in a dict."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, uuid.UUID], _Stored] = {}
        # (namespace, user_id or "" for the namespace's own) -> its state document.
        self._states: dict[tuple[str, str], ScopedState] = {}
        # Erasure receipts by (namespace, conversation id, incarnation).
        self._receipts: dict[tuple[str, uuid.UUID, int], ErasureReceipt] = {}
        self._lock = asyncio.Lock()

    def _scoped_after(
        self, namespace: str, user: str, delta: str | None, limit: int, scope: str
    ) -> str | None:
        """The state a write would leave in a scoped document (None: unchanged)."""
        if delta is None:
            return None
        current = self._states.get((namespace, user))
        after = _merged(current.state_json if current else "{}", delta)
        if len(after.encode()) > limit:
            raise state_too_large(scope, limit)
        return after

    def _commit_scoped(self, namespace: str, user: str, after: str | None, now: datetime) -> int:
        if after is None:
            return 0
        current = self._states.get((namespace, user))
        version = (current.version if current else 0) + 1
        self._states[(namespace, user)] = ScopedState(user, after, version, now)
        return version

    async def create_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        labels: Mapping[str, str],
        user_id: str | None = None,
        state: StateChange = NO_STATE_CHANGE,
        max_state_bytes: int = 64 * 1024,
    ) -> tuple[Conversation, bool]:
        async with self._lock:
            key = (namespace, conversation_id)
            if key in self._data:
                return self._data[key].conversation, False
            user_after = self._scoped_after(
                namespace, user_id or "", state.user, max_state_bytes, "user"
            )
            namespace_after = self._scoped_after(
                namespace, "", state.namespace, max_state_bytes, "namespace"
            )
            now = datetime.now(UTC)
            conversation = Conversation(
                conversation_id,
                namespace,
                0,
                0,
                now,
                now,
                dict(labels),
                _random_token(),
                user_id,
                _merged("{}", state.conversation),
            )
            self._data[key] = _Stored(conversation, states=[conversation.state_json])
            if user_id is not None:
                self._commit_scoped(namespace, user_id, user_after, now)
            self._commit_scoped(namespace, "", namespace_after, now)
            return conversation, True

    async def read_states(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        return [self._states[(namespace, u)] for u in user_ids if (namespace, u) in self._states]

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        stored = self._data.get((namespace, conversation_id))
        return stored.conversation if stored else None

    async def append(self, append: NewAppend) -> AppendResult:
        async with self._lock:
            stored = self._data.get((append.namespace, append.conversation_id))
            if stored is None:
                raise conversation_not_found()
            if append.request_id is not None and append.request_id in stored.appends:
                record = stored.appends[append.request_id]
                if record.payload_hash != append.payload_hash:
                    raise request_id_reused()
                return AppendResult(record, replayed=True)
            now = datetime.now(UTC)
            token = append.fencing_token
            if token is not None:
                own = stored.turns.get(append.request_id or "")
                if (
                    own is None
                    or own.fencing_token != token
                    or own.state != "running"
                    or own.until < now
                ):
                    raise turn_lease_lost()
            holder = stored.live_holder(now)
            if holder is not None and holder[1].fencing_token != token:
                raise conversation_busy(holder[0])
            current = stored.conversation
            if append.expected_version is not None and current.version != append.expected_version:
                raise VersionConflict(current.version, append.expected_version)
            # The rules of state and retractions, checked before anything is written.
            limit = append.max_state_bytes
            if append.state.user is not None and current.user_id is None:
                raise no_user()
            for sequence in append.retract:
                if sequence > len(stored.entries) or sequence <= stored.prefix_end:
                    raise entry_not_retractable(sequence)
                entry = stored.entries[sequence - 1]
                held = entry.message
                if entry.retracted_version or held.tool_calls or held.role == 3:
                    raise entry_not_retractable(sequence)
            conversation_state = _merged(current.state_json, append.state.conversation)
            if len(conversation_state.encode()) > limit:
                raise state_too_large("conversation", limit)
            user_after = self._scoped_after(
                append.namespace, current.user_id or "", append.state.user, limit, "user"
            )
            namespace_after = self._scoped_after(
                append.namespace, "", append.state.namespace, limit, "namespace"
            )
            now = datetime.now(UTC)
            version = current.version + 1
            first = current.last_sequence + 1
            for offset, message in enumerate(append.messages):
                stored.entries.append(Entry(first + offset, message, now))
            for sequence in append.retract:
                stored.entries[sequence - 1] = replace(
                    stored.entries[sequence - 1], retracted_version=version, retract_time=now
                )
            last = current.last_sequence + len(append.messages)
            digest = b""
            if append.digest_body is not None:
                previous = current.head_digest or GENESIS
                digest = chain_step(previous, version, first, last, now, append.digest_body)
            stored.conversation = replace(
                current,
                version=version,
                last_sequence=last,
                update_time=now,
                state_json=conversation_state,
                head_digest=digest or current.head_digest,
            )
            user_version = (
                self._commit_scoped(append.namespace, current.user_id, user_after, now)
                if current.user_id is not None
                else 0
            )
            namespace_version = self._commit_scoped(append.namespace, "", namespace_after, now)
            record = AppendRecord(
                version, first, last, append.usage, now, append.payload_hash, digest
            )
            stored.records.append(record)
            stored.states.append(conversation_state)
            stored.retracted.append(tuple(append.retract))
            if append.request_id is not None:
                stored.appends[append.request_id] = record
            if token is not None:  # kept a while as committed, as in PostgreSQL
                committed = stored.turns[append.request_id or ""]
                committed.state, committed.until = "committed", now + timedelta(minutes=1)
            stored.provisional = None
            return AppendResult(record, False, user_version, namespace_version)

    async def read_entries(
        self, namespace: str, conversation_id: uuid.UUID, ranges: Sequence[tuple[int, int]]
    ) -> list[Entry]:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return []
        return [
            stored.entries[s - 1]
            for low, high in ranges
            for s in range(low, min(high, len(stored.entries)) + 1)
        ]

    async def read_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str | None,
    ) -> ViewRead | None:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return None
        last = stored.conversation.last_sequence
        window_range, buffer_range = view_ranges(last, window, summary_batch, summarized_through)
        ranges = [buffer_range, window_range]
        entries = await self.read_entries(namespace, conversation_id, ranges)
        prior = stored.appends.get(request_id) if request_id is not None else None
        return ViewRead(
            stored.conversation.version,
            last,
            entries,
            prior,
            stored.conversation.incarnation,
            stored.conversation,
        )

    async def list_entries(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_sequence: int,
        through_sequence: int | None,
        limit: int,
        retracted_after_version: int = 0,
    ) -> list[Entry] | None:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return None
        high = len(stored.entries) if through_sequence is None else through_sequence
        found = stored.entries[after_sequence:high]
        if retracted_after_version:
            found = [e for e in found if (e.retracted_version or 0) > retracted_after_version]
        return found[:limit]

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> Conversation:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            found = stored.conversation if stored else None
            if (
                stored is None
                or found is None
                or incarnation not in (0, found.incarnation)
                or curated_through > found.last_sequence
            ):
                raise mark_refused(found, incarnation)
            stored.conversation = replace(
                found, curated_through=max(found.curated_through, curated_through)
            )
            return stored.conversation

    async def list_conversations(
        self,
        namespace: str,
        after: uuid.UUID | None,
        limit: int,
        user_id: str | None = None,
        with_state: bool = False,
        newest_first: bool = False,
        after_time: datetime | None = None,
    ) -> list[Conversation]:
        listed = [
            stored
            for (ns, _), stored in self._data.items()
            if ns == namespace and (user_id is None or stored.conversation.user_id == user_id)
        ]

        def position(stored: _Stored) -> tuple[datetime, uuid.UUID]:
            return stored.conversation.create_time, stored.conversation.conversation_id

        if newest_first:
            listed.sort(key=position, reverse=True)
            if after is not None:
                assert after_time is not None
                listed = [s for s in listed if position(s) < (after_time, after)]
        else:
            listed.sort(key=lambda stored: stored.conversation.conversation_id)
            if after is not None:
                listed = [s for s in listed if s.conversation.conversation_id > after]
        found = [
            replace(
                stored.conversation,
                state_json=stored.conversation.state_json if with_state else "",
                preview=_preview(stored.entries),
            )
            for stored in listed[:limit]
        ]
        return found

    async def list_namespaces(
        self, after: str, limit: int, among: Sequence[str] | None = None
    ) -> list[str]:
        held = {ns for ns, _ in self._data}
        if among is not None:
            held &= set(among)
        return sorted(ns for ns in held if ns > after)[:limit]

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int = 0,
        receipt: ErasureProgress | None = None,
        erased_forks: Collection[tuple[uuid.UUID, int]] | None = None,
    ) -> Deletion:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            erased = Deletion(False)
            if stored is not None and incarnation in (0, stored.conversation.incarnation):
                if erased_forks is not None:
                    tree = self._fork_tree(namespace, stored)
                    not_erased = sum(fork not in erased_forks for fork in tree)
                    if not_erased:
                        raise forks_changed(not_erased)
                del self._data[(namespace, conversation_id)]
                entries = len(stored.entries) - stored.prefix_end
                appends = stored.conversation.version - stored.shared_versions
                checkpoints = len(stored.checkpoints)
                forks = 0
                # Its forks, and theirs (a fork of a conversation made again under its id
                # is not the new one's).
                pending = list(stored.forks)
                while pending:
                    fork_id, fork_incarnation = pending.pop()
                    fork = self._data.get((namespace, fork_id))
                    if fork is not None and fork.conversation.incarnation == fork_incarnation:
                        del self._data[(namespace, fork_id)]
                        entries += len(fork.entries) - fork.prefix_end
                        appends += fork.conversation.version - fork.shared_versions
                        checkpoints += len(fork.checkpoints)
                        forks += 1
                        pending.extend(fork.forks)
                erased = Deletion(True, entries, appends, forks=forks, checkpoints=checkpoints)
            kept_key = (namespace, conversation_id, incarnation)
            if receipt is None or not incarnation:
                return erased
            if not erased.deleted and kept_key not in self._receipts:
                return erased  # never a receipt of a conversation that was not there
            counts = {
                **receipt.counts,
                ENTRIES: erased.entries,
                APPENDS: erased.appends,
                FORKS: erased.forks,
                CHECKPOINTS: erased.checkpoints,
            }
            kept = self._record(
                namespace, conversation_id, incarnation, ErasureProgress(counts, receipt.remaining)
            )
            return replace(erased, receipt=kept)

    async def list_appends(
        self, namespace: str, conversation_id: uuid.UUID, after_version: int, limit: int
    ) -> list[ChainLink] | None:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return None
        rows = [
            (r.version, r.first_sequence, r.last_sequence, r.digest or None, r.commit_time, t)
            for r, t in zip(stored.records, stored.retracted, strict=True)
        ]
        if after_version > len(rows):
            return []
        previous = (rows[after_version - 1][3] if after_version else None) or GENESIS
        return links(rows[after_version : after_version + limit], previous)

    def _fork_tree(self, namespace: str, stored: _Stored) -> list[tuple[uuid.UUID, int]]:
        """The forks (id, incarnation) of a conversation and theirs that exist."""
        found: list[tuple[uuid.UUID, int]] = []
        pending = list(stored.forks)
        while pending:
            fork_id, fork_incarnation = pending.pop()
            fork = self._data.get((namespace, fork_id))
            if fork is not None and fork.conversation.incarnation == fork_incarnation:
                found.append((fork_id, fork_incarnation))
                pending.extend(fork.forks)
        return found

    async def list_forks(
        self, namespace: str, conversation_id: uuid.UUID, after_key: int, limit: int
    ) -> list[ForkRef]:
        async with self._lock:
            found: list[ForkRef] = []
            root = self._data.get((namespace, conversation_id))
            level = [root] if root is not None else []
            while level:
                below: list[_Stored] = []
                for stored in level:
                    for fork_id, fork_incarnation in stored.forks:
                        fork = self._data.get((namespace, fork_id))
                        if fork is not None and fork.conversation.incarnation == fork_incarnation:
                            origin = fork.conversation.fork_origin
                            found.append(
                                ForkRef(
                                    fork_id,
                                    fork_incarnation,
                                    uuid.UUID(str(stored.conversation.conversation_id)),
                                    origin.through_sequence if origin is not None else 0,
                                    fork.key,
                                )
                            )
                            below.append(fork)
                level = below
            found.sort(key=lambda fork: fork.key)
            return [fork for fork in found if fork.key > after_key][:limit]

    async def fork_conversation(self, fork: NewFork) -> tuple[Conversation, bool]:
        async with self._lock:
            source = self._data.get((fork.namespace, fork.source_id))
            if source is None:
                raise conversation_not_found()
            if fork.request_id is not None and fork.request_id in source.fork_requests:
                digest, fork_id, incarnation = source.fork_requests[fork.request_id]
                made = self._data.get((fork.namespace, fork_id))
                if made is not None and made.conversation.incarnation == incarnation:
                    if digest != fork.payload_hash:
                        raise request_id_reused()
                    return made.conversation, False
            current = source.conversation
            through = fork.through_sequence
            if through > current.last_sequence:
                raise fork_point_out_of_range(current.last_sequence)
            if (fork.namespace, fork.conversation_id) in self._data:
                raise conversation_exists()
            # The fork point: the last append whose entries all lie at or before it.
            version = max(
                (r.version for r in source.records if r.last_sequence <= through), default=0
            )
            cut_from = source.records[version - 1].last_sequence + 1 if version else 1
            now = datetime.now(UTC)
            state = source.states[version]
            previous = (source.records[version - 1].digest if version else b"") or GENESIS
            cut = [entry.message for entry in source.entries[cut_from - 1 : through]]
            digest = chain_step(previous, version + 1, cut_from, through, now, body((), cut))
            conversation = Conversation(
                fork.conversation_id,
                fork.namespace,
                version + 1,
                through,
                now,
                now,
                dict(current.labels),
                _random_token(),
                current.user_id,
                state,
                fork_origin=ForkOrigin(fork.source_id, through),
                head_digest=digest,
            )
            # The prefix as the fork sees it: what the source retracted after the fork
            # point is not retracted in the fork.
            entries = [
                entry
                if entry.retracted_version <= version
                else replace(entry, retracted_version=0, retract_time=None)
                for entry in source.entries[:through]
            ]
            record = AppendRecord(
                version + 1, cut_from, through, Usage(), now, fork.payload_hash, digest
            )
            self._data[(fork.namespace, fork.conversation_id)] = _Stored(
                conversation,
                entries,
                records=[*source.records[:version], record],
                retracted=[*source.retracted[:version], ()],
                states=[*source.states[: version + 1], state],
                prefix_end=through,
                shared_versions=version,
            )
            source.forks.append((fork.conversation_id, conversation.incarnation))
            if fork.request_id is not None:
                source.fork_requests[fork.request_id] = (
                    fork.payload_hash,
                    fork.conversation_id,
                    conversation.incarnation,
                )
            return conversation, True

    # -- erasure receipts (the same rule as the PostgreSQL store: receipts.model.merge) --

    def _record(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        progress: ErasureProgress,
        receipt_id: uuid.UUID | None = None,
    ) -> ErasureReceipt:
        key = (namespace, conversation_id, incarnation)
        self._receipts[key] = merge(
            self._receipts.get(key),
            progress,
            receipt_id=receipt_id or uuid.uuid4(),
            namespace=namespace,
            conversation_id=conversation_id,
            incarnation=incarnation,
            now=datetime.now(UTC),
        )
        return self._receipts[key]

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        progress: ErasureProgress,
        receipt_id: uuid.UUID,
    ) -> ErasureReceipt | None:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            exists = stored is not None and stored.conversation.incarnation == incarnation
            if not exists and (namespace, conversation_id, incarnation) not in self._receipts:
                return None
            return self._record(namespace, conversation_id, incarnation, progress, receipt_id)

    async def get_receipt(self, namespace: str, receipt_id: uuid.UUID) -> ErasureReceipt | None:
        found = [
            r
            for (ns, _, _), r in self._receipts.items()
            if ns == namespace and r.receipt_id == receipt_id
        ]
        return found[0] if found else None

    async def latest_receipt(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> ErasureReceipt | None:
        mine = [
            r
            for (ns, cid, _), r in self._receipts.items()
            if (ns, cid) == (namespace, conversation_id)
        ]
        return max(mine, key=lambda r: (r.create_time, r.receipt_id)) if mine else None

    async def sweep_receipts(self, retention_s: float, limit: int) -> int:
        async with self._lock:
            cutoff = datetime.now(UTC) - timedelta(seconds=retention_s)
            old = sorted(
                (k for k, r in self._receipts.items() if r.create_time <= cutoff),
                key=lambda k: self._receipts[k].create_time,
            )[:limit]
            for key in old:
                del self._receipts[key]
            return len(old)

    # -- turn leases (the same rule as the PostgreSQL store: model.decide_lease) ----

    async def acquire_turn(self, request: LeaseRequest) -> LeaseAttempt:
        async with self._lock:
            key = (request.namespace, request.conversation_id)
            created = False
            if key not in self._data:
                if not request.create_if_missing:
                    raise conversation_not_found()
                now = datetime.now(UTC)
                self._data[key] = _Stored(
                    Conversation(
                        request.conversation_id,
                        request.namespace,
                        0,
                        0,
                        now,
                        now,
                        {},
                        _random_token(),
                    ),
                    provisional=request.turn_id,
                )
                created = True
            stored = self._data[key]
            # The incarnation stands for PostgreSQL's conversation key here: a conversation
            # made again under its id is another one.
            incarnation = stored.conversation.incarnation
            if request.conversation_key is not None and request.conversation_key != incarnation:
                raise conversation_erased()
            now = datetime.now(UTC)
            retained = now + timedelta(seconds=request.outcome_retention_s)
            for turn_id, turn in list(stored.turns.items()):
                lapsed = turn.state in ("waiting", "running") and turn.until < now
                if lapsed and turn_id != request.turn_id:
                    if turn.state == "running" and turn.model_called:
                        _interrupt(turn, retained)  # never run again under its id
                    else:
                        del stored.turns[turn_id]
            own_turn = stored.turns.get(request.turn_id)
            own = own_turn.row(request.turn_id, now) if own_turn else None
            others = [
                turn.row(turn_id, now)
                for turn_id, turn in stored.turns.items()
                if turn_id != request.turn_id
                and turn.state in ("waiting", "running")
                and turn.until >= now
            ]
            decision = decide_lease(request, own, others, stored.appends.get(request.turn_id))
            running = own_turn is not None and own_turn.state == "running"
            if isinstance(decision, EndedTurn) and running:
                assert own_turn is not None
                _interrupt(own_turn, retained)  # interrupted: kept as its outcome
            if isinstance(decision, AppendRecord | EndedTurn):
                return decision
            if isinstance(decision, Enqueue):
                ticket = next(_TICKETS)
                stored.turns[request.turn_id] = _Turn(
                    "waiting",
                    True,
                    request.payload_hash,
                    now + timedelta(seconds=WAIT_LEASE_S),
                    ticket=ticket,
                )
                return Waiting(same_turn=False, ticket=ticket, key=incarnation)
            if not isinstance(decision, Granted):
                if not decision.same_turn and own_turn is not None:
                    own_turn.until = now + timedelta(seconds=WAIT_LEASE_S)
                place = None if decision.same_turn else request.ticket
                return Waiting(decision.same_turn, place, incarnation)
            token = _random_token()
            until = now + timedelta(seconds=request.ttl_s)
            stored.turns[request.turn_id] = _Turn(
                "running", decision.exclusive, request.payload_hash, until, fencing_token=token
            )
            return TurnLease(
                request.conversation_id,
                request.turn_id,
                token,
                until,
                decision.exclusive,
                created,
            )

    async def renew_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> TurnLease | None:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            turn = stored.turns.get(turn_id) if stored else None
            now = datetime.now(UTC)
            if (
                turn is None
                or turn.fencing_token != fencing_token
                or turn.state != "running"
                or turn.until < now
            ):
                return None
            turn.until = now + timedelta(seconds=ttl_s)
            turn.model_called = turn.model_called or calling_model
            return TurnLease(conversation_id, turn_id, fencing_token, turn.until, turn.exclusive)

    async def release_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ended: EndedTurn | None,
        retention_s: float,
        model_call_failed: bool = False,
    ) -> bool:
        async with self._lock:
            key = (namespace, conversation_id)
            stored = self._data.get(key)
            turn = stored.turns.get(turn_id) if stored else None
            if stored is None or turn is None:
                return False
            if turn.fencing_token != fencing_token or turn.state != "running":
                return False
            now = datetime.now(UTC)
            if ended is None and turn.model_called and not model_call_failed:
                ended = interrupted()  # a repeat must not call the model again
            if ended is not None:
                stored.turns[turn_id] = replace(
                    turn,
                    state="ended",
                    until=now + timedelta(seconds=retention_s),
                    ended=replace(ended, end_time=now),
                )
                return True
            del stored.turns[turn_id]
            live = any(
                t.state in ("waiting", "running") and t.until >= now for t in stored.turns.values()
            )
            if (
                stored.provisional == turn_id
                and stored.conversation.version == 0
                and not live
                and not stored.checkpoints  # a thread's, kept (leases/statements.py)
            ):
                del self._data[key]
            return True

    async def leave_queue(
        self, namespace: str, conversation_id: uuid.UUID, turn_id: str, ticket: int
    ) -> None:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            turn = stored.turns.get(turn_id) if stored else None
            if (
                stored is not None
                and turn is not None
                and (turn.state, turn.ticket)
                == (
                    "waiting",
                    ticket,
                )
            ):
                del stored.turns[turn_id]

    async def sweep_turns(self, limit: int, retention_s: float = 24 * 3600.0) -> int:
        async with self._lock:
            now = datetime.now(UTC)
            swept = 0
            for stored in self._data.values():
                for turn_id, turn in list(stored.turns.items()):
                    done = turn.state in ("ended", "committed")
                    if swept < limit and done and turn.until < now:
                        del stored.turns[turn_id]
                        swept += 1
            return swept

    # -- checkpoints (services/transcript/checkpoints/) ------------------------------

    def _hold(self, namespace: str, conversation_id: uuid.UUID, fence: Fence | None) -> _Stored:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            raise conversation_not_found()
        now = datetime.now(UTC)
        if fence is not None:
            turn = stored.turns.get(fence.turn_id)
            if (
                turn is None
                or turn.state != "running"
                or turn.fencing_token != fence.fencing_token
                or turn.until < now
            ):
                raise turn_lease_lost()
        else:
            holder = stored.live_holder(now)
            if holder is not None:
                raise conversation_busy(holder[0])
        return stored

    def _weight(self, stored: _Stored, found: StoredCheckpoint) -> int:
        values = sum(
            len(stored.blobs[(found.checkpoint_ns, c, v)].value or b"")
            for c, v in found.channel_versions.items()
            if (found.checkpoint_ns, c, v) in stored.blobs
        )
        writes = sum(
            len(w.value.value or b"")
            for (ns, cid, _, _), w in stored.writes.items()
            if (ns, cid) == (found.checkpoint_ns, found.checkpoint_id)
        )
        return len(found.checkpoint.value or b"") + values + writes

    def _read(self, stored: _Stored, found: StoredCheckpoint) -> StoredCheckpoint:
        ns, cid = found.checkpoint_ns, found.checkpoint_id
        return replace(
            found,
            channel_values=tuple(
                ChannelValue(c, v, stored.blobs[(ns, c, v)])
                for c, v in found.channel_versions.items()
                if (ns, c, v) in stored.blobs
            ),
            pending_writes=tuple(
                w
                for (wns, wid, _, _), w in sorted(
                    stored.writes.items(),
                    key=lambda item: (item[1].task_path, item[1].task_id, item[1].idx),
                )
                if (wns, wid) == (ns, cid)
            ),
        )

    async def put_checkpoint(self, put: NewCheckpoint) -> int:
        async with self._lock:
            stored = self._hold(put.namespace, put.conversation_id, put.fence)
            new = {
                (put.checkpoint_ns, v.channel, v.version): v.value
                for v in put.channel_values
                if (put.checkpoint_ns, v.channel, v.version) not in stored.blobs
            }
            row = StoredCheckpoint(
                put.checkpoint_ns,
                put.checkpoint_id,
                put.parent_checkpoint_id,
                put.checkpoint,
                put.metadata_json,
                dict(put.channel_versions),
                (),
                (),
                datetime.now(UTC),
            )
            weight = len(put.checkpoint.value or b"") + sum(
                len(
                    (
                        stored.blobs.get((put.checkpoint_ns, c, v))
                        or new.get((put.checkpoint_ns, c, v))
                        or TypedValue("", b"")
                    ).value
                    or b""
                )
                for c, v in put.channel_versions.items()
            )
            if weight > put.max_checkpoint_bytes:
                raise checkpoint_too_large(put.max_checkpoint_bytes)
            stored.blobs.update(new)
            key = (put.checkpoint_ns, put.checkpoint_id)
            stored.checkpoints[key] = row
            stored.run_ids[key] = put.run_id
            return len(new)

    async def put_checkpoint_writes(self, put: NewWrites) -> int:
        async with self._lock:
            stored = self._hold(put.namespace, put.conversation_id, put.fence)
            writes = dict(stored.writes)
            count = 0
            for write in put.writes:
                key = (put.checkpoint_ns, put.checkpoint_id, put.task_id, write.idx)
                if key in writes and write.idx >= 0:
                    continue
                writes[key] = write
                count += 1
            found = stored.checkpoints.get((put.checkpoint_ns, put.checkpoint_id))
            kept, stored.writes = stored.writes, writes
            weight = (
                self._weight(stored, found)
                if found is not None
                else sum(
                    len(w.value.value or b"")
                    for (ns, cid, _, _), w in writes.items()
                    if (ns, cid) == (put.checkpoint_ns, put.checkpoint_id)
                )
            )
            if weight > put.max_checkpoint_bytes:
                stored.writes = kept  # nothing written
                raise checkpoint_too_large(put.max_checkpoint_bytes)
            return count

    async def get_checkpoint(
        self, namespace: str, conversation_id: uuid.UUID, checkpoint_ns: str, checkpoint_id: str
    ) -> StoredCheckpoint | None:
        async with self._lock:
            stored = self._data.get((namespace, conversation_id))
            if stored is None:
                return None
            if checkpoint_id:
                found = stored.checkpoints.get((checkpoint_ns, checkpoint_id))
            else:
                ids = [cid for ns, cid in stored.checkpoints if ns == checkpoint_ns]
                found = stored.checkpoints[(checkpoint_ns, max(ids))] if ids else None
            return self._read(stored, found) if found is not None else None

    async def list_checkpoints(self, query: CheckpointQuery) -> CheckpointPage:
        async with self._lock:
            stored = self._data.get((query.namespace, query.conversation_id))
            if stored is None:
                return CheckpointPage([], False)
            wanted = json.loads(query.filter_json) if query.filter_json else {}
            rows = sorted(
                (
                    row
                    for (ns, cid), row in stored.checkpoints.items()
                    if (query.checkpoint_ns is None or ns == query.checkpoint_ns)
                    and all(json.loads(row.metadata_json).get(k) == v for k, v in wanted.items())
                    and (query.before_checkpoint_id is None or cid < query.before_checkpoint_id)
                    and (query.after is None or (cid, ns) < query.after)
                ),
                key=lambda row: (row.checkpoint_id, row.checkpoint_ns),
                reverse=True,
            )
            chosen: list[StoredCheckpoint] = []
            weight = 0
            for row in rows[: query.limit]:
                size = self._weight(stored, row)
                if chosen and weight + size > query.max_bytes:
                    break
                chosen.append(self._read(stored, row))
                weight += size
            return CheckpointPage(chosen, len(rows) > len(chosen))

    async def delete_checkpoints(self, request: DeleteRequest) -> CheckpointDeletion:
        async with self._lock:
            deleted = CheckpointDeletion()
            for (namespace, conversation_id), stored in self._data.items():
                if namespace != request.namespace:
                    continue
                if request.run_ids:
                    doomed = [k for k, run in stored.run_ids.items() if run in request.run_ids]
                elif conversation_id in request.conversation_ids:
                    newest: dict[str, str] = {}
                    for ns, cid in stored.checkpoints:
                        newest[ns] = max(newest.get(ns, cid), cid)
                    doomed = [
                        (ns, cid)
                        for ns, cid in stored.checkpoints
                        if not request.keep_latest or cid < newest[ns]
                    ]
                else:
                    continue
                for key in doomed:
                    del stored.checkpoints[key]
                    del stored.run_ids[key]
                writes = [k for k in stored.writes if (k[0], k[1]) not in stored.checkpoints]
                for write_key in writes:
                    del stored.writes[write_key]
                named = {
                    (row.checkpoint_ns, c, v)
                    for row in stored.checkpoints.values()
                    for c, v in row.channel_versions.items()
                }
                values = [k for k in stored.blobs if k not in named]
                for value_key in values:
                    del stored.blobs[value_key]
                deleted = CheckpointDeletion(
                    deleted.checkpoints + len(doomed),
                    deleted.channel_values + len(values),
                    deleted.writes + len(writes),
                )
            return deleted

    async def copy_checkpoints(
        self, namespace: str, source: uuid.UUID, target: uuid.UUID
    ) -> int | None:
        async with self._lock:
            origin = self._data.get((namespace, source))
            if origin is None:
                return None
            into = self._data.get((namespace, target))
            if into is None:
                raise conversation_not_found()
            copied = 0
            for key, row in origin.checkpoints.items():
                if key not in into.checkpoints:
                    into.checkpoints[key] = row
                    into.run_ids[key] = origin.run_ids[key]
                    copied += 1
            for value_key, value in origin.blobs.items():
                into.blobs.setdefault(value_key, value)
            for write_key, write in origin.writes.items():
                into.writes.setdefault(write_key, write)
            return copied
