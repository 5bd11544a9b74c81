"""RunifoldStore: LangGraph's BaseStore on Runifold's MemoryService.

An item is a memory of one Runifold namespace (the client's). What LangGraph calls the
item's namespace (a tuple of labels) and key travel as the memory's metadata, so that
the server filters by them: `lg.store` marks a store item, `lg.ns.<i>` holds the i-th
label, `lg.key` the key. The memory's id is a UUIDv5 of (Runifold namespace, labels,
key): a get is one GetMemory, a put an upsert on that id.

The memory's content is the text the server embeds and indexes (dense and BM25): the
item's value as JSON (LangGraph's default, `fields=["$"]`), or the texts at the index
fields when fields are chosen; then the value's JSON is kept exactly in `lg.value.<i>`
metadata parts. Either way a get returns the value that was put (a JSON round trip).

Every memory has a source: `langgraph://store/<labels>/<key>` (percent-encoded), so
that MemoryService.ForgetSource with that URI erases the item; an item written inside
`store.citing(conversation_id, from_sequence, through_sequence)` also cites that range
of a transcript, and goes with it when the conversation is erased.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client.client import AsyncClient, Client, source
from runifold_client.errors import AlreadyExists, NotFound, RevisionConflict

T = TypeVar("T")

# Metadata keys of a store item (MemoryService allows 32 entries per memory, keys up to
# 64 characters, values up to 1 KiB).
MARKER = "lg.store"
KEY = "lg.key"
LABEL = "lg.ns.{}"
INDEXED = "lg.indexed"
TTL_MINUTES = "lg.ttl"
UPDATED = "lg.updated"
VALUE_PART = "lg.value.{}"
MAX_METADATA_ENTRIES = 32
MAX_METADATA_VALUE_BYTES = 1024
# Labels per namespace: the rest of the 32 metadata entries carry the value's parts.
MAX_NAMESPACE_DEPTH = 12
# SearchMemories answers at most 256 results: a query search ranks that many candidates,
# to which a value filter, the offset and the limit then apply.
MAX_SEARCH_CANDIDATES = 256
# Memories per ListMemories page while listing items or namespaces.
LIST_PAGE_SIZE = 500
# The namespace of the UUIDv5 item ids (RFC 9562, 5.5).
_ITEM_IDS = uuid.UUID("2f0d8a8e-6f51-4c1e-9d64-0b5a3c1f7e19")
# Tries of a put that loses a race with another writer of the same item.
_PUT_ATTEMPTS = 8


@dataclass(frozen=True)
class _Citation:
    conversation_id: str
    from_sequence: int
    through_sequence: int


_citation: contextvars.ContextVar[_Citation | None] = contextvars.ContextVar(
    "runifold_langgraph_store_citation", default=None
)


def item_uri(namespace: Sequence[str], key: str) -> str:
    """The external URI an item cites: `langgraph://store/<label>/.../<key>`, each part
    percent-encoded (MemoryService.ForgetSource with it erases the item)."""
    return "langgraph://store/" + "/".join(quote(part, safe="") for part in (*namespace, key))


def _json(value: Any) -> str:
    # Insertion order kept, non-ASCII as is (the embedder reads it); NaN and Infinity are
    # not JSON (and not jsonb): refused here rather than by the server.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def _parts(text: str, size: int) -> list[str]:
    """`text` cut into pieces of at most `size` UTF-8 bytes, never inside a character."""
    parts: list[str] = []
    current: list[str] = []
    used = 0
    for char in text:
        width = len(char.encode("utf-8", "surrogatepass"))
        if used + width > size:
            parts.append("".join(current))
            current, used = [], 0
        current.append(char)
        used += width
    if current:
        parts.append("".join(current))
    return parts


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    """A JSON value as PostgreSQL's `value->>key` gives it (None for a missing one)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _operator(value: Any, operator: str, operand: Any) -> bool:
    """One comparison of LangGraph's filters ($eq, $ne, $gt, $gte, $lt, $lte) as
    PostgresStore applies it: an ordering with a number compares numbers, and a value
    that is not a JSON number matches none; with another operand it compares the
    value's text with the operand's (a missing value matches none)."""
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if operator not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"unsupported filter operator: {operator}")
    left: Any
    right: Any
    if _is_number(operand):
        if not _is_number(value):
            return False
        left, right = float(value), float(operand)
    else:
        left, right = _text(value), str(operand)
        if left is None:
            return False
    if operator == "$gt":
        return bool(left > right)
    if operator == "$gte":
        return bool(left >= right)
    if operator == "$lt":
        return bool(left < right)
    return bool(left <= right)


