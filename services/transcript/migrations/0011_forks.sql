-- ForkConversation: a conversation made from a prefix of another, sharing that prefix's
-- entries without copying them.
--
-- A fork's entries through its fork point live in the rows of the conversations it came
-- from. Its shared prefix is a list of segments, in sequence order, one per conversation
-- of its lineage that holds part of it: `prefix_keys[i]` holds the entries through
-- `prefix_through[i]` (after the previous segment's) and the appends through
-- `prefix_versions[i]` (after the previous segment's); a retraction of such an entry
-- counts for the fork only when its version is at most `prefix_versions[i]` (the source
-- may retract later: that is not the fork's). Everything after the last segment is the
-- fork's own rows. The fork's first own append (version prefix_versions[last] + 1) is the
-- fork itself: its sequences are the entries of the source's append that the fork point
-- cut (none when it cut none), its `state` the conversation's state at the fork point.
-- A conversation that is no fork has NULL in all of these.
ALTER TABLE transcript.conversations
    -- Conversation.fork_origin: the source's id and the fork point (through_sequence).
    ADD COLUMN fork_origin_id   uuid,
    ADD COLUMN fork_through     bigint,
    -- The source's key: its erasure erases its forks (the index below finds them).
    ADD COLUMN fork_source_key  bigint,
    ADD COLUMN prefix_keys      bigint[],
    ADD COLUMN prefix_through   bigint[],
    ADD COLUMN prefix_versions  bigint[],
    -- ForkConversationRequest.request_id, unique per source, and what it asked for.
    ADD COLUMN fork_request_id  text,
    ADD COLUMN fork_payload_hash bytea,
    -- The state the conversation was created with (NULL: {}), the state at version 0 of
    -- a fork point.
    ADD COLUMN initial_state    jsonb;

CREATE INDEX conversations_forks ON transcript.conversations (fork_source_key)
    WHERE fork_source_key IS NOT NULL;
CREATE UNIQUE INDEX conversations_fork_request_id
    ON transcript.conversations (fork_source_key, fork_request_id)
    WHERE fork_request_id IS NOT NULL;

-- The conversation's state after each write that changed it (NULL: unchanged), so that a
-- fork copies the state as it was at its fork point: the newest such write at or before
-- the fork point's version, found by a probe of the index below.
ALTER TABLE transcript.appends ADD COLUMN state jsonb;
CREATE INDEX appends_state ON transcript.appends (conversation_key, version)
    WHERE state IS NOT NULL;

-- What is known of the past: the current state is the state after the last write (or
-- at creation, for a conversation without any). A fork of a point before this migration
-- in a conversation whose state changed since takes the nearest state recorded at or
-- before it (docs/transcript.md says so).
UPDATE transcript.appends AS a SET state = c.state
  FROM transcript.conversations AS c
 WHERE a.conversation_key = c.conversation_key AND a.version = c.version
   AND c.state <> '{}'::jsonb;
UPDATE transcript.conversations SET initial_state = state
 WHERE version = 0 AND state <> '{}'::jsonb;

-- Digests (docs/transcript.md, services/transcript/digests/model.py): each append's
-- SHA-256 over the previous append's digest and its canonical bytes, and the newest on
-- the conversation row (GetConversation's head_digest), where the append statement finds
-- the previous one under the row lock it takes anyway. Appends recorded before this
-- migration have none: a conversation's chain starts at its first append after it.
ALTER TABLE transcript.conversations ADD COLUMN head_digest bytea;
ALTER TABLE transcript.appends ADD COLUMN digest bytea;
