-- Conversation state, user and namespace state, users on conversations, the
-- writers' own representation of a message, and retractions.

ALTER TABLE transcript.conversations
    -- The user it belongs to (Conversation.user_id), NULL for none.
    ADD COLUMN user_id text,
    -- Its state (a JSON object), changed by writes under its version.
    ADD COLUMN state   jsonb NOT NULL DEFAULT '{}';

-- ListConversations by user: an index range scan in id order.
CREATE INDEX conversations_user
    ON transcript.conversations (namespace, user_id, conversation_id)
    WHERE user_id IS NOT NULL;

ALTER TABLE transcript.entries
    -- Message.native_json, kept verbatim (text, not jsonb: returned as written).
    ADD COLUMN native_json       text,
    -- The version of the write that retracted the entry, and when.
    ADD COLUMN retracted_version bigint,
    ADD COLUMN retract_time      timestamptz;

-- The state of a namespace (user_id '') and of each of its users. A row exists
-- once a write changed it; its version counts those writes. Shared by the
-- conversations of the namespace or user, so a conversation's erasure leaves it.
CREATE TABLE transcript.scoped_states (
    namespace   text        NOT NULL,
    user_id     text        NOT NULL,
    state       jsonb       NOT NULL,
    version     bigint      NOT NULL CHECK (version >= 1),
    update_time timestamptz NOT NULL,
    PRIMARY KEY (namespace, user_id)
);
