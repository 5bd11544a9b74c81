"""MemoryService: curated memories with provenance, searched by meaning.

A folder per feature: writes/ (UpsertMemory, DeleteMemory, ForgetSource), search/
(SearchMemories and the lexical scoring the index shares), proposals/
(ProposeMemories and its proposers), embeddings/ (the Embedder and its local and
OpenAI-compatible implementations), index/ (the vector index: Qdrant Edge, Qdrant,
pgvector) and outbox/ (the index writes queued with every write, and the indexer
that drains them). At the top: the records and the reads every feature shares
(model.py, service.py, store.py, statements.py, rows.py), what the service needs
from TranscriptService (ports.py) and its gRPC adapter (remote.py), the wire
(servicer.py), the wiring that chooses and builds the pluggable parts
(component.py), config.py, metrics.py and migrations/.
"""
