-- MemoryService schema: the revisioned record of curated memories, their
-- history, and the transactional outbox that feeds the vector index.
-- PostgreSQL is the source of truth; the vector index is a rebuildable copy.
CREATE SCHEMA IF NOT EXISTS memory;

-- Live memories only: a deleted memory leaves this table (its tombstone stays
-- in memory.revisions). The same memory_id may exist in two namespaces; they
-- are two unrelated memories.
CREATE TABLE memory.memories (
    namespace           text        NOT NULL,
    memory_id           uuid        NOT NULL,
    content             text        NOT NULL,
    -- [{"c": conversation_id, "f": from_sequence, "t": through_sequence}, ...]
    sources             jsonb       NOT NULL,
    metadata            jsonb       NOT NULL DEFAULT '{}',
    revision            bigint      NOT NULL CHECK (revision >= 1),
    create_time         timestamptz NOT NULL DEFAULT now(),
    update_time         timestamptz NOT NULL DEFAULT now(),
    expire_time         timestamptz,
    embedding_model     text        NOT NULL,
    embedding_dimension integer     NOT NULL CHECK (embedding_dimension >= 1),
    -- The degraded-mode search (index unreachable) is PostgreSQL full-text search.
    content_tsv         tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    PRIMARY KEY (namespace, memory_id)
);

CREATE INDEX memories_content_tsv ON memory.memories USING gin (content_tsv);
-- ForgetSource and ListMemories(conversation_id) find memories by source conversation.
CREATE INDEX memories_sources ON memory.memories USING gin (sources jsonb_path_ops);
-- The expiry sweeper.
CREATE INDEX memories_expire_time ON memory.memories (expire_time)
    WHERE expire_time IS NOT NULL;

-- Every write of a memory, and a tombstone for its deletion. When a memory is
-- deleted (DeleteMemory, ForgetSource, expiry) the content, sources and
-- metadata of all its history rows are erased: only revisions, kinds and
-- times remain. Revisions keep counting across a delete and re-create of the
-- same id, so a stale compare-and-swap can never hit a new incarnation.
CREATE TABLE memory.revisions (
    namespace   text        NOT NULL,
    memory_id   uuid        NOT NULL,
    revision    bigint      NOT NULL CHECK (revision >= 1),
    kind        text        NOT NULL CHECK (kind IN ('write', 'delete')),
    reason      text        NOT NULL,
    content     text,
    sources     jsonb,
    metadata    jsonb,
    expire_time timestamptz,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, memory_id, revision)
);

-- Index writes waiting to be applied, in commit order. A row only names the
-- memory: the indexer brings the index in line with the memory's state at the
-- time it runs (present: upsert; gone: delete), so replays are harmless.
CREATE TABLE memory.outbox (
    seq         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace   text        NOT NULL,
    memory_id   uuid        NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
