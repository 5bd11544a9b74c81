"""SearchMemories: the query's rules and the re-read from the store (service.py), the
lexical scoring and the fusion every index back-end shares (lexical.py), and the
full-text search of the degraded mode (store.py, statements.py)."""
