"""RunifoldStore under LangGraph's BaseStore contract: what LangGraph's own store tests
(libs/checkpoint/tests/test_store.py of langchain-ai/langgraph: put/get/delete, namespace
rules, search with filters, query, pagination, list_namespaces with prefix, suffix,
wildcards, depth and paging, batches) check of InMemoryStore, here of RunifoldStore on a
real all-in-one server (the real embedding model, Qdrant Edge), one for the module; and
what Runifold adds: TTL as memory expiry, two Runifold namespaces apart, items seen by
SearchMemories, erasure of an item's source.

The vector index follows a write within moments (MemoryService's outbox): a query
search waits for the index with a deadline, as every memory search test here does.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from datetime import timedelta
from typing import Any, ParamSpec

import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import AsyncClient, Client
from runifold_client.client import source
from runifold_client.langgraph import RunifoldStore
from runifold_client.langgraph.store import item_uri
from tests.support.stack import Stack
from tests.support.waiting import wait_for

P = ParamSpec("P")


def in_thread(test: Callable[P, None]) -> Callable[P, Coroutine[Any, Any, None]]:
    """A test of the blocking API, run in a thread: the server runs on the test's loop."""

    @functools.wraps(test)
    async def run(*args: P.args, **kwargs: P.kwargs) -> None:
        await asyncio.to_thread(test, *args, **kwargs)

    return run


def _namespace() -> str:
    return f"lg-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    """A blocking client on a Runifold namespace of the test's own."""
    with Client(stack.address, namespace=_namespace()) as c:
        yield c


@pytest.fixture
def store(client: Client) -> RunifoldStore:
    return RunifoldStore(client)


@pytest.fixture
async def aclient(stack: Stack) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.address, namespace=_namespace()) as c:
        yield c


async def _searched(
    store: RunifoldStore, prefix: tuple[str, ...], query: str, keys: set[str]
) -> None:
    """Wait until the index has every item of `keys` (a query search finds them)."""

    async def indexed() -> bool:
        found = await store.asearch(prefix, query=query, limit=50, refresh_ttl=False)
        return keys <= {item.key for item in found}

    await wait_for(indexed, timeout=20)


# -- put, get, delete ----------------------------------------------------------


VALUE: dict[str, Any] = {
    "text": "Ada prefers tea — 紅茶, not coffee",
    "n": 12345678901234567890,
    "f": 0.1,
    "neg": -2.5e-300,
    "flag": True,
    "none": None,
    "nested": {"list": [1, "two", {"three": [3.0]}], "empty": {}},
    "quote": 'a "quoted" \\ back\nslash\ttab \x01',
}


@in_thread
def test_put_get_delete_round_trip(store: RunifoldStore) -> None:
    assert store.get(("users", "u1"), "prefs") is None
    store.put(("users", "u1"), "prefs", VALUE)
    got = store.get(("users", "u1"), "prefs")
    assert got is not None
    assert got.value == VALUE and list(got.value) == list(VALUE)  # exact, keys in order
    assert (got.namespace, got.key) == (("users", "u1"), "prefs")
    assert got.created_at == got.updated_at
    # A put on the same key replaces it (an upsert): created_at stays, updated_at moves.
    store.put(("users", "u1"), "prefs", {"text": "coffee after all"})
    again = store.get(("users", "u1"), "prefs")
    assert again is not None and again.value == {"text": "coffee after all"}
    assert again.created_at == got.created_at and again.updated_at > got.updated_at
    # The same key in another namespace is another item.
    assert store.get(("users", "u2"), "prefs") is None
    assert store.get(("users",), "prefs") is None
    store.delete(("users", "u1"), "prefs")
    assert store.get(("users", "u1"), "prefs") is None
    store.delete(("users", "u1"), "prefs")  # deleting what is gone is no error
    store.put(("users", "u1"), "prefs", {"back": 1})  # and the key can be used again
    back = store.get(("users", "u1"), "prefs")
    assert back is not None and back.value == {"back": 1}


