"""Python client of the Runifold conversation services.

from runifold_client import Client, ConversationContextPolicy

client = Client("127.0.0.1:50051", namespace="tenant-42")
result = client.run_conversation(
    "What did we decide?",
    conversation_id=conversation_id,
    policy=ConversationContextPolicy(window=16).with_semantic_memory(8),
)
print(result.text)

`AsyncClient` has the same methods as coroutines; the `runifold` command
(runifold_client.cli) talks to the same services from a terminal.
"""

from runifold_client.client import (
    AsyncClient,
    Client,
    ConcurrencyMode,
    TurnLeaseMode,
    TurnResult,
    new_conversation_id,
    source,
)
from runifold_client.digests import VerificationFailed, Verified
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
    RevisionConflict,
    RunifoldError,
    SummaryBacklog,
    SummaryConflict,
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

# The version of the runifold-client distribution (clients/python/pyproject.toml reads it).
__version__ = "0.1.0"

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
    "RevisionConflict",
    "RunifoldError",
    "SummaryBacklog",
    "SummaryConflict",
    "SummaryRequired",
    "Tool",
    "TurnConflict",
    "TurnLeaseLost",
    "TurnLeaseMode",
    "TurnQueueFull",
    "TurnResult",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "VerificationFailed",
    "Verified",
    "VersionConflict",
    "__version__",
    "assistant",
    "new_conversation_id",
    "source",
    "tool_result",
    "user",
]
