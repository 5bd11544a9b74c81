-- Turn leases: one running turn per conversation when asked, one model call per
-- turn id always (AcquireTurnLease / RenewTurnLease / ReleaseTurnLease).
--
-- The exclusive fence lives on the conversation row itself, so that an append
-- (which updates that row) is re-checked against a lease granted while it
-- waited for the row lock: PostgreSQL re-evaluates an UPDATE's WHERE clause on
-- the newest row version, never on a subquery's older snapshot.
-- Queue tickets (first come, first served): one sequence for every
-- conversation, so that waiting writes nothing to the conversation row. Never
-- shown to clients: its pace would tell one tenant how busy the others are.
CREATE SEQUENCE transcript.turn_tickets;

-- Random per creation for the same reason (a counter would tell how many
-- conversations others create); unique enough among the creations of one id.
CREATE FUNCTION transcript.random_token() RETURNS bigint
    LANGUAGE sql VOLATILE AS $$ SELECT (1 + floor(random() * 9.2e18))::bigint $$;

ALTER TABLE transcript.conversations
    -- Identifies this creation of the id (Conversation.incarnation): summaries
    -- and memories derived from an erased incarnation are fenced by it.
    ADD COLUMN incarnation      bigint      NOT NULL DEFAULT transcript.random_token(),
    -- The exclusive lease holder, if any (all three set together).
    ADD COLUMN lease_turn_id    text,
    ADD COLUMN lease_token      bigint,
    ADD COLUMN lease_until      timestamptz,
    -- Set when AcquireTurnLease created the conversation (create_if_missing):
    -- the turn that did, until the first append. Releasing that turn's lease
    -- without an append removes the empty conversation again.
    ADD COLUMN provisional_turn_id text;

-- One row per turn that runs, waits, or ended without committing after its
-- model work (its outcome kept for RUNIFOLD_TURN_OUTCOME_RETENTION_S). A turn
-- that commits keeps its row a minute as 'committed' (the append record,
-- transcript.appends with request_id = turn_id, answers repeats): while the row
-- is there, the unique (conversation, turn id) index refuses a racing
-- one-statement grant whose snapshot predates the commit.
CREATE TABLE transcript.turns (
    conversation_key bigint      NOT NULL,
    turn_id          text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('waiting', 'running', 'ended', 'committed')),
    exclusive        boolean     NOT NULL,
    -- Waiting turns are served in ticket order (transcript.turn_tickets); a
    -- running turn's ticket is its fencing token (random: unique to the grant).
    ticket           bigint      NOT NULL,
    payload_hash     bytea       NOT NULL,
    lease_until      timestamptz NOT NULL,
    -- The outcome of an ended turn: {"output": [...], "usage": [...], "reason": ...}.
    outcome          jsonb,
    create_time      timestamptz NOT NULL DEFAULT now(),
    end_time         timestamptz,
    PRIMARY KEY (conversation_key, turn_id)
);

-- The retention sweep of ended turns, and of leases whose holder vanished.
CREATE INDEX turns_lease_until ON transcript.turns (lease_until);

-- The sweep of empty conversations whose creating turn vanished.
CREATE INDEX conversations_provisional ON transcript.conversations (create_time)
    WHERE provisional_turn_id IS NOT NULL;
