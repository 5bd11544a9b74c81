-- Automatic curation (issue 30): how far MemoryService's curation jobs have read each
-- conversation (Conversation.curated_through, set by MarkCurated). Monotonic within an
-- incarnation; a conversation made again under its id starts at 0 (a new row).
ALTER TABLE transcript.conversations
    ADD COLUMN curated_through bigint NOT NULL DEFAULT 0 CHECK (curated_through >= 0);
