-- WatchConversation: a live, resumable stream of a conversation.
--
-- While a TranscriptService replica has a watcher of a conversation it keeps
-- `watched_until` in the future (renewed on a timer). A write that commits on a
-- watched conversation (an append, a turn lease granted or released, the
-- erasure) is then announced with a NOTIFY on channel `runifold_transcript`
-- whose payload is only the conversation_key; every replica's one listening
-- connection wakes its watchers, which read the new entries by sequence.
-- Appends read the column on the row they update, so a watcher registered
-- before an append locked the row is always told; one registered after it
-- reads the append itself. Unwatched conversations send no NOTIFY at all: a
-- NOTIFY serializes the commits of every notifying transaction (sent from a
-- separate, asynchronously committed transaction for that reason).
ALTER TABLE transcript.conversations ADD COLUMN watched_until timestamptz;

-- The append that wrote a sequence (its version), found by an index probe:
-- each watched entry carries the version it committed at.
-- (Built while the migration holds the table: seconds per million appends.)
CREATE INDEX appends_last_sequence ON transcript.appends (conversation_key, last_sequence);
