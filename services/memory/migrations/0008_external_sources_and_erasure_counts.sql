-- Sources outside the transcript and erasure receipts (issue 30).
--
-- A memory's sources (memories.sources, revisions.sources) may now hold, beside the
-- transcript ranges {"c": conversation_id, "f": from_sequence, "t": through_sequence},
-- external sources {"u": uri}. ForgetSource by external URI finds them by containment
-- (sources @> '[{"u": ...}]'), which the GIN index memories_sources (jsonb_path_ops,
-- migration 0001) serves as it serves {"c": ...}: no new index. Rows written before this
-- migration hold ranges only, and stay valid.
--
-- An erasure's tombstone also adds up what every erasure of its incarnation erased
-- (ForgetSource with an incarnation; AgentService's erasure receipt is made of these
-- counts), and knows when the vector index caught up with it: `outbox_through` is an
-- outbox position at or above every index write the erasure queued, and
-- `index_complete_time` is recorded once no outbox row at or below it is left.
-- Tombstones written before this migration count nothing and have no index writes to
-- wait for.
ALTER TABLE memory.erasures
    ADD COLUMN memories            bigint NOT NULL DEFAULT 0 CHECK (memories >= 0),
    ADD COLUMN revisions           bigint NOT NULL DEFAULT 0 CHECK (revisions >= 0),
    ADD COLUMN index_points        bigint NOT NULL DEFAULT 0 CHECK (index_points >= 0),
    ADD COLUMN outbox_through      bigint,
    ADD COLUMN index_complete_time timestamptz;
