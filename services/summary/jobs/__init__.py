"""The summary job queue: its records, SQL, store and the workers that drain it."""
