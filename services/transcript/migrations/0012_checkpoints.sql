-- LangGraph checkpoints (services/transcript/checkpoints/): a thread is a conversation.
--
-- A checkpoint row holds the checkpoint as LangGraph's serializer made it, without its
-- channel values (type and bytes, verbatim), its metadata (JSON, for filters), its
-- parent and the run that made it. The values live in checkpoint_blobs, one row per
-- (conversation, checkpoint_ns, channel, version): a step stores the channels it
-- changed, and a checkpoint names the versions it holds (channels[i] at versions[i]),
-- so storage grows with what changed, not with the whole state at every step.
-- Pending writes are per checkpoint, task and index.
--
-- Rows are keyed by the conversation's key: erasing the conversation (and its forks)
-- deletes them in the erasure's transaction (conversations/store.py).
CREATE TABLE transcript.checkpoints (
    conversation_key     bigint      NOT NULL,
    checkpoint_ns        text        NOT NULL,
    checkpoint_id        text        NOT NULL,
    parent_checkpoint_id text,
    checkpoint_type      text        NOT NULL,
    checkpoint           bytea       NOT NULL,
    metadata             jsonb       NOT NULL,
    run_id               text,
    channels             text[]      NOT NULL,
    versions             text[]      NOT NULL,
    create_time          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_key, checkpoint_ns, checkpoint_id)
);

-- DeleteCheckpoints by run ids: the runs of a namespace, anywhere in it.
CREATE INDEX checkpoints_run_id ON transcript.checkpoints (run_id) WHERE run_id IS NOT NULL;

-- A value that mostly repeats the channel's value at the parent checkpoint (a message
-- list that grew by a message) is stored as a delta of it: `blob` holds the bytes before
-- and after the block it shares (`head_length` of them before), and the value's bytes
-- are blob[:head_length] || base[base_offset : base_offset + base_length] || the rest,
-- where base is the value at `base_version` (itself whole or a delta, at most `depth`
-- - 1 deep). A value stored whole has no base_version. `full_length`: its bytes, whole.
CREATE TABLE transcript.checkpoint_blobs (
    conversation_key bigint  NOT NULL,
    checkpoint_ns    text    NOT NULL,
    channel          text    NOT NULL,
    version          text    NOT NULL,
    type             text    NOT NULL,
    blob             bytea,
    full_length      bigint  NOT NULL,
    base_version     text,
    head_length      integer,
    base_offset      integer,
    base_length      integer,
    depth            integer NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_key, checkpoint_ns, channel, version)
);

CREATE TABLE transcript.checkpoint_writes (
    conversation_key bigint  NOT NULL,
    checkpoint_ns    text    NOT NULL,
    checkpoint_id    text    NOT NULL,
    task_id          text    NOT NULL,
    idx              integer NOT NULL,
    channel          text    NOT NULL,
    type             text    NOT NULL,
    blob             bytea   NOT NULL,
    task_path        text    NOT NULL DEFAULT '',
    PRIMARY KEY (conversation_key, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- A thread's checkpoints newest first across its checkpoint namespaces (ListCheckpoints
-- without checkpoint_ns); with one, the primary key serves.
CREATE INDEX checkpoints_newest ON transcript.checkpoints (conversation_key, checkpoint_id);