@in_thread
def test_values_indexed_by_fields_round_trip(client: Client) -> None:
    """With index fields the embedded text is the fields' text; the value still comes
    back exactly (kept in the memory's metadata)."""
    store = RunifoldStore(client, index={"dims": 384, "embed": "ignored", "fields": ["text"]})
    value = {"text": "a fact", "long": "x" * 5000, "ü": ["é" * 700]}
    store.put(("docs",), "d1", value)
    got = store.get(("docs",), "d1")
    assert got is not None and got.value == value
    memory = client.get_memory(store._item_id(("docs",), "d1"))
    assert memory.content == "a fact"
    # A value without the fields is stored whole, and not indexed.
    store.put(("docs",), "d2", {"other": 1})
    got2 = store.get(("docs",), "d2")
    assert got2 is not None and got2.value == {"other": 1}


async def test_namespace_rules_as_langgraph_states_them(aclient: AsyncClient) -> None:
    store = RunifoldStore(aclient)
    doc = {"foo": "bar"}
    for bad in [(), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")]:
        with pytest.raises(InvalidNamespaceError):
            await store.aput(bad, "foo", doc)
    # Not at the root: "langgraph" is an ordinary label.
    await store.aput(("foo", "langgraph", "foo"), "bar", doc)
    got = await store.aget(("foo", "langgraph", "foo"), "bar")
    assert got is not None and got.value == doc
    assert (await store.asearch(("foo", "langgraph", "foo")))[0].value == doc
    await store.adelete(("foo", "langgraph", "foo"), "bar")
    assert await store.aget(("foo", "langgraph", "foo"), "bar") is None
    # Past the public put: the batch checks labels only (LangGraph's rule).
    await store.abatch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert (await store.asearch(("langgraph", "foo")))[0].value == doc
    with pytest.raises(InvalidNamespaceError):
        await store.abatch([GetOp(("a.b",), "k")])


async def test_racing_puts_of_one_key_all_land(aclient: AsyncClient) -> None:
    """A put is an upsert: writers racing on one key each write (the compare-and-swap
    they lose is read again and retried), and the item holds one of their values."""
    stores = [RunifoldStore(aclient) for _ in range(2)]
    await asyncio.gather(*(stores[i % 2].aput(("race",), "k", {"writer": i}) for i in range(8)))
    got = await stores[0].aget(("race",), "k")
    assert got is not None and got.value["writer"] in range(8)
    assert len(await stores[1].asearch(("race",))) == 1


async def test_an_async_client_serves_abatch_only(aclient: AsyncClient) -> None:
    store = RunifoldStore(aclient)
    await store.aput(("a",), "k", {"v": 1})
    assert (await store.aget(("a",), "k")) is not None
    with pytest.raises(TypeError):
        store.get(("a",), "k")


async def test_a_blocking_client_serves_both(store: RunifoldStore) -> None:
    await store.aput(("a",), "k", {"v": 1})
    got = await asyncio.to_thread(store.get, ("a",), "k")
    assert got is not None and got.value == {"v": 1}


async def test_batch_runs_in_order(store: RunifoldStore) -> None:
    ns = ("batch",)
    results = await store.abatch(
        [
            PutOp(ns, "k", {"v": 1}),
            GetOp(ns, "k"),
            PutOp(ns, "k", {"v": 2}),
            GetOp(ns, "k"),
            SearchOp(ns, filter={"v": 2}),
            PutOp(ns, "k", None),
            GetOp(ns, "k"),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ns),)),
            PutOp((*ns, "deeper"), "j", {"v": 3}),
            ListNamespacesOp(),
        ]
    )
    assert results[0] is None and results[2] is None and results[5] is None
    assert results[1].value == {"v": 1}
    assert results[3].value == {"v": 2}
    assert [i.key for i in results[4]] == ["k"]
    assert results[6] is None
    assert results[7] == []
    assert results[9] == [("batch", "deeper")]
    # The blocking batch: the same order.
    sync = await asyncio.to_thread(
        store.batch,
        [PutOp(ns, "s", {"v": 9}), GetOp(ns, "s"), PutOp(ns, "s", None), GetOp(ns, "s")],
    )
    assert sync[1].value == {"v": 9} and sync[3] is None


