-- Reserved: memory migration 0006 is WatchMemories' (branch i30-feed). This empty step
-- only keeps the numbering contiguous on the curation branch; drop this file when the
-- two branches are merged (0007_curation.sql does not depend on 0006).
SELECT 1;
