"""The campaign's history: every operation a client made, with what it asked and what
came back, and every fault the nemesis injected. The checker (chaos/checker.py) reads
nothing else but this and the final state.

An outcome is `ok` (a reply came), `fail` (a definite refusal: the server answered with
an error that says nothing was done, or what was done instead), or `unknown` (the call
broke: the operation may or may not have taken effect).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Status codes after which a write is known not to have happened (the server answered
# the request itself; a retry of it would be refused the same way).
DEFINITE = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "RESOURCE_EXHAUSTED",
    }
)


@dataclass
class Op:
    """One operation of a client: its kind, where, what it sent and what came back."""

    id: int
    kind: str
    namespace: str
    conversation_id: str = ""
    start: float = 0.0
    end: float = 0.0
    outcome: str = "unknown"  # ok | fail | unknown
    code: str = ""  # the status code of a failure
    reason: str = ""  # its ErrorInfo reason
    request: dict[str, Any] = field(default_factory=dict)
    reply: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0


class History:
    """What happened, in the order it was recorded."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        self._ids = itertools.count(1)
        self.started = time.monotonic()

    def begin(self, kind: str, namespace: str, conversation_id: str = "", **request: Any) -> Op:
        op = Op(
            next(self._ids),
            kind,
            namespace,
            conversation_id,
            start=time.monotonic(),
            request=request,
        )
        self.ops.append(op)
        return op

    def fault(self, kind: str, target: str) -> Fault:
        fault = Fault(kind, target, time.monotonic())
        self.faults.append(fault)
        return fault

    def dump(self, path: Path) -> None:
        """The history as JSON Lines (for a post-mortem of a failed campaign)."""
        with path.open("w") as out:
            for op in self.ops:
                out.write(json.dumps({"op": dataclasses.asdict(op)}, default=str) + "\n")
            for fault in self.faults:
                out.write(json.dumps({"fault": dataclasses.asdict(fault)}) + "\n")


def token(namespace: str, conversation_id: str, op_id: int, index: int) -> str:
    """The text of a message the campaign writes: who wrote it where, so that every entry
    read back names its namespace, conversation, operation and place."""
    return f"chaos|{namespace}|{conversation_id}|{op_id}|{index}"


def parse_token(text: str) -> tuple[str, str, int, int] | None:
    """(namespace, conversation id, op id, index) of a campaign message, or None."""
    parts = text.split("|")
    if len(parts) != 5 or parts[0] != "chaos":
        return None
    try:
        return parts[1], parts[2], int(parts[3]), int(parts[4])
    except ValueError:
        return None