# -- search ---------------------------------------------------------------------


DOCS = [
    ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
    ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
    ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
    ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
]


def _keys(items: list[Any]) -> list[str]:
    return [item.key for item in items]


@in_thread
def test_search_filters_without_a_query(store: RunifoldStore) -> None:
    for key, value in DOCS:
        store.put(("test",), key, value)
    store.put(("test", "sub"), "doc5", {"color": "red", "score": 1, "meta": {"tag": "x"}})
    store.put(("testing",), "doc6", {"color": "red"})  # not under ("test",)
    store.put(("labels",), "doc7", {"label": 4})
    store.put(("labels",), "doc8", {"label": "3"})  # a string: no number ordering
    assert set(_keys(store.search(("test",)))) == {"doc1", "doc2", "doc3", "doc4", "doc5"}
    assert set(_keys(store.search(("test", "sub")))) == {"doc5"}
    assert set(_keys(store.search(()))) == {f"doc{i}" for i in range(1, 9)}
    assert _keys(store.search(("labels",), filter={"label": {"$lt": 5}})) == ["doc7"]
    # A text operand compares text, as PostgreSQL's `value->>'label' < '5'`.
    assert set(_keys(store.search(("labels",), filter={"label": {"$lt": "5"}}))) == {"doc7", "doc8"}
    assert _keys(store.search(("labels",), filter={"label": {"$gt": "35"}})) == ["doc7"]
    assert set(_keys(store.search(("test",), filter={"color": "red"}))) == {"doc1", "doc2", "doc5"}
    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({"score": {"$gt": 3.2}}, {"doc1", "doc3", "doc4"}),
        ({"score": {"$gte": 4.0}}, {"doc1", "doc3"}),
        ({"score": {"$lt": 3.5}}, {"doc2", "doc5"}),
        ({"score": {"$lte": 3.5}}, {"doc2", "doc4", "doc5"}),
        ({"color": {"$eq": "blue"}}, {"doc4"}),
        ({"color": {"$ne": "red"}}, {"doc3", "doc4"}),
        ({"score": {"$gte": 4.0}, "color": "green"}, {"doc3"}),
        ({"score": {"$gt": 3.0, "$lt": 4.5}}, {"doc3", "doc4"}),
        ({"meta": {"tag": "x"}}, {"doc5"}),
        # PostgresStore's rules: a number orders JSON numbers only; another operand
        # compares text; a missing value matches no ordering.
        ({"text": {"$gt": 1}}, set()),
        ({"missing": {"$lt": 10}}, set()),
        ({"color": {"$gte": "green"}}, {"doc1", "doc2", "doc3", "doc5"}),
    ]
    for wanted, keys in cases:
        assert set(_keys(store.search(("test",), filter=wanted))) == keys, wanted
    # Pages: limit and offset over one stable order.
    every = _keys(store.search(("test",), limit=10))
    pages = [_keys(store.search(("test",), limit=2, offset=o)) for o in (0, 2, 4)]
    assert [k for page in pages for k in page] == every and [len(p) for p in pages] == [2, 2, 1]
    assert (
        _keys(store.search(("test",), filter={"color": "red"}, limit=1, offset=1))
        == [k for k in every if k in {"doc1", "doc2", "doc5"}][1:2]
    )
    assert store.search(("nothing",)) == []


