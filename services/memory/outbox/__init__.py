"""The memory outbox: every write queues its index write in the same transaction (store.py,
statements.py), and the indexer drains it into the vector index (indexer.py, with the
expiry sweeper and reindex, the other background work of the index)."""
