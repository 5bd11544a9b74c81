"""The model client: the chat-model interface, its errors and budgets (model.py), the
OpenAI-compatible adapter (openai.py, over wire.py), the rules of its settings as
each service reads them (settings.py) and the model calls' metrics (metrics.py, which
the embedding model reports through too). Used by the summarizer, the agent and the
memory service; it knows nothing of gRPC or of any service."""
