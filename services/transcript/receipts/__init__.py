"""Erasure receipts: what an erasure of one incarnation of a conversation erased, store by
store (counts, never content), kept after the conversation is gone. AgentService's
EraseConversation records one (DeleteConversation records it in the deletion's own
transaction, with the entries and appends it erases; RecordErasureReceipt merges what a
later call of the same erasure reports), and GetErasureReceipt reads it. The rules are
in model.py, the SQL in statements.py, the store in store.py."""
