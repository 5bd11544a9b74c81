"""What the command prints: tables and readable lines for people, JSON for scripts, and
the errors a person meets first with what fixes them."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runifold_client.client import DEFAULT_TARGET
from runifold_client.errors import (
    InvalidArgument,
    PermissionDenied,
    RunifoldError,
    Unauthenticated,
    Unavailable,
)

# What to change when the server names a field at fault (google.rpc.BadRequest).
_FLAG_OF_FIELD = {
    "namespace": "--namespace or RUNIFOLD_NAMESPACE",
    "conversation_id": "the conversation id (--conversation, or the ID argument)",
    "limit": "--limit",
    "window": "--window",
    "policy.window": "--window",
    "summary_batch": "--summary-batch",
    "policy.summary_batch": "--summary-batch",
    "policy.memory_limit": "--memory",
    "policy.max_summary_passes": "--auto-summary",
    "max_summary_passes": "--passes",
    "memory_id": "the memory id (the ID argument)",
}

# Listing columns that hold ids (UUIDs).
_ID_COLUMNS = frozenset({"conversation", "memory"})


class UsageError(Exception):
    """A mistake in the command line (exit status 2), said in one line."""


def plain(message: ProtoMessage) -> dict[str, Any]:
    """A message as JSON-ready data: every field, zero values included, proto field names,
    64-bit integers as numbers."""
    return MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )


@dataclass
class Output:
    """Where a command prints: a rich console for people, JSON lines for scripts."""

    json: bool
    console: Console

    def document(self, value: dict[str, Any]) -> None:
        print(json.dumps(value, ensure_ascii=False), flush=True)

    def message(self, message: ProtoMessage) -> None:
        self.document(plain(message))

    def line(self, text: str) -> None:
        """A line for people (nothing in --json mode)."""
        if not self.json:
            self.console.print(text)

    def fields(self, title: str, message: ProtoMessage) -> None:
        """One resource: a JSON document, or a two-column table of its fields."""
        if self.json:
            self.message(message)
            return
        table = Table(title=title, show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value")
        for key, value in plain(message).items():
            table.add_row(key, escape(_cell(value)))
        self.console.print(table)

    def rows(
        self,
        title: str,
        columns: Sequence[str],
        items: Iterable[ProtoMessage],
        row: Callable[[Any], Sequence[str]],
    ) -> int:
        """A listing: one JSON document per line, or a table. Returns the count."""
        count = 0
        table = Table(title=title)
        for column in columns:
            if column in _ID_COLUMNS:  # ids are what people copy: never cut
                table.add_column(column, no_wrap=True, min_width=36)
            else:
                table.add_column(column)
        for item in items:
            count += 1
            if self.json:
                self.message(item)
            else:
                table.add_row(*(escape(cell) for cell in row(item)))
        if not self.json:
            if count:
                self.console.print(table)
            else:
                self.console.print(f"{title}: none")
        return count


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _error_document(error: RunifoldError) -> dict[str, Any]:
    document: dict[str, Any] = {
        "code": error.code.name,
        "reason": error.reason,
        "message": error.message,
        "metadata": error.metadata,
    }
    if isinstance(error, InvalidArgument) and error.field:
        document["field"] = error.field
    return {"error": document}


# What gRPC says when something answers at the address, but not gRPC: an HTTP/1 server
# (or any other protocol), or an HTTP/2 one whose answer is no gRPC reply (Connect only).
_NOT_GRPC = ("http1.x server", "Failed parsing HTTP/2", "Received http2 header with status")
# Answered by Runifold's HTTP port to anyone (docs/console.md) when the console is on:
# it names the services.
_HTTP_PORT_PROBE = "/console/api/session"
# Answered by Runifold's HTTP port whatever else is on: a Connect call of one of its
# methods (an empty request: refused, with a Connect error document, or answered).
_CONNECT_PROBE = "/runifold.summary.v1.SummaryService/GetBacklog"


def _json_of(request: urllib.request.Request, timeout: float) -> Any:
    """The JSON document an HTTP request is answered with (an error status's too)."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310  # http:// built here
            return json.loads(reply.read(256 * 1024))
    except urllib.error.HTTPError as error:  # a refusal: its body says whose
        with error:
            return json.loads(error.read(256 * 1024))


def _runifold_http_port(target: str, timeout: float = 2.0) -> bool:
    """Whether `target` is a Runifold server's HTTP port (JSON, Connect, the console)."""
    console = urllib.request.Request(f"http://{target}{_HTTP_PORT_PROBE}")
    connect = urllib.request.Request(
        f"http://{target}{_CONNECT_PROBE}",
        data=b"{}",
        headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"},
    )
    for request in (console, connect):
        try:
            body = _json_of(request, timeout)
        except (OSError, ValueError):  # nothing, or no JSON: not this probe's answer
            continue
        if not isinstance(body, dict):
            continue
        services = body.get("services")
        if isinstance(services, list) and any(str(s).startswith("runifold.") for s in services):
            return True
        # A Connect reply of the method: the backlog's fields, or a refusal of the request
        # (no namespace, no token); a server without the method answers unimplemented.
        code = body.get("code")
        if request is connect and code not in {"unimplemented", "not_found"}:
            return isinstance(code, str) or "depth" in body or body == {}
    return False


def _unreachable_hint(target: str, message: str) -> str:
    """What to do when a call reached no gRPC server at `target`."""
    if any(sign in message for sign in _NOT_GRPC):
        if _runifold_http_port(target):
            return (
                f"that is Runifold's HTTP port (JSON, Connect, gRPC-Web, the console); gRPC "
                f"is on the address the server's start-up line names after `serving ... on` "
                f"(RUNIFOLD_LISTEN, {DEFAULT_TARGET} by default): point --target / "
                "RUNIFOLD_TARGET at it"
            )
        return (
            "something answers there, but not gRPC (an HTTP server?): point --target / "
            f"RUNIFOLD_TARGET at the server's gRPC port ({DEFAULT_TARGET} by default)"
        )
    return "start a server (`make run`), or point --target / RUNIFOLD_TARGET at one"


def _hint(error: RunifoldError, args: argparse.Namespace) -> str:
    """What fixes the error, when it is one a person meets first."""
    if error.reason in {"UNAVAILABLE", "UNIMPLEMENTED"} and (
        isinstance(error, Unavailable) or any(sign in error.message for sign in _NOT_GRPC)
    ):
        # No ErrorInfo: the call never reached a Runifold server.
        target = getattr(error, "target", "") or getattr(args, "target", None) or DEFAULT_TARGET
        return _unreachable_hint(target, error.message)
    if isinstance(error, InvalidArgument) and error.field:
        flag = _FLAG_OF_FIELD.get(error.field)
        if flag:
            return f"check {flag}"
    if isinstance(error, Unauthenticated):
        return "pass a valid token with --token or RUNIFOLD_TOKEN"
    if isinstance(error, PermissionDenied):
        return "the token does not grant this namespace: check --namespace and --token"
    return ""


def _print_error(output: Output, error: RunifoldError, args: argparse.Namespace) -> None:
    if output.json:
        output.document(_error_document(error))
        return
    hint = _hint(error, args)
    # A reason that only repeats the code (no ErrorInfo) is said once.
    status = error.code.name
    if error.reason != status:
        status += f" {error.reason}"
    output.console.print(
        f"[red]{status}[/red]: {escape(error.message)}"
        + (f"\n[yellow]hint[/yellow]: {escape(hint)}" if hint else "")
    )
