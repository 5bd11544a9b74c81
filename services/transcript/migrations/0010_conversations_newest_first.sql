-- ListConversations newest first (ListConversationsRequest.order =
-- CONVERSATION_ORDER_NEWEST_FIRST): a page is one range scan of these indexes, in
-- decreasing creation time, then decreasing id (the cursor of the next page), of a
-- namespace or of one of its users. Neither column changes after creation: an
-- append's update of its conversation row (version, last_sequence, update_time)
-- touches these indexes only when the update cannot stay on its heap page, as it
-- touches the others. Not CONCURRENTLY: migrations run in a transaction, under the
-- advisory lock, before the service serves.
CREATE INDEX conversations_newest
    ON transcript.conversations (namespace, create_time DESC, conversation_id DESC);

CREATE INDEX conversations_user_newest
    ON transcript.conversations (namespace, user_id, create_time DESC, conversation_id DESC)
    WHERE user_id IS NOT NULL;
