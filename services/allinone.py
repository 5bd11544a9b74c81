"""The all-in-one process: every service in one server on one port.

Services still reach each other through their gRPC clients (pointed at this
same server), exactly as they do when each runs in its own process.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.agent.component import AgentComponent
from services.common.server import Component
from services.memory.component import MemoryComponent
from services.summary.component import SummaryComponent
from services.transcript.component import TranscriptComponent


def components() -> Sequence[Component]:
    """The components of the all-in-one server, in start order."""
    return [TranscriptComponent(), SummaryComponent(), MemoryComponent(), AgentComponent()]
