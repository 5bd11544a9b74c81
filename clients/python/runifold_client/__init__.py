"""Python client of the Runifold conversation services.

from runifold_client import Client, ConversationContextPolicy

client = Client("127.0.0.1:50051", namespace="tenant-42")
result = client.run_conversation(
    "What did we decide?",
    conversation_id=conversation_id,
    policy=ConversationContextPolicy(window=16).with_semantic_memory(8),
)
print(result.text)
"""

from runifold_client.client import AsyncClient, Client, TurnResult
from runifold_client.errors import (
    Aborted,
    AlreadyExists,
    BudgetExhausted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Outcome,
    PermissionDenied,
    RunifoldError,
    SummaryBacklog,
    SummaryRequired,
    TurnConflict,
    Unauthenticated,
    Unavailable,
    Usage,
    VersionConflict,
)
from runifold_client.policy import (
    Budget,
    ConversationContextPolicy,
    Tool,
    assistant,
    tool_result,
    user,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "Budget",
    "BudgetExhausted",
    "Client",
    "ConversationContextPolicy",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "Outcome",
    "PermissionDenied",
    "RunifoldError",
    "SummaryBacklog",
    "SummaryRequired",
    "Tool",
    "TurnConflict",
    "TurnResult",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "VersionConflict",
    "assistant",
    "tool_result",
    "user",
]
