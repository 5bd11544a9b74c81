-- One model call per turn id, even when a holder loses its lease. A turn's holder says
-- when it begins its model call (RenewTurnLeaseRequest.calling_model); a repeat of the
-- turn id that finds the lease lapsed after that moment does not take it over and run
-- the model again: the turn ends as TURN_INTERRUPTED (its outcome is unknown), and every
-- repeat of its id gets that answer.
ALTER TABLE transcript.turns ADD COLUMN model_call_time timestamptz;
