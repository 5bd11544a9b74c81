-- A placeholder so that this branch's later migration applies without a gap (the
-- numbers are assigned in notes/WAVE3.md). The branch that owns this number replaces
-- this file when the branches are merged: delete it then.
SELECT 1;
