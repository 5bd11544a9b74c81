"""The memory writes: UpsertMemory, DeleteMemory and ForgetSource (service.py), the checks
and digests of their requests (inputs.py), their records and errors (model.py), and their
SQL: one statement per write (statements.py) inside a transaction that fences erasures,
claims request ids and supersedes (store.py, transaction.py)."""
