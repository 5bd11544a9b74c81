"""Text embeddings: the Embedder interface (protocol.py) and its implementations, the
local all-MiniLM-L6-v2 on ONNX Runtime with its batching queue (local.py, the graph
built by onnx_minilm.py) and an OpenAI-compatible endpoint (openai.py). component.py
chooses and builds the one the configuration names."""
