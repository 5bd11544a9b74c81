-- A placeholder of branch i29-console, which took migration 0010: transcript migrations
-- 0008 (curated_through, branch i30-curation) and 0009 (erasure receipts, branch
-- i30-receipts) are being written beside it, and migrations are numbered without gaps.
-- Replaced by the real 0009 when the branches merge (delete this file then).
SELECT 1;
