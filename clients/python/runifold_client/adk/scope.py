"""Where an ADK app's sessions, users and app state live in Runifold: the namespace, the
Runifold user of each ADK user, the conversation of each session, the state's scopes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.adk.sessions import _session_util
from google.adk.sessions.state import State

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import _framework as fw

# The conversation state key that holds the session's last update time (the last
# event's timestamp): a key no ADK state key is (it starts with a control character),
# left out of every state this service returns.
LAST_UPDATE_KEY = "\x1fadk.last_update_time"

# Separates the app from a key or a user id when several apps share one namespace.
_APP_SEPARATOR = "\x1f"
# Labels of an ADK session's conversation.
APP_LABEL, USER_LABEL, SESSION_LABEL = "adk.app", "adk.user", "adk.session"


class _Scope:
    """Where an app's sessions, users and app state live in Runifold."""

    def __init__(self, fixed_namespace: str | None, app_name: str) -> None:
        self.app_name = app_name
        self.shared = bool(fixed_namespace)
        self.namespace = fixed_namespace or app_name

    def user(self, user_id: str) -> str:
        """The Runifold user of an ADK user of this app."""
        return f"{self.app_name}{_APP_SEPARATOR}{user_id}" if self.shared else user_id

    def app_key(self, key: str) -> str:
        return f"{self.app_name}{_APP_SEPARATOR}{key}" if self.shared else key

    def app_state(self, namespace_state: Mapping[str, Any]) -> dict[str, Any]:
        """This app's keys of the namespace's state."""
        if not self.shared:
            return dict(namespace_state)
        prefix = self.app_name + _APP_SEPARATOR
        return {k[len(prefix) :]: v for k, v in namespace_state.items() if k.startswith(prefix)}

    def conversation_id(self, user_id: str, session_id: str) -> str:
        return fw.conversation_id_for(self.app_name, user_id, session_id)

    def delta(self, state: Mapping[str, Any], timestamp: float) -> transcript_pb.StateDelta:
        """ADK's prefixed state delta as Runifold's three scopes (temp: never stored)."""
        parts = _session_util.extract_json_safe_state_delta(dict(state))
        session_part = {**parts["session"], LAST_UPDATE_KEY: timestamp}
        return transcript_pb.StateDelta(
            conversation_json=fw.dumps(session_part),
            user_json=fw.dumps(parts["user"]) if parts["user"] else "",
            namespace_json=(
                fw.dumps({self.app_key(k): v for k, v in parts["app"].items()})
                if parts["app"]
                else ""
            ),
        )


def _merge(
    session_state: Mapping[str, Any],
    app_state: Mapping[str, Any],
    user_state: Mapping[str, Any],
) -> dict[str, Any]:
    merged = {k: v for k, v in session_state.items() if k != LAST_UPDATE_KEY}
    merged.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
    return merged
