"""The model client: the chat-model interface, its errors and budgets (model.py), and the
OpenAI-compatible adapter (openai.py). Used by the summarizer, the agent and the memory
proposer; it knows nothing of gRPC or of any service."""
