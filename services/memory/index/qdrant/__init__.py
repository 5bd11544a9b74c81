"""The Qdrant server adapter (adapter.py), its collection (collection.py), and the
filters and vectors both Qdrant engines share, the server and Edge (filters.py)."""
