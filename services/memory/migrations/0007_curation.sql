-- Automatic curation (issue 30): a durable queue of curation jobs, one cursor per
-- conversation, each namespace's place in the queue and its hourly budget.
-- Conversations live in TranscriptService; rows here name them by (namespace,
-- conversation_id) and the incarnation read, never by a foreign key.

-- Curation jobs. A job is claimed with FOR UPDATE SKIP LOCKED under a lease
-- (lease_token, lease_until) its worker keeps extending; a job whose lease expired
-- is claimable again. Jobs are taken in `fair_time` order: each namespace's waiting
-- jobs are spaced on a virtual clock (memory.curation_namespaces), so a namespace
-- that floods the queue takes turns with the others instead of going first.
-- `run_after`: not before (a retry's backoff, a namespace over its hourly budget).
CREATE TABLE memory.curation_jobs (
    job_id          uuid        PRIMARY KEY,
    namespace       text        NOT NULL,
    conversation_id uuid        NOT NULL,
    -- The conversation's incarnation when the job was asked for.
    incarnation     bigint      NOT NULL,
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    failures        integer     NOT NULL DEFAULT 0,
    run_after       timestamptz NOT NULL DEFAULT now(),
    fair_time       timestamptz NOT NULL DEFAULT now(),
    lease_token     uuid,
    lease_until     timestamptz,
    claimed_by      text        NOT NULL DEFAULT '',
    last_error      text        NOT NULL DEFAULT '',
    -- A RequestCuration that arrived while the job ran: the job runs again.
    requested_again timestamptz,
    -- Batches applied and memories stored over the job's life.
    batches         integer     NOT NULL DEFAULT 0,
    facts           integer     NOT NULL DEFAULT 0,
    create_time     timestamptz NOT NULL DEFAULT now(),
    enqueue_time    timestamptz NOT NULL DEFAULT now(),
    finish_time     timestamptz
);

-- One waiting or running job per conversation: RequestCuration deduplicates on it.
CREATE UNIQUE INDEX curation_jobs_one_active
    ON memory.curation_jobs (namespace, conversation_id)
    WHERE state IN ('pending', 'running');

-- What the claim reads: waiting jobs in fair order, and running jobs whose lease expired.
CREATE INDEX curation_jobs_due ON memory.curation_jobs (fair_time) WHERE state = 'pending';
CREATE INDEX curation_jobs_leases ON memory.curation_jobs (lease_until) WHERE state = 'running';

-- GetCurationBacklog, the cap of waiting jobs per namespace, the retention sweep.
CREATE INDEX curation_jobs_namespace_state ON memory.curation_jobs (namespace, state);
CREATE INDEX curation_jobs_finished ON memory.curation_jobs (finish_time)
    WHERE state IN ('done', 'failed');

-- How far curation has read each conversation: written in the transaction that stores
-- a batch's memories, so a batch is applied once (a cursor that moved refuses it).
-- TranscriptService's Conversation.curated_through follows it (MarkCurated).
-- `curated_version`: the conversation's version when the batch was read; a write
-- after it that retracted curated entries is looked for by the next job.
CREATE TABLE memory.curation_cursors (
    namespace       text        NOT NULL,
    conversation_id uuid        NOT NULL,
    incarnation     bigint      NOT NULL,
    curated_through bigint      NOT NULL CHECK (curated_through >= 0),
    curated_version bigint      NOT NULL DEFAULT 0,
    update_time     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, conversation_id)
);

-- Each namespace's virtual clock: the fair_time of its latest waiting job.
CREATE TABLE memory.curation_namespaces (
    namespace text        PRIMARY KEY,
    fair_time timestamptz NOT NULL
);

-- What each namespace's curation spent in each clock hour (UTC): model calls and
-- tokens (reserved before a call, settled after it), and the memories it stored.
CREATE TABLE memory.curation_usage (
    namespace    text        NOT NULL,
    window_start timestamptz NOT NULL,
    model_calls  bigint      NOT NULL DEFAULT 0,
    tokens       bigint      NOT NULL DEFAULT 0,
    facts        bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, window_start)
);

CREATE INDEX curation_usage_window ON memory.curation_usage (window_start);