async def test_search_with_a_query_and_filters(store: RunifoldStore) -> None:
    """LangGraph's test_vector_search_with_filters, with the real embedding model."""
    for key, value in DOCS:
        await store.aput(("test",), key, value)
    await _searched(store, ("test",), "apple", {"doc1", "doc2", "doc3", "doc4"})
    results = await store.asearch(("test",), query="apple", filter={"color": "red"})
    assert len(results) == 2 and results[0].key == "doc1"
    assert all(r.score is not None for r in results)
    results = await store.asearch(("test",), query="car", filter={"color": "red"})
    assert len(results) == 2 and results[0].key == "doc2"
    results = await store.asearch(("test",), query="bbbbluuu", filter={"score": {"$gt": 3.2}})
    assert set(_keys(results)) == {"doc1", "doc3", "doc4"}
    results = await store.asearch(
        ("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"}
    )
    assert _keys(results) == ["doc3"]
    # Pagination (test_vector_search_pagination).
    page1 = await store.asearch(("test",), query="apple", limit=2)
    page2 = await store.asearch(("test",), query="apple", limit=2, offset=2)
    assert len(page1) == 2 and len(page2) == 2 and not set(_keys(page1)) & set(_keys(page2))
    # Edge cases (test_vector_search_edge_cases): an empty query is no query.
    assert len(await store.asearch(("test",), query="")) == 4
    assert len(await store.asearch(("test",), query="test " * 100)) == 4
    assert len(await store.asearch(("test",), query="test!@#$%^&*()")) == 4
    # The prefix bounds a query search too.
    await store.aput(("other",), "doc9", {"text": "red apple"})
    await _searched(store, ("other",), "apple", {"doc9"})
    assert "doc9" not in _keys(await store.asearch(("test",), query="red apple"))


async def test_updates_are_embedded_again_and_unindexed_items_are_not_found(
    store: RunifoldStore,
) -> None:
    """LangGraph's test_vector_update_with_embedding."""
    ns = ("test",)
    await store.aput(ns, "doc1", {"text": "zany zebra Xerxes"})
    await store.aput(ns, "doc2", {"text": "something about dogs"})
    await store.aput(ns, "doc3", {"text": "text about birds"})
    await _searched(store, ns, "Zany Xerxes", {"doc1", "doc2", "doc3"})
    initial = await store.asearch(ns, query="Zany Xerxes")
    assert initial[0].key == "doc1"
    before = initial[0].score
    assert before is not None

    await store.aput(ns, "doc1", {"text": "new text about dogs"})

    async def embedded_again() -> bool:
        found = await store.asearch(ns, query="new text about dogs")
        return bool(found) and found[0].key == "doc1"

    await wait_for(embedded_again, timeout=20)
    after = next(r for r in await store.asearch(ns, query="Zany Xerxes") if r.key == "doc1")
    assert after.score is not None and after.score < before
    assert after.value == {"text": "new text about dogs"}
    # Not indexed: found by a listing, never by a query.
    await store.aput(ns, "doc4", {"text": "new text about dogs"}, index=False)
    await store.aput(ns, "doc5", {"text": "new text about dogs too"})
    await _searched(store, ns, "new text about dogs", {"doc5"})
    found = await store.asearch(ns, query="new text about dogs", limit=3)
    assert "doc4" not in _keys(found)
    assert "doc4" in _keys(await store.asearch(ns, limit=10))


async def test_index_fields_choose_what_is_embedded(client: Client) -> None:
    store = RunifoldStore(client, index={"fields": ["title"]})
    await store.aput(("kb",), "a", {"title": "volcano eruption", "body": "quarterly tax filing"})
    await store.aput(("kb",), "b", {"title": "quarterly tax filing", "body": "volcano eruption"})
    await _searched(store, ("kb",), "volcano", {"a", "b"})
    assert _keys(await store.asearch(("kb",), query="volcano eruption"))[0] == "a"
    # Per item: `index` names other fields.
    await store.aput(
        ("kb",), "c", {"title": "gardening", "body": "volcano eruption"}, index=["body"]
    )
    await _searched(store, ("kb",), "volcano", {"c"})
    assert set(_keys(await store.asearch(("kb",), query="volcano eruption", limit=2))) == {"a", "c"}


# -- list_namespaces -------------------------------------------------------------


