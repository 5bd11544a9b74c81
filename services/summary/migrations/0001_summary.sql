-- SummaryService schema: current summaries, the summaries they replaced, and
-- the background job queue. Conversations live in TranscriptService; rows here
-- refer to them by (namespace, conversation_id) only, never by a foreign key.
CREATE SCHEMA IF NOT EXISTS summary;

-- The current summary of each conversation: covers sequences 1..through_sequence.
CREATE TABLE summary.summaries (
    namespace        text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    revision         bigint      NOT NULL CHECK (revision >= 1),
    through_sequence bigint      NOT NULL CHECK (through_sequence >= 1),
    text             text        NOT NULL,
    create_time      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, conversation_id)
);

-- Summaries replaced by a newer commit (derived data, kept for inspection and
-- trimmed to the newest RUNIFOLD_SUMMARY_HISTORY_LIMIT per conversation).
CREATE TABLE summary.summary_history (
    namespace        text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    revision         bigint      NOT NULL,
    through_sequence bigint      NOT NULL,
    text             text        NOT NULL,
    create_time      timestamptz NOT NULL,
    replace_time     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, conversation_id, revision)
);

-- Background summarization jobs. `window_size` is the view's window (WINDOW is
-- a reserved word in SQL). A job is claimed with FOR UPDATE SKIP LOCKED and
-- held under a lease (lease_token, lease_until) that its worker keeps
-- extending; a job whose lease expired is claimable again.
CREATE TABLE summary.jobs (
    job_id            uuid        PRIMARY KEY,
    namespace         text        NOT NULL,
    conversation_id   uuid        NOT NULL,
    window_size       integer     NOT NULL CHECK (window_size BETWEEN 1 AND 4096),
    summary_batch     integer     NOT NULL CHECK (summary_batch BETWEEN 1 AND 4096),
    state             text        NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts          integer     NOT NULL DEFAULT 0,
    failures          integer     NOT NULL DEFAULT 0,
    run_after         timestamptz NOT NULL DEFAULT now(),
    lease_token       uuid,
    lease_until       timestamptz,
    claimed_by        text        NOT NULL DEFAULT '',
    last_error        text        NOT NULL DEFAULT '',
    -- A RequestSummary that arrived while the job ran: the job runs again.
    requested_again   timestamptz,
    create_time       timestamptz NOT NULL DEFAULT now(),
    enqueue_time      timestamptz NOT NULL DEFAULT now(),
    finish_time       timestamptz
);

-- One waiting or running job per conversation: RequestSummary deduplicates on it.
CREATE UNIQUE INDEX jobs_one_active
    ON summary.jobs (namespace, conversation_id)
    WHERE state IN ('pending', 'running');

-- What the claim scans: due pending jobs, and running jobs whose lease expired.
CREATE INDEX jobs_due ON summary.jobs (run_after) WHERE state = 'pending';
CREATE INDEX jobs_leases ON summary.jobs (lease_until) WHERE state = 'running';

-- GetBacklog per namespace, and the retention sweep of finished jobs.
CREATE INDEX jobs_namespace_state ON summary.jobs (namespace, state);
CREATE INDEX jobs_finished ON summary.jobs (finish_time) WHERE state IN ('done', 'failed');
