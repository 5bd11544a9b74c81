"""Structured logs: one JSON object per line, with the request context attached, or
readable lines for a person at a terminal (RUNIFOLD_LOG_FORMAT auto, the default:
text when stderr is a terminal, JSON otherwise).

Hand-written: a formatter of twenty lines over the standard library is
simpler than a dependency. Log records never carry message, summary or
memory content; callers pass identifiers and counts only. A logged exception's
traceback names a database driver error by its class and SQLSTATE only: its text
(PostgreSQL's message, DETAIL and CONTEXT) quotes the data at fault, such as the
JSON document a statement could not take (`describe`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from types import TracebackType
from typing import TypeAlias

import psycopg

# The call id: what ties the log lines, spans and peer calls of one RPC together (read
# from callers, made when they send none, echoed back, carried to peers). Not the
# idempotency key of a write, which is its `request_id` field. The mesh's own
# correlation header is taken as the call id when a caller sends no x-call-id.
CALL_ID_HEADER = "x-call-id"
MESH_REQUEST_ID_HEADER = "x-request-id"
call_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("call_id", default="")
method_var: contextvars.ContextVar[str] = contextvars.ContextVar("method", default="")
# Set by services.common.tracing when a span is recording (empty when tracing is off).
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


ExcInfo: TypeAlias = (
    tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
)


def describe(error: BaseException) -> str:
    """What a log or a message may say of an exception: its text, or for a database
    driver's error only its class and SQLSTATE (its text quotes the data at fault)."""
    if not isinstance(error, psycopg.Error):
        return f"{type(error).__name__}: {error}"
    name = f"{type(error).__module__}.{type(error).__qualname__}"
    return f"{name} (SQLSTATE {error.sqlstate})" if error.sqlstate else name


def format_exception(exc_info: ExcInfo) -> str:
    """A traceback as `logging.Formatter.formatException` writes it, with every driver
    error of the chain (causes, contexts, groups) named by `describe` instead."""
    error = exc_info[1]
    if error is None:
        return ""
    if not any(isinstance(e, psycopg.Error) for e in _chain(error, set())):
        return "".join(traceback.format_exception(error)).rstrip("\n")
    return "".join(_render(error, set())).rstrip("\n")


def _chain(error: BaseException, seen: set[int]) -> list[BaseException]:
    if id(error) in seen:
        return []
    seen.add(id(error))
    linked = [error.__cause__, error.__context__]
    linked += list(error.exceptions) if isinstance(error, BaseExceptionGroup) else []
    return [error] + [e for item in linked if item is not None for e in _chain(item, seen)]


def _render(error: BaseException, seen: set[int]) -> list[str]:
    """traceback.format_exception's lines, each driver error's own line replaced."""
    seen.add(id(error))
    lines: list[str] = []
    cause, context = error.__cause__, error.__context__
    if cause is not None and id(cause) not in seen:
        lines += _render(cause, seen)
        lines.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif context is not None and not error.__suppress_context__ and id(context) not in seen:
        lines += _render(context, seen)
        lines.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if error.__traceback__ is not None:
        lines.append("Traceback (most recent call last):\n")
        lines += traceback.format_tb(error.__traceback__)
    if isinstance(error, psycopg.Error):
        lines.append(describe(error) + "\n")
    else:
        lines += traceback.format_exception_only(error)
    if isinstance(error, BaseExceptionGroup):
        for index, member in enumerate(error.exceptions, 1):
            lines.append(f"+---------------- {index} ----------------\n")
            lines += [
                "    " + line for part in _render(member, seen) for line in part.splitlines(True)
            ]
    return lines


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
        if call_id := call_id_var.get():
            document["call_id"] = call_id
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

    def formatException(self, ei: ExcInfo) -> str:
        return format_exception(ei)


class TextFormatter(logging.Formatter):
    """One readable line: time, level, logger, message, then the `extra` fields as
    key=value (what the JSON lines carry, for a person at a terminal)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        # logging caches the traceback text on the record: another handler's formatter
        # may have written it unredacted.
        record.exc_text = None
        line = super().format(record)
        extras = [
            f"{key}={value}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        ]
        if method := method_var.get():
            extras.append(f"method={method}")
        if call_id := call_id_var.get():
            extras.append(f"call_id={call_id}")
        if extras:
            line, _, trace = line.partition("\n")
            line = f"{line}  " + " ".join(extras) + (f"\n{trace}" if trace else "")
        return line

    def formatException(self, ei: ExcInfo) -> str:
        return format_exception(ei)


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
