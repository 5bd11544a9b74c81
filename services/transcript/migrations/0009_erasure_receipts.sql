-- Erasure receipts (issue 30): what an erasure of one incarnation of a conversation erased,
-- store by store, kept after the conversation is gone (RUNIFOLD_ERASURE_RECEIPT_RETENTION_S).
-- Counts only, never content: {"entries": n, "appends": n, "summaries": n, ...} by the name
-- of what was erased; TranscriptService writes its own counts and keeps the others' as the
-- eraser (AgentService) reports them. One receipt per incarnation: every call of the same
-- erasure merges into it (the larger of each count; a part once erased leaves `remaining`
-- for good).
CREATE TABLE transcript.erasure_receipts (
    receipt_id      uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    conversation_id uuid        NOT NULL,
    incarnation     bigint      NOT NULL CHECK (incarnation >= 1),
    counts          jsonb       NOT NULL DEFAULT '{}',
    -- Parts not yet erased; empty once complete.
    remaining       text[]      NOT NULL DEFAULT '{}',
    create_time     timestamptz NOT NULL DEFAULT now(),
    update_time     timestamptz NOT NULL DEFAULT now(),
    complete_time   timestamptz,
    -- One per incarnation; also finds the latest receipt of a conversation id.
    CONSTRAINT erasure_receipts_incarnation UNIQUE (namespace, conversation_id, incarnation)
);

-- The retention sweep.
CREATE INDEX erasure_receipts_create_time ON transcript.erasure_receipts (create_time);
