-- The change feed of memories (issue 30, WatchMemories): every change of a namespace's
-- memories, numbered 1, 2, 3... per namespace, without gaps, in commit order.
--
-- Each change of a memory already writes one row of memory.revisions in the transaction
-- that makes it (a create, an update, a supersession, a reopening, a deletion's
-- tombstone, whatever removed it: delete, forget_source, expired). That row now carries
-- its namespace's `change_sequence`: the change log is the history itself, and costs a
-- write one more column and one more index entry.
--
-- The numbers come from the namespace's row of memory.feeds, taken by the write's own
-- statement (`last_change_sequence` raised by the changes it makes) and held until its
-- transaction ends: writers of one namespace number their changes one transaction after
-- the other, so number k commits after every number before it, and a rolled-back write
-- gives its numbers back. A reader that sees k sees all of 1..k: a feed never has to skip
-- a number that would commit later. Writers of different namespaces never wait for each
-- other. (services/memory/watch/ reads the feed; docs/memory.md "The change feed".)
CREATE TABLE memory.feeds (
    namespace            text        PRIMARY KEY,
    -- What the notifications between processes name (never the namespace).
    feed_key             bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    last_change_sequence bigint      NOT NULL CHECK (last_change_sequence >= 0),
    -- A process streams this namespace's changes until then (renewed while it does):
    -- a write to it is announced to the other processes (NOTIFY) after its commit.
    watched_until        timestamptz
) WITH (fillfactor = 50);  -- every write updates its namespace's row: room for HOT updates

ALTER TABLE memory.revisions ADD COLUMN change_sequence bigint;

-- The history recorded before the feed existed, numbered in the order it was recorded
-- (a memory's revisions in their order, whatever their record times).
UPDATE memory.revisions AS h
   SET change_sequence = n.change_sequence
  FROM (SELECT namespace, memory_id, revision,
               row_number() OVER (PARTITION BY namespace
                                  ORDER BY recorded_until, memory_id, revision) AS change_sequence
          FROM (SELECT namespace, memory_id, revision,
                       max(recorded_at) OVER (PARTITION BY namespace, memory_id
                                              ORDER BY revision) AS recorded_until
                  FROM memory.revisions) AS ordered) AS n
 WHERE h.namespace = n.namespace AND h.memory_id = n.memory_id AND h.revision = n.revision;

ALTER TABLE memory.revisions ALTER COLUMN change_sequence SET NOT NULL;

-- The feed's read: a namespace's changes after a number, in order.
CREATE UNIQUE INDEX revisions_change_sequence ON memory.revisions (namespace, change_sequence);

INSERT INTO memory.feeds (namespace, last_change_sequence)
SELECT namespace, max(change_sequence) FROM memory.revisions GROUP BY namespace;
