-- Erasure receipts (issue 30): a tombstone also adds up what every erasure of its
-- incarnation erased, so that an erasure retried after a partial failure reports the
-- first call's counts too (AgentService's receipt is made of them). Counts only.
-- Tombstones written before this migration count nothing.
ALTER TABLE summary.erasures
    ADD COLUMN summaries bigint NOT NULL DEFAULT 0 CHECK (summaries >= 0),
    ADD COLUMN jobs      bigint NOT NULL DEFAULT 0 CHECK (jobs >= 0);
