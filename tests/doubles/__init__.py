"""In-memory stores for the domain unit tests.

Each obeys the same protocol and atomicity as its service's PostgreSQL store
(one lock around every write, the same domain rules from the service's
model.py), so the unit tests exercise the real rules; tests/*_cases.py run the
same cases against both.
"""
