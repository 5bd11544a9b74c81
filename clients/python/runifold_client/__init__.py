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

from runifold_client.client import AsyncClient, Client, ConcurrencyMode, TurnResult
from runifold_client.errors import (
    Aborted,
    AlreadyExists,
    BudgetExhausted,
    ConversationBusy,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ModelOutputInvalid,
    NotFound,
    Outcome,
    PermissionDenied,
    ResourceExhausted,
    RunifoldError,
    SummaryBacklog,
    SummaryRequired,
    TurnConflict,
    TurnLeaseLost,
    TurnQueueFull,
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
    "ConcurrencyMode",
    "ConversationBusy",
    "ConversationContextPolicy",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "ModelOutputInvalid",
    "NotFound",
    "Outcome",
    "PermissionDenied",
    "ResourceExhausted",
    "RunifoldError",
    "SummaryBacklog",
    "SummaryRequired",
    "Tool",
    "TurnConflict",
    "TurnLeaseLost",
    "TurnQueueFull",
    "TurnResult",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "VersionConflict",
    "assistant",
    "tool_result",
    "user",
]
