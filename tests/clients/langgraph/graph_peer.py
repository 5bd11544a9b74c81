"""A LangGraph run in a process of its own, on a thread another process also runs:
`thread_run` with a multitask strategy, then a graph of two steps whose first waits
for a line on stdin (so the test holds the run open while it tries its own), each step
appending a message. Prints "holding" once it has the thread, "done" at the end, or
the reason it was refused.

    python -m tests.clients.langgraph.graph_peer TARGET NAMESPACE THREAD_ID STRATEGY NAME [TTL]

With TTL (seconds), the run's lease lapses that long after the process stops renewing
it (a test kills it mid-step); the run's input is then one user message, "hello".
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from runifold_client.errors import RunifoldError
from runifold_client.langgraph import RunifoldSaver


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build(saver: RunifoldSaver, name: str, gate: Any = None) -> Any:
    """Two steps, each appending `name-1`, `name-2`; `gate()` runs before the first."""

    def first(state: State) -> dict[str, Any]:
        if gate is not None:
            gate()
        return {"messages": [AIMessage(f"{name}-1")]}

    def second(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(f"{name}-2")]}

    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


def main(
    target: str, namespace: str, thread_id: str, strategy: str, name: str, ttl: str = ""
) -> None:
    saver = RunifoldSaver(target=target, namespace=namespace)

    def gate() -> None:
        print("holding", flush=True)
        sys.stdin.readline()

    graph = build(saver, name, gate)
    config = {"configurable": {"thread_id": thread_id}}
    inputs = {"messages": [HumanMessage("hello")] if ttl else []}
    try:
        with saver.thread_run(
            config,
            multitask_strategy=strategy,  # type: ignore[arg-type]
            ttl=float(ttl or 30.0),
        ) as fenced:
            graph.invoke(inputs, fenced)
    except RunifoldError as error:
        print(f"refused {error.reason}", flush=True)
        return
    finally:
        saver.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
