"""Runifold as LangGraph's persistence.

Installed with `pip install 'runifold-client[langgraph]'`.

>>> saver = RunifoldSaver(namespace="support")  # the target: $RUNIFOLD_TARGET
>>> graph = builder.compile(checkpointer=saver, store=RunifoldStore())
>>> with saver.thread_run(config, multitask_strategy="reject") as fenced:
...     graph.invoke(inputs, fenced)

`RunifoldSaver` (saver.py) is a `BaseCheckpointSaver`: a thread is a conversation,
its checkpoints are stored by TranscriptService, delete_thread erases the conversation,
and `thread_run` gives a run the thread alone (LangGraph's multitask_strategy reject or
enqueue) on Runifold's turn leases; a graph's messages channel is mirrored into the
thread's transcript and stored once (messages.py). `RunifoldStore` (store.py) is a
`BaseStore` on MemoryService. What each guarantee becomes: docs/integrations.md.
"""

from runifold_client.langgraph.saver import (
    FENCING_TOKEN_KEY,
    TURN_ID_KEY,
    MultitaskStrategy,
    RunifoldSaver,
)
from runifold_client.langgraph.store import RunifoldStore

__all__ = [
    "FENCING_TOKEN_KEY",
    "TURN_ID_KEY",
    "MultitaskStrategy",
    "RunifoldSaver",
    "RunifoldStore",
]