@in_thread
def test_list_namespaces(store: RunifoldStore) -> None:
    """LangGraph's test_list_namespaces_basic."""
    assert store.list_namespaces() == []
    namespaces = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
        ("users", "123"),
        ("users", "456", "settings"),
        ("admin", "users", "789"),
    ]
    store.batch(
        [PutOp(ns, f"id_{i}", {"data": f"value_{i:02d}"}) for i, ns in enumerate(namespaces)]
    )
    ab = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f")]
    assert store.list_namespaces(prefix=("a", "b")) == ab
    assert store.list_namespaces(suffix=("f",)) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    assert store.list_namespaces(prefix=("a", "b"), limit=2) == ab[:2]
    assert store.list_namespaces(prefix=("a", "b"), offset=2) == ab[2:]
    assert store.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(suffix=("*", "f")) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("nonexistent",)) == []
    assert store.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert store.list_namespaces(prefix=("users", "*")) == [
        ("users", "123"),
        ("users", "456", "settings"),
    ]
    assert store.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []
    assert store.list_namespaces(max_depth=2) == [
        ("a", "b"),
        ("a", "c"),
        ("admin", "users"),
        ("b", "a"),
        ("users", "123"),
        ("users", "456"),
    ]
    assert len(store.list_namespaces()) == len(namespaces)
    # Several items in one namespace list it once; a deleted last item unlists it.
    store.put(("users", "123"), "more", {})
    assert store.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    store.delete(("users", "123"), "more")
    store.delete(("users", "123"), "id_6")
    assert store.list_namespaces(prefix=("users", "123")) == []


@in_thread
def test_list_namespaces_pages(store: RunifoldStore) -> None:
    """LangGraph's test_list_namespaces_pagination."""
    store.batch(
        [PutOp(("namespace", f"sub_{i:02d}"), f"id_{i:02d}", {"data": i}) for i in range(20)]
    )
    for offset in (0, 5, 15):
        assert store.list_namespaces(prefix=("namespace",), limit=5, offset=offset) == [
            ("namespace", f"sub_{i:02d}") for i in range(offset, offset + 5)
        ]


# -- TTL -------------------------------------------------------------------------


async def test_ttl_expires_items(client: Client) -> None:
    store = RunifoldStore(client)
    await store.aput(("t",), "short", {"v": 1}, ttl=1 / 60)  # a second
    await store.aput(("t",), "long", {"v": 2}, ttl=60)
    await store.aput(("t",), "forever", {"v": 3})
    assert await store.aget(("t",), "short") is not None

    async def expired() -> bool:
        return await store.aget(("t",), "short", refresh_ttl=False) is None

    await wait_for(expired, timeout=20)
    assert set(_keys(await store.asearch(("t",)))) == {"long", "forever"}
    memory = await asyncio.to_thread(client.get_memory, store._item_id(("t",), "forever"))
    assert not memory.HasField("expire_time")


@in_thread
def test_ttl_refreshes_on_read_as_langgraph_defines(client: Client) -> None:
    store = RunifoldStore(
        client,
        ttl={"default_ttl": 30, "refresh_on_read": True},
        refresh_slack=timedelta(0),  # LangGraph's rule exactly: every read restarts the clock
    )
    ns = ("t",)
    store.put(ns, "k", {"v": 1})  # default_ttl applies

    def expiry() -> Any:
        memory = client.get_memory(store._item_id(ns, "k"))
        assert memory.HasField("expire_time")
        return memory.expire_time.ToDatetime()

    first = expiry()
    put_item = store.get(ns, "k", refresh_ttl=False)
    assert put_item is not None
    assert expiry() == first  # not refreshed when told not to
    read = store.get(ns, "k")  # refresh_on_read
    assert read is not None and expiry() > first
    # A refresh is not an update: the item's updated_at stays the put's.
    assert read.updated_at == put_item.updated_at
    again = store.get(ns, "k", refresh_ttl=False)
    assert again is not None and again.updated_at == put_item.updated_at
    second = expiry()
    store.search(ns, refresh_ttl=False)
    assert expiry() == second
    store.search(ns)
    assert expiry() > second
    # A store that does not refresh on read by default.
    still = RunifoldStore(client, ttl={"refresh_on_read": False})
    third = expiry()
    still.get(ns, "k")
    assert expiry() == third
    # The default slack: a read a moment after the last restart writes nothing.
    hot = RunifoldStore(client)
    revision = client.get_memory(store._item_id(ns, "k")).revision
    for _ in range(3):
        assert hot.get(ns, "k") is not None
    assert client.get_memory(store._item_id(ns, "k")).revision == revision


