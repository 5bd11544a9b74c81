-- Erasure fencing: erasing a conversation (AgentService.EraseConversation through
-- ForgetSource with an incarnation) leaves a tombstone naming the incarnation
-- of TranscriptService's conversation it erased. An UpsertMemory whose sources
-- were checked against that incarnation is refused from then on, even one whose
-- source check ran before the erasure. Writes and erasures that name one
-- conversation are serialized by a transaction-scoped advisory lock on it.
CREATE TABLE memory.erasures (
    namespace       text        NOT NULL,
    conversation_id uuid        NOT NULL,
    incarnation     bigint      NOT NULL,
    erase_time      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, conversation_id, incarnation)
);

CREATE INDEX erasures_erase_time ON memory.erasures (erase_time);

-- UpsertMemory request ids (AIP-155), recorded in the write's own transaction.
-- No content: a replay reads the revision the request wrote (and finds nothing
-- once the memory was deleted, whose history keeps no content).
CREATE TABLE memory.requests (
    namespace    text        NOT NULL,
    request_id   text        NOT NULL,
    payload_hash bytea       NOT NULL,
    memory_id    uuid,
    revision     bigint,
    created      boolean,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, request_id)
);

CREATE INDEX requests_recorded_at ON memory.requests (recorded_at);
