"""Structured logs: one JSON object per line, with the request context attached, or
readable lines for a person at a terminal (RUNIFOLD_LOG_FORMAT auto, the default:
text when stderr is a terminal, JSON otherwise).

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


class TextFormatter(logging.Formatter):
    """One readable line: time, level, logger, message, then the `extra` fields as
    key=value (what the JSON lines carry, for a person at a terminal)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [
            f"{key}={value}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        ]
        if method := method_var.get():
            extras.append(f"method={method}")
        if request_id := request_id_var.get():
            extras.append(f"request_id={request_id}")
        if extras:
            line, _, trace = line.partition("\n")
            line = f"{line}  " + " ".join(extras) + (f"\n{trace}" if trace else "")
        return line


# Libraries whose INFO lines say nothing an operator acts on (a model file loaded, the
# embedded PostgreSQL's own chatter): they log from WARNING up.
_QUIET_LIBRARIES = ("pgserver", "httpx", "httpx2", "openai")


def resolve_format(fmt: str, stream: object = None) -> str:
    """The format to write, json or text: `auto` is text when the stream is a terminal."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
    return "text" if callable(isatty) and isatty() else "json"


def configure(service: str, level: str = "INFO", fmt: str = "auto") -> None:
    """Send logs to stderr in the chosen format, "json", "text" or "auto" (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if resolve_format(fmt, sys.stderr) == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
