"""Automatic curation: a durable job queue that curates conversations into memory after
their turns (rules in model.py, orchestration in service.py, the queue and a batch's
transaction in store.py and statements.py, the workers in worker.py)."""
