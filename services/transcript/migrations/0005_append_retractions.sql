-- WatchConversation reports retractions: the sequences each write retracted
-- (AppendEntriesRequest.retract_sequences), kept on its append record so that a
-- stream finds a conversation's retractions after a version by a range of the
-- appends' primary key instead of scanning its entries. NULL: it retracted none
-- (and every append recorded before this migration).
ALTER TABLE transcript.appends ADD COLUMN retracted bigint[];

-- A stream's wake looks for them after the version it reached: only the writes that
-- retracted anything are in this index.
CREATE INDEX appends_retracted ON transcript.appends (conversation_key, version)
    WHERE retracted IS NOT NULL;
