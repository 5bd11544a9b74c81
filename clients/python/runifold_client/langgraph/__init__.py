from runifold_client.langgraph.store import RunifoldStore

__all__ = ["RunifoldStore"]