def _matches(value: Any, wanted: Any) -> bool:
    """Whether a value matches a filter value: operators, nested objects (each key
    matched), lists (element by element), else equality (LangGraph's semantics)."""
    if isinstance(wanted, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(value, k, v) for k, v in wanted.items())
        if not isinstance(value, dict):
            return False
        return all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_matches(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _passes(value: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    return not wanted or all(_matches(value.get(k), v) for k, v in wanted.items())


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"unsupported match type: {condition.match_type}")
    return all(p == "*" or n == p for n, p in pairs)


def _holds(memory: memory_pb.Memory, wanted: Mapping[str, str]) -> bool:
    """Whether a memory's metadata holds every pair: the server filters by them already;
    checked again so that a server older than ListMemoriesRequest.metadata_filter (which
    ignores the field) can never hand the store another item or a memory of another
    kind."""
    return all(memory.metadata.get(k) == v for k, v in wanted.items())


def _time(stamp: Any) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


class RunifoldStore(BaseStore):  # type: ignore[misc]  # langgraph: not followed by mypy
    """LangGraph's BaseStore on Runifold's MemoryService, sync and async.

    >>> store = RunifoldStore(Client(namespace="tenant-42"))   # or RunifoldStore() from env
    >>> store.put(("users", "u1"), "prefs", {"text": "likes short answers"})
    >>> store.search(("users",), query="answer style", filter={"text": {"$ne": ""}})

    `client`: a blocking Client (what its constructor reads from RUNIFOLD_TARGET,
    RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN when None), which serves both `batch` and
    `abatch`; or an AsyncClient, which serves `abatch` only. The items live in the
    client's namespace.

    `index`: LangGraph's IndexConfig; only `fields` matters (what text of a value the
    server embeds, default `["$"]`: the whole value as JSON); MemoryService embeds with
    its own model, so `dims` and `embed` are ignored. `ttl`: LangGraph's TTLConfig
    (`default_ttl` in minutes, `refresh_on_read`); expiry is the memory's expire_time.
    `refresh_slack`: a read restarts an item's clock only when that moves its expiry by
    more than this (at most half its TTL), since each restart is a write (and the
    server embeds the item again): a hot item is not rewritten on every read, and
    expires at most that much earlier than LangGraph's rule says.
    """

    supports_ttl = True

    def __init__(
        self,
        client: Client | AsyncClient | None = None,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        refresh_slack: timedelta = timedelta(seconds=60),
    ) -> None:
        self.client = client if client is not None else Client()
        self._owned = client is None
        self.index_config = index
        fields = (index or {}).get("fields") or ["$"]
        self.fields: list[str] = list(fields)
        self.ttl_config = ttl
        self.refresh_slack = refresh_slack

    # -- plumbing -------------------------------------------------------------

    @property
    def _aio(self) -> AsyncClient:
        return self.client.aio if isinstance(self.client, Client) else self.client

    def close(self) -> None:
        """Close the client when the store made it."""
        if self._owned and isinstance(self.client, Client):
            self.client.close()

    def _item_id(self, namespace: tuple[str, ...], key: str) -> str:
        return str(uuid.uuid5(_ITEM_IDS, json.dumps([self._aio.namespace, list(namespace), key])))

    @staticmethod
    @contextlib.contextmanager
    def citing(conversation_id: str, from_sequence: int, through_sequence: int) -> Iterator[None]:
        """Items put inside this block (in this thread or task) also cite this range of a
        Runifold transcript (a LangGraph thread's entries): erasing the conversation
        erases them, and TranscriptService checks that the range exists."""
        token = _citation.set(_Citation(conversation_id, from_sequence, through_sequence))
        try:
            yield
        finally:
            _citation.reset(token)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order (each sees the effects of the ones before it)."""
        if not isinstance(self.client, Client):
            raise TypeError("a RunifoldStore on an AsyncClient is async only: use abatch")
        # The citation is read here: the client's loop runs in another thread.
        return self.client._run(self._run_ops(list(ops), _citation.get()))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order (each sees the effects of the ones before it)."""
        coroutine = self._run_ops(list(ops), _citation.get())
        if isinstance(self.client, Client):
            # The blocking client's channel lives on its own loop.
            return await _on_loop(self.client, coroutine)
        return await coroutine

    async def _run_ops(self, ops: list[Op], citation: _Citation | None) -> list[Result]:
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(op))
            elif isinstance(op, PutOp):
                await self._put(op, citation)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list_namespaces(op))
            else:
                raise ValueError(f"unknown store operation: {op!r}")
        return results

    # -- items <-> memories ---------------------------------------------------

    def _encode(self, op: PutOp, value: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        """The memory's content and metadata for an item."""
        if len(op.namespace) > MAX_NAMESPACE_DEPTH:
            raise ValueError(f"a RunifoldStore namespace has at most {MAX_NAMESPACE_DEPTH} labels")
        for text, what in [
            (op.key, "key"),
            *[(label, "namespace label") for label in op.namespace],
        ]:
            if len(text.encode("utf-8")) > MAX_METADATA_VALUE_BYTES:
                raise ValueError(
                    f"a RunifoldStore {what} is at most {MAX_METADATA_VALUE_BYTES} bytes"
                )
            if not text:
                raise ValueError(f"a RunifoldStore {what} must not be empty")
        document = _json(value)
        metadata = {MARKER: "1", KEY: op.key}
        metadata.update({LABEL.format(i): label for i, label in enumerate(op.namespace)})
        if op.ttl is not None:
            metadata[TTL_MINUTES] = repr(float(op.ttl))
        fields = self.fields if op.index is None else op.index
        texts: list[str] = []
        if fields is not False and fields != ["$"]:
            for path in fields:
                texts.extend(t for t in get_text_at_path(value, tokenize_path(path)) if t)
        metadata[INDEXED] = "1" if fields is not False and (fields == ["$"] or texts) else "0"
        if not texts:
            # The value itself is the content (and, indexed, what is embedded).
            return document, metadata
        parts = _parts(document, MAX_METADATA_VALUE_BYTES)
        # Room for one more entry: UPDATED, which a TTL refresh adds.
        room = MAX_METADATA_ENTRIES - len(metadata) - 1
        if len(parts) > room:
            raise ValueError(
                f"a value indexed by fields is at most {room} KiB of JSON in a RunifoldStore "
                "(index the whole value, or none, for up to MemoryService's content limit)"
            )
        metadata.update({VALUE_PART.format(i): part for i, part in enumerate(parts)})
        return "\n".join(texts), metadata

    @staticmethod
    def _decode(memory: memory_pb.Memory, score: float | None = None) -> SearchItem:
        metadata = memory.metadata
        depth = 0
        while LABEL.format(depth) in metadata:
            depth += 1
        namespace = tuple(metadata[LABEL.format(i)] for i in range(depth))
        if VALUE_PART.format(0) in metadata:
            count = 0
            while VALUE_PART.format(count) in metadata:
                count += 1
            document = "".join(metadata[VALUE_PART.format(i)] for i in range(count))
        else:
            document = memory.content
        updated = (
            datetime.fromisoformat(metadata[UPDATED])
            if UPDATED in metadata
            else _time(memory.update_time)
        )
        return SearchItem(
            namespace=namespace,
            key=metadata[KEY],
            value=json.loads(document),
            created_at=_time(memory.create_time),
            updated_at=updated,
            score=score,
        )

    def _sources(
        self, namespace: tuple[str, ...], key: str, citation: _Citation | None
    ) -> list[memory_pb.MemorySource]:
        sources = [source(external_uri=item_uri(namespace, key))]
        if citation is not None:
            sources.append(
                source(citation.conversation_id, citation.from_sequence, citation.through_sequence)
            )
        return sources

    # -- operations -----------------------------------------------------------

    async def _refresh(self, memory: memory_pb.Memory) -> None:
        """Restart a TTL item's clock (LangGraph: its expiry moves to now + ttl on a read):
        the memory is written again at its revision with the same content, sources and
        metadata, its `updated_at` kept in `lg.updated`. A write racing with it wins (it
        set a fresh expiry itself)."""
        minutes = memory.metadata.get(TTL_MINUTES)
        if minutes is None:
            return
        ttl = timedelta(minutes=float(minutes))
        slack = min(self.refresh_slack, ttl / 2)
        if (
            memory.HasField("expire_time")
            and _time(memory.expire_time) >= datetime.now(UTC) + ttl - slack
        ):
            return  # restarted recently enough
        metadata = dict(memory.metadata)
        if UPDATED not in metadata:
            metadata[UPDATED] = _time(memory.update_time).isoformat()
        sources = [
            source(external_uri=s.external_uri)
            if s.external_uri
            else source(s.conversation_id, s.from_sequence, s.through_sequence)
            for s in memory.sources
        ]
        with contextlib.suppress(RevisionConflict, NotFound):
            await self._aio.upsert_memory(
                memory.content,
                sources=sources,
                memory_id=memory.memory_id,
                expected_revision=memory.revision,
                metadata=metadata,
                ttl=ttl,
            )

    async def _get(self, op: GetOp) -> Item | None:
        try:
            memory = await self._aio.get_memory(self._item_id(op.namespace, op.key))
        except NotFound:
            return None
        item = self._decode(memory)
        if op.refresh_ttl:
            await self._refresh(memory)
        return Item(
            namespace=item.namespace,
            key=item.key,
            value=item.value,
            created_at=item.created_at,
            updated_at=item.updated_at,
        )

    async def _put(self, op: PutOp, citation: _Citation | None) -> None:
        memory_id = self._item_id(op.namespace, op.key)
        if op.value is None:
            await self._aio.delete_memory(memory_id)
            return
        content, metadata = self._encode(op, op.value)
        sources = self._sources(op.namespace, op.key, citation)
        ttl = timedelta(minutes=op.ttl) if op.ttl is not None else None
        for _ in range(_PUT_ATTEMPTS):
            try:
                current: memory_pb.Memory | None = await self._aio.get_memory(memory_id)
            except NotFound:
                current = None
            try:
                await self._aio.upsert_memory(
                    content,
                    sources=sources,
                    memory_id=memory_id,
                    expected_revision=current.revision if current is not None else None,
                    metadata=metadata,
                    ttl=ttl,
                )
                return
            except (AlreadyExists, RevisionConflict):
                continue  # another writer of this item came between: read it again
            except NotFound as gone:
                if gone.reason != "MEMORY_NOT_FOUND":
                    raise  # a cited conversation range that does not exist
        raise RuntimeError(f"put of {op.key!r} lost {_PUT_ATTEMPTS} races in a row")

    @staticmethod
    def _prefix_filter(prefix: Sequence[str]) -> dict[str, str]:
        wanted = {MARKER: "1"}
        wanted.update({LABEL.format(i): label for i, label in enumerate(prefix) if label != "*"})
        return wanted

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.limit <= 0:
            return []
        offset = max(op.offset, 0)
        if len(op.namespace_prefix) > MAX_NAMESPACE_DEPTH:
            return []
        wanted = self._prefix_filter(op.namespace_prefix)
        found: list[tuple[SearchItem, memory_pb.Memory]] = []
        if op.query:
            wanted[INDEXED] = "1"
            reply = await self._aio.search_memories(
                op.query,
                limit=MAX_SEARCH_CANDIDATES
                if op.filter
                else min(offset + op.limit, MAX_SEARCH_CANDIDATES),
                metadata_filter=wanted,
            )
            for hit in reply.results:
                if not _holds(hit.memory, wanted):
                    continue
                item = self._decode(hit.memory, hit.score)
                if _passes(item.value, op.filter):
                    found.append((item, hit.memory))
            found = found[offset : offset + op.limit]
        else:
            skipped = 0
            async for memory in self._aio.list_memories(
                metadata_filter=wanted, page_size=min(LIST_PAGE_SIZE, offset + op.limit + 1)
            ):
                if not _holds(memory, wanted):
                    continue
                item = self._decode(memory)
                if not _passes(item.value, op.filter):
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                found.append((item, memory))
                if len(found) == op.limit:
                    break
        if op.refresh_ttl:
            for _, memory in found:
                await self._refresh(memory)
        return [item for item, _ in found]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        prefix: tuple[str, ...] = ()
        for condition in conditions:
            if condition.match_type == "prefix" and len(condition.path) > len(prefix):
                prefix = tuple(condition.path)
        if len(prefix) > MAX_NAMESPACE_DEPTH:
            return []
        seen: set[tuple[str, ...]] = set()
        # Every item under the prefix is read (its metadata names its namespace): the
        # cost grows with the items there, as InMemoryStore's listing does.
        wanted = self._prefix_filter(prefix)
        async for memory in self._aio.list_memories(
            metadata_filter=wanted, page_size=LIST_PAGE_SIZE
        ):
            if not _holds(memory, wanted):
                continue
            metadata = memory.metadata
            depth = 0
            while LABEL.format(depth) in metadata:
                depth += 1
            namespace = tuple(metadata[LABEL.format(i)] for i in range(depth))
            if all(_namespace_matches(c, namespace) for c in conditions):
                seen.add(namespace[: op.max_depth] if op.max_depth is not None else namespace)
        return sorted(seen)[op.offset : op.offset + op.limit]


async def _on_loop(client: Client, coroutine: Coroutine[Any, Any, T]) -> T:
    """Await a coroutine on the blocking client's loop from another loop."""
    future = asyncio.run_coroutine_threadsafe(coroutine, client._loop)
    return await asyncio.wrap_future(future)
