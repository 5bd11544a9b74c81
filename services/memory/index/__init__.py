"""The vector index: one interface, three adapters (Qdrant Edge, Qdrant server, pgvector).

The index holds a rebuildable copy of the live memories (a vector and a
small payload: namespace, memory id, revision, metadata tags, valid time;
never the content). PostgreSQL stays the source of truth: search re-reads
every hit from it.

Every write is guarded by the memory's revision, inside the engine's own
write: a point replaces what the index holds for its memory only when its
revision is newer, and a deletion leaves a tombstone at the deletion's
revision (revisions keep counting across a delete, see 0001_memory.sql)
that no older point can pass. So indexers may apply a memory's writes in
any order, or late, and the index still ends at the newest revision. A
tombstone carries no namespace and no vector: no query can reach it. It is
pruned after a retention period (`prune_tombstones`).

Tenancy is enforced here, in one place. The only way to search is
`VectorIndex.search(NamespacedQuery)`, and the only way to make a
`NamespacedQuery` is `NamespacedQuery.inside(namespace, ...)`, which
validates the namespace and puts it first in `terms`. Adapters turn every
term into a condition of their engine (a `Term` an exact match, a `ValidAt`
two ranges on the valid time) and never add or drop one: a search without
the namespace condition cannot be expressed.

Valid time filters inside the engine, so that superseded facts crowding a
namespace do not push the valid ones out of the candidates: a point stores
`valid_from` and `valid_until` (Unix seconds; OPEN_END while the fact holds),
and `ValidAt(t)` matches `valid_from <= t < valid_until`. The store's re-read
stays the authority (the index may lag a supersession).

Lexical scoring (issue 21): a point also holds its BM25 document vector
(services/memory/search/lexical.py: one tokenisation for every adapter), and a query
has a mode: dense (the cosine), lexical (BM25 inside the engine, its IDF over
the namespace) or hybrid (both engines' candidates, rescored by both and
fused). Each hit reports the scores it was ranked by. A point written before
lexical vectors existed has none; the revision guard lets a write at the same
revision give it one (the outbox replay of migration 0005, or reindex).

Here: the records and their rules in model.py, the interface and its errors in
protocol.py, the adapters in edge.py, qdrant/ and pgvector/. This package imports
none of them: services/memory/component.py builds the one configured.
"""
