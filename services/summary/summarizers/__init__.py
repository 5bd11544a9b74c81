"""The summarizers: the interface and prompt (prompt.py), a chat model (chat.py), the
offline digest (offline.py)."""