# -- Runifold ----------------------------------------------------------------------


@in_thread
def test_two_runifold_namespaces_are_apart(stack: Stack) -> None:
    with (
        Client(stack.address, namespace=_namespace()) as one,
        Client(stack.address, namespace=_namespace()) as two,
    ):
        a, b = RunifoldStore(one), RunifoldStore(two)
        a.put(("users", "u1"), "prefs", {"owner": "a"})
        b.put(("users", "u1"), "prefs", {"owner": "b"})
        a.put(("only-a",), "k", {"owner": "a"})
        assert a.get(("users", "u1"), "prefs").value == {"owner": "a"}
        assert b.get(("users", "u1"), "prefs").value == {"owner": "b"}
        assert b.get(("only-a",), "k") is None
        assert [i.value for i in b.search(())] == [{"owner": "b"}]
        assert b.list_namespaces() == [("users", "u1")]
        b.delete(("users", "u1"), "prefs")
        assert a.get(("users", "u1"), "prefs") is not None


async def test_items_are_memories_seen_by_search_memories(
    store: RunifoldStore, client: Client
) -> None:
    await store.aput(("users", "u1"), "fact", {"text": "Ada's favourite instrument is the oboe"})
    memory_id = store._item_id(("users", "u1"), "fact")

    async def found() -> bool:
        reply = await asyncio.to_thread(client.search_memories, "favourite instrument oboe")
        return any(hit.memory.memory_id == memory_id for hit in reply.results)

    await wait_for(found, timeout=20)
    memory = await asyncio.to_thread(client.get_memory, memory_id)
    assert memory.metadata["lg.key"] == "fact"
    assert [s.external_uri for s in memory.sources] == [item_uri(("users", "u1"), "fact")]
    # And a memory that is not a store item stays out of the store's reads.
    await asyncio.to_thread(
        functools.partial(
            client.upsert_memory,
            "not an item",
            sources=[source(external_uri="https://example.com/x")],
            metadata={"lg.ns.0": "users"},
        )
    )
    assert _keys(await store.asearch(("users",))) == ["fact"]
    assert await store.alist_namespaces() == [("users", "u1")]


async def test_erasing_the_source_erases_the_item(stack: Stack, client: Client) -> None:
    store = RunifoldStore(client)
    ns = ("notes",)
    await store.aput(ns, "by-uri", {"v": 1})
    await store.aput(ns, "kept", {"v": 2})
    forget = functools.partial(client.forget_source, external_uri=item_uri(ns, "by-uri"))
    assert await asyncio.to_thread(forget) == 1
    assert await store.aget(ns, "by-uri") is None
    assert await store.aget(ns, "kept") is not None

    # An item written from a thread cites its entries: erasing the conversation erases it.
    conversation = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=client.namespace)
    )
    cid = conversation.conversation.conversation_id
    await stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=client.namespace,
            conversation_id=cid,
            expected_version=0,
            messages=[common_pb2.Message(role=common_pb2.ROLE_USER, text="I like oboes")],
        )
    )
    with store.citing(cid, 1, 1):
        await store.aput(ns, "from-thread", {"text": "likes oboes"})
        await asyncio.to_thread(store.put, ns, "from-thread-sync", {"v": 3})
    cited = await asyncio.to_thread(client.get_memory, store._item_id(ns, "from-thread"))
    assert {s.conversation_id for s in cited.sources} == {cid, ""}
    await asyncio.to_thread(client.forget_source, cid)
    assert await store.aget(ns, "from-thread") is None
    # asyncio.to_thread copies the context: the blocking put cited the range too.
    assert await store.aget(ns, "from-thread-sync") is None
    assert await store.aget(ns, "kept") is not None


@in_thread
def test_limits_are_refused_before_the_call(store: RunifoldStore) -> None:
    with pytest.raises(ValueError):
        store.put(tuple(f"l{i}" for i in range(13)), "k", {})
    with pytest.raises(ValueError):
        store.put(("a",), "k" * 1025, {})
    with pytest.raises(ValueError):
        store.put(("a",), "k", {"x": float("nan")})
