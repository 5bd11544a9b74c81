-- Memory that evolves (issue 17): every memory has a valid time (when the fact holds in
-- the world) beside its revision time (update_time, revisions.recorded_at: when the store
-- learned it). A newer memory supersedes an older one: the older one's validity is closed
-- (valid_until_time) and it names its successor (superseded_by), in the transaction that
-- writes the newer one; nothing is deleted, and the history keeps every revision.

-- Memories written before this migration became valid when they were created (the
-- create time of their earliest source entry is TranscriptService's, not in this schema).
ALTER TABLE memory.memories
    ADD COLUMN valid_from_time  timestamptz,
    ADD COLUMN valid_until_time timestamptz,
    ADD COLUMN superseded_by    uuid;
UPDATE memory.memories SET valid_from_time = create_time;
ALTER TABLE memory.memories
    ALTER COLUMN valid_from_time SET DEFAULT now(),
    ALTER COLUMN valid_from_time SET NOT NULL,
    ADD CONSTRAINT memories_validity
        CHECK (valid_until_time IS NULL OR valid_until_time > valid_from_time),
    -- Only a closed fact has a successor.
    ADD CONSTRAINT memories_superseded_closed
        CHECK (superseded_by IS NULL OR valid_until_time IS NOT NULL);

-- Erasing a memory reopens the memories it superseded: find them.
CREATE INDEX memories_superseded_by ON memory.memories (namespace, superseded_by)
    WHERE superseded_by IS NOT NULL;

-- The validity of each revision; erased with the content when the memory is deleted.
ALTER TABLE memory.revisions
    ADD COLUMN valid_from_time  timestamptz,
    ADD COLUMN valid_until_time timestamptz,
    ADD COLUMN superseded_by    uuid;
UPDATE memory.revisions AS h SET valid_from_time = m.create_time
  FROM memory.memories AS m
 WHERE h.namespace = m.namespace AND h.memory_id = m.memory_id AND h.content IS NOT NULL;
