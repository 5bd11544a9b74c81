-- One word per concept. A turn lease is quoted by its fencing token; a turn that waits
-- in a conversation's queue holds a ticket, its place in line. Until now one column,
-- turns.ticket, held either (the ticket of a waiting row, the token of any other), and
-- the conversation row called its copy of an exclusive lease's token lease_token.
-- From here on:
--   turns.fencing_token          the token of the turn's grant (random per grant,
--                                transcript.random_token()); NULL while it waits;
--   turns.ticket                 its place in the queue (transcript.turn_tickets) while
--                                it waits; NULL once granted;
--   conversations.lease_fencing_token
--                                the fencing token of the exclusive lease held on the
--                                conversation (with lease_turn_id and lease_until).
--
-- The turns table holds only live, waiting and recently ended turns: the update and
-- the check below touch a few rows. The rename of the conversations' column changes
-- the catalog only.

ALTER TABLE transcript.turns ADD COLUMN fencing_token bigint;
ALTER TABLE transcript.turns ALTER COLUMN ticket DROP NOT NULL;

UPDATE transcript.turns SET fencing_token = ticket, ticket = NULL WHERE state <> 'waiting';

ALTER TABLE transcript.turns ADD CONSTRAINT turns_ticket_or_fencing_token CHECK (
    (state = 'waiting') = (ticket IS NOT NULL)
    AND (state = 'waiting') = (fencing_token IS NULL)
);

ALTER TABLE transcript.conversations RENAME COLUMN lease_token TO lease_fencing_token;
