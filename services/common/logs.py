"""Structured logs: one JSON object per line, with the request context attached.

Hand-written: a formatter of twenty lines over the standard library is
simpler than a dependency. Log records never carry message, summary or
memory content; callers pass identifiers and counts only.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime

# The metadata key of a request id (read from callers, echoed back, carried to peers).
REQUEST_ID_HEADER = "x-request-id"
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
method_var: contextvars.ContextVar[str] = contextvars.ContextVar("method", default="")
# Set by services.common.tracing when a span is recording (empty when tracing is off).
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record and its `extra` fields as one JSON object."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
        }
        if request_id := request_id_var.get():
            document["request_id"] = request_id
        if method := method_var.get():
            document.setdefault("method", method)
        if trace_id := trace_id_var.get():
            document["trace_id"] = trace_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure(service: str, level: str = "INFO", fmt: str = "json") -> None:
    """Send logs to stderr in the chosen format (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("pgserver").setLevel(max(logging.WARNING, root.level))
