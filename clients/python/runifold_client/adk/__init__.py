"""Runifold as the session and memory service of Google ADK.

Installed with `pip install 'runifold-client[adk]'`.

>>> sessions = RunifoldSessionService()  # the target: $RUNIFOLD_TARGET, else 127.0.0.1:50051
>>> memory = RunifoldMemoryService()
>>> runner = Runner(agent=agent, app_name="support", session_service=sessions,
...                 memory_service=memory)

Without `namespace`, each ADK `app_name` is the Runifold namespace (so it must be 1..128
characters of [A-Za-z0-9_.-]); with one, every app lives in it, apart. A session is a
conversation (a UUIDv5 of app, user and session id) of a Runifold user; each event is
one entry (the event exactly, in `Message.native_json`, beside a readable rendering);
the session's, the user's and the app's state are the conversation's, the user's and
the namespace's state, changed with the event's append under one compare-and-swap.
What each guarantee becomes here: docs/integrations.md. `OfflineLlm` is a deterministic
model that needs no network, for examples and tests.
"""

from runifold_client.adk.events import entry_to_event, event_to_message
from runifold_client.adk.memory import RunifoldMemoryService, SessionMemories
from runifold_client.adk.offline import OfflineLlm
from runifold_client.adk.scope import APP_LABEL, LAST_UPDATE_KEY, SESSION_LABEL, USER_LABEL
from runifold_client.adk.sessions import RunifoldSessionService

__all__ = [
    "APP_LABEL",
    "LAST_UPDATE_KEY",
    "SESSION_LABEL",
    "USER_LABEL",
    "OfflineLlm",
    "RunifoldMemoryService",
    "RunifoldSessionService",
    "SessionMemories",
    "entry_to_event",
    "event_to_message",
]
