"""The pgvector adapter (adapter.py), its table (schema.py) and its SQL (statements.py)."""
