-- Outbox rows are claimed, not locked: an indexer marks the rows of its batch
-- with its claim token and an expiry, commits, embeds and writes the index
-- with no transaction open, then deletes the rows that still carry its token.
-- A claim whose expiry passed (its indexer died or stalled) is claimable
-- again; the index's revision guard makes a late write of the old claim
-- harmless. Several indexers take disjoint batches (FOR UPDATE SKIP LOCKED).
ALTER TABLE memory.outbox
    ADD COLUMN claim_token uuid,
    ADD COLUMN claim_until timestamptz;
