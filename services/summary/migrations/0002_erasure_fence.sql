-- Erasure fencing. A conversation's incarnation (TranscriptService's
-- Conversation.incarnation) is recorded with every summary and job; erasing a
-- conversation leaves a tombstone naming the incarnation erased, and a commit or
-- job for that incarnation is refused from then on, even one already in flight
-- (a summarizer inside its model call). Commits, enqueues and erasures of one
-- conversation are serialized by a transaction-scoped advisory lock.
CREATE TABLE summary.erasures (
    namespace       text        NOT NULL,
    conversation_id uuid        NOT NULL,
    incarnation     bigint      NOT NULL,
    erase_time      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, conversation_id, incarnation)
);

-- The retention sweep of old tombstones.
CREATE INDEX erasures_erase_time ON summary.erasures (erase_time);

-- 0: written before incarnations were recorded (accepted while it fits the
-- transcript, as before; the next commit records the incarnation).
ALTER TABLE summary.summaries ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
ALTER TABLE summary.summary_history ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
ALTER TABLE summary.jobs ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;
