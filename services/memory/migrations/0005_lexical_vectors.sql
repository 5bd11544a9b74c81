-- Hybrid retrieval (issue 21): index points gain a lexical (BM25) vector beside the dense
-- one. The index is a copy; this schema does not hold it. Every live memory is queued
-- once in the outbox, so that the running indexers give the points indexed before this
-- migration their lexical vectors (a write at the same revision that brings one replaces
-- a point without: services/memory/index). Searches keep working meanwhile: a memory not
-- yet reached is found by its vector, and by its words once the indexer reaches it.
INSERT INTO memory.outbox (namespace, memory_id)
SELECT namespace, memory_id FROM memory.memories ORDER BY namespace, memory_id;
