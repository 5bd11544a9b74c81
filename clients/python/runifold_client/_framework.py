"""What the framework integrations share: stable ids, request ids, readable renderings.

Nothing here imports a framework; `runifold_client.openai_agents` and
`runifold_client.adk` do, and are installed with their extras.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from runifold.common.v1 import common_pb2
from runifold_client.client import AsyncClient

# The namespace of the UUIDv5 ids made from framework session ids (RFC 9562, 5.5).
_ID_NAMESPACE = uuid.UUID("6f1c7a52-0b7e-4c43-9d0e-3f6a9a1e5b21")
# Messages per AppendEntries (RUNIFOLD_MAX_MESSAGES_PER_APPEND's default).
MAX_ITEMS_PER_APPEND = 256
# The readable text kept beside a framework's own JSON (which is the exact record): what
# summaries and memory proposals read. Clipped, so that the pair fits a message's limit.
MAX_RENDERED_CHARS = 16 * 1024
# Label values are at most 1 KiB.
MAX_LABEL_CHARS = 1024


def conversation_id_for(*parts: str) -> str:
    """The conversation id of a framework's session: the session id itself when it is
    a UUID already, else a UUIDv5 of the parts (stable: every process finds the same
    conversation without a lookup table)."""
    if len(parts) == 1:
        try:
            return str(uuid.UUID(parts[0]))
        except ValueError:
            pass
    return str(uuid.uuid5(_ID_NAMESPACE, json.dumps(list(parts))))


def request_id_for(
    conversation_id: str, version: int, payload: Iterable[str], *, writer: str = ""
) -> str:
    """The idempotency key of a write made at a version the writer read: a retry of the
    same write (same writer, same version, same payload) replays instead of writing
    twice. `writer` names who writes (a session object, a run): the same payload from
    another writer at the same version is another write, never a replay of this one."""
    digest = hashlib.sha256(f"{conversation_id}\n{version}".encode())
    if writer:
        digest.update(f"\nwriter {writer}".encode())
    for part in payload:
        digest.update(b"\n")
        digest.update(part.encode())
    return "fw-" + digest.hexdigest()[:48]


def new_writer_id() -> str:
    """A writer id (see request_id_for): random, made once per writer."""
    return uuid.uuid4().hex


def keyed_request_id(conversation_id: str, kind: str, key: str) -> str:
    """The idempotency key of a write the framework names itself (an ADK event by its
    id): the same key is the same write, whoever sends it and at whatever version."""
    digest = hashlib.sha256(f"{conversation_id}\n{kind}\n{key}".encode())
    return "fw-" + digest.hexdigest()[:48]


class InFlight:
    """The request ids a writer has in flight, so that two of its calls running at once
    with the same write (which would share one request id, and so be stored once while
    both report success) are told apart; a retry made after a call ended still finds
    the call's own id, and replays. Thread-safe (a writer may be used from threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def claim(self, request_id: str) -> str:
        """`request_id`, or a derived one when it is in flight already; release it after."""
        with self._lock:
            claimed, n = request_id, 0
            while claimed in self._ids:
                n += 1
                claimed = "fw-" + hashlib.sha256(f"{request_id}#{n}".encode()).hexdigest()[:48]
            self._ids.add(claimed)
            return claimed

    def release(self, request_id: str) -> None:
        with self._lock:
            self._ids.discard(request_id)


def clip(text: str, limit: int = MAX_RENDERED_CHARS) -> str:
    """Text clipped to `limit` characters, marked when it was."""
    return text if len(text) <= limit else text[:limit] + " [clipped]"


def dumps(value: Any) -> str:
    """Compact JSON; pydantic models (which some framework items hold) as their JSON form."""

    def default(item: Any) -> Any:
        dump = getattr(item, "model_dump", None)
        if callable(dump):
            return dump(mode="json", exclude_none=True)
        raise TypeError(f"{type(item).__name__} is not JSON serializable")

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=default)


async def standing_tail(
    client: AsyncClient,
    conversation_id: str,
    last_sequence: int,
    count: int,
    namespace: str,
) -> list[common_pb2.Entry]:
    """The last `count` entries that stand (not retracted), in sequence order, read
    backwards from `last_sequence`: the cost grows with `count` and the retracted
    entries among them, never with the transcript's length."""
    found: list[common_pb2.Entry] = []
    through = last_sequence
    while through > 0 and len(found) < count:
        after = max(0, through - (count - len(found)))
        page = [
            entry
            async for entry in client.entries(
                conversation_id,
                namespace=namespace,
                after_sequence=after,
                through_sequence=through,
            )
        ]
        found = [entry for entry in page if not entry.retracted_version] + found
        through = after
    return found[-count:] if count else []


async def standing_entries(
    client: AsyncClient, conversation_id: str, last_sequence: int, namespace: str
) -> AsyncIterator[common_pb2.Entry]:
    """Every standing entry up to `last_sequence`, in order, page by page."""
    if last_sequence <= 0:
        return
    async for entry in client.entries(
        conversation_id, namespace=namespace, through_sequence=last_sequence
    ):
        if not entry.retracted_version:
            yield entry


def offline_answer(said: Sequence[str]) -> str:
    """The answer of the integrations' offline models (`openai_agents.OfflineModel`,
    `adk.OfflineLlm`), for examples and tests: deterministic, no network, worded as
    Runifold's own offline agent answers. `said` is the text of each message the model
    was given, oldest first, the user's new one last: the answer says how many came
    before it (so a session's history shows) and echoes it."""
    last = said[-1] if said else ""
    return f"Context: {max(0, len(said) - 1)} earlier message(s).\nYou said: {last}"
