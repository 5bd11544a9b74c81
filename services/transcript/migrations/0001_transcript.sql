-- TranscriptService schema: conversations, their entries and the append log.
-- Children are deleted explicitly by DeleteConversation (no foreign keys on
-- the hot append path).
CREATE SCHEMA IF NOT EXISTS transcript;

CREATE TABLE transcript.conversations (
    conversation_key bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace        text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    version          bigint      NOT NULL DEFAULT 0 CHECK (version >= 0),
    last_sequence    bigint      NOT NULL DEFAULT 0 CHECK (last_sequence >= 0),
    labels           jsonb       NOT NULL DEFAULT '{}',
    create_time      timestamptz NOT NULL DEFAULT now(),
    update_time      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT conversations_namespace_id UNIQUE (namespace, conversation_id)
);

-- One row per message; (conversation_key, sequence) is contiguous from 1.
CREATE TABLE transcript.entries (
    conversation_key bigint      NOT NULL,
    sequence         bigint      NOT NULL CHECK (sequence >= 1),
    role             smallint    NOT NULL CHECK (role IN (1, 2, 3)),
    text             text        NOT NULL,
    tool_calls       jsonb,
    tool_call_id     text,
    metadata         jsonb,
    created_at       timestamptz NOT NULL,
    PRIMARY KEY (conversation_key, sequence)
);

-- One row per committed append (= per version): the commit log, and the
-- idempotency record of request ids, written in the same statement.
CREATE TABLE transcript.appends (
    conversation_key bigint      NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
    first_sequence   bigint      NOT NULL,
    last_sequence    bigint      NOT NULL,
    request_id       text,
    payload_hash     bytea       NOT NULL,
    input_tokens     bigint      NOT NULL DEFAULT 0,
    output_tokens    bigint      NOT NULL DEFAULT 0,
    model_calls      bigint      NOT NULL DEFAULT 0,
    commit_time      timestamptz NOT NULL,
    PRIMARY KEY (conversation_key, version)
);

CREATE UNIQUE INDEX appends_request_id
    ON transcript.appends (conversation_key, request_id)
    WHERE request_id IS NOT NULL;
