"""What a write carries besides its messages (TranscriptService): the user it names,
its state changes, the entries it retracts, and the digest that binds them to its
request id. Pure rules: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from services.common import jsonb, validation
from services.common.domain import payload_hash
from services.common.errors import invalid_argument
from services.transcript.config import MAX_RETRACTIONS
from services.transcript.model import StateChange

# A user id: like a label value, short and without NUL.
MAX_USER_ID_CHARS = 128


def user_id(value: str, field: str = "user_id") -> str:
    """A user id: 1..128 characters without NUL (USER_ID_INVALID)."""
    if not 1 <= len(value) <= MAX_USER_ID_CHARS or "\x00" in value:
        raise invalid_argument(
            "INVALID_USER_ID",
            f"{field} must be 1..{MAX_USER_ID_CHARS} characters without NUL",
            field=field,
        )
    return value


def state_change(
    conversation_json: str,
    user_json: str,
    namespace_json: str,
    max_bytes: int,
    field: str,
    max_depth: int = jsonb.MAX_DEPTH,
) -> StateChange:
    """A write's state changes: each a JSON object by jsonb's rules, of at most
    `max_bytes` and `max_depth` levels (empty: none)."""
    parts: list[str | None] = []
    for scope, text in (
        ("conversation", conversation_json),
        ("user", user_json),
        ("namespace", namespace_json),
    ):
        if not text:
            parts.append(None)
            continue
        name = f"{field}.{scope}_json"
        if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            raise invalid_argument(
                "STATE_TOO_LARGE",
                f"{name} exceeds {max_bytes} bytes",
                field=name,
                limit_bytes=max_bytes,
                scope=scope,
            )
        validation.json_object(text, name, "INVALID_STATE", max_depth=max_depth)
        parts.append(text)
    return StateChange(*parts)


def write_digest(encoded: str, state: StateChange, retract: Sequence[int]) -> bytes:
    """What a request id's payload is: the messages, and the state changes and
    retractions when there are any (a write with neither hashes as it always did)."""
    if not state and not retract:
        return payload_hash(encoded)
    extras = json.dumps(
        [state.conversation, state.user, state.namespace, list(retract)], separators=(",", ":")
    )
    return payload_hash(encoded + "\n" + extras)


def retractions(retract: Sequence[int], expected_version: int | None) -> tuple[int, ...]:
    """The sequences a write retracts, checked: distinct, positive, at most
    MAX_RETRACTIONS, and only with an expected version."""
    if not retract:
        return ()
    if len(retract) > MAX_RETRACTIONS:
        raise invalid_argument(
            "TOO_MANY_RETRACTIONS",
            f"retract_sequences holds at most {MAX_RETRACTIONS} sequences",
            field="retract_sequences",
            limit=MAX_RETRACTIONS,
        )
    if min(retract) < 1 or len(set(retract)) != len(retract):
        raise invalid_argument(
            "INVALID_SEQUENCE",
            "retract_sequences must be distinct sequences of the transcript (1-based)",
            field="retract_sequences",
        )
    if expected_version is None:
        raise invalid_argument(
            "EXPECTED_VERSION_REQUIRED",
            "a write that retracts entries names the version it read (expected_version)",
            field="expected_version",
        )
    return tuple(sorted(retract))
