-- Listing memories by metadata (issue 33: ListMemoriesRequest.metadata_filter, which the
-- LangGraph store (runifold_client.langgraph.RunifoldStore) lists its items by).
--
-- A listing with a filter asks for `metadata @> {...}` inside one namespace in id order.
-- Without an index on metadata it would read every memory of the namespace to find one
-- page of matches; this GIN index (jsonb_path_ops: containment only, smaller than the
-- default operator class) finds the matching rows, which the listing then orders by id.
-- Not CONCURRENTLY: migrations run in a transaction, under the advisory lock.
CREATE INDEX memories_metadata ON memory.memories USING gin (metadata jsonb_path_ops);
