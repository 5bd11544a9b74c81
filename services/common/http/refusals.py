"""What the HTTP port says when it refuses a request before any service sees it.

connectrpc answers an unknown method (404), an HTTP method other than POST (405) and a
Content-Type it cannot read (415) with the status alone and an empty body: a person
with curl or a browser cannot tell what went wrong. `WithRefusalBodies` keeps each of
those statuses and gives it a body:

- a Connect error (`{"code", "message", "details"}`, ErrorInfo first, as every other
  error of the port) to a client that speaks Connect: one that sends
  `connect-protocol-version`, a Connect Content-Type, or accepts JSON;
- to a gRPC-Web client, the gRPC status in the headers (`grpc-status`, `grpc-message`),
  where its library reads it, and the message as text;
- to anyone else (a browser, curl without `-H 'Content-Type: ...'`), the message as one
  line of text.

The message names what the port accepts: the Content-Types, the HTTP method, the
service's methods. It never quotes the request's content; a method name or a
Content-Type is named back only when it has the shape of one.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from connectrpc._protocol import ConnectWireError  # the port's one error body encoder
from google.protobuf import descriptor_pool

from services.common.errors import Code, DomainError
from services.common.http.bridge import ASGIApp
from services.common.http.errors import connect_error

# What the port reads, by Content-Type (connectrpc's codecs over this process's messages).
ACCEPTED_TYPES = (
    "application/json",
    "application/proto",
    "application/connect+json",
    "application/connect+proto",
    "application/grpc-web+proto",
    "application/grpc-web+json",
)
ACCEPTED = (
    "application/json or application/proto (unary calls), application/connect+json or "
    "application/connect+proto (streams), application/grpc-web+proto or "
    "application/grpc-web+json (gRPC-Web)"
)
# The statuses connectrpc sends without a body.
REFUSED = frozenset({404, 405, 415})
# gRPC's code for each (a gRPC-Web client reads it from the headers).
_GRPC_STATUS = {404: "12", 405: "12", 415: "3"}

_METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_MEDIA_TYPE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}"
)


def _headers(scope: Mapping[str, Any]) -> dict[bytes, bytes]:
    return {key.lower(): value for key, value in scope.get("headers", ())}


def _media_type(headers: Mapping[bytes, bytes]) -> str:
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")


def speaks_connect(scope: Mapping[str, Any]) -> bool:
    """True when the client reads Connect's JSON errors."""
    headers = _headers(scope)
    kind = _media_type(headers)
    return (
        b"connect-protocol-version" in headers
        or kind in ("application/json", "application/proto")
        or kind.startswith("application/connect+")
        or b"application/json" in headers.get(b"accept", b"")
    )


def _is_grpc_web(scope: Mapping[str, Any]) -> bool:
    return _media_type(_headers(scope)).startswith("application/grpc-web")


def service_methods(service: str) -> list[str]:
    """The method names of a service this process's protos define, or []."""
    try:
        found = descriptor_pool.Default().FindServiceByName(service)
    except KeyError:
        return []
    return [method.name for method in found.methods]


def refusal_error(status: int, scope: Mapping[str, Any], services: list[str]) -> DomainError:
    """The error a protocol-level refusal of `scope` with `status` explains."""
    path = str(scope.get("path", ""))
    service, _, method = path.strip("/").partition("/")
    named = method if _METHOD_NAME.fullmatch(method) else ""
    if status == 415:
        given = _media_type(_headers(scope))
        if not given:
            said = "the request has no Content-Type"
        elif _MEDIA_TYPE.fullmatch(given):
            said = f"Content-Type {given} is not one this port reads"
        else:
            said = "the request's Content-Type is not one this port reads"
        return DomainError(
            Code.INVALID_ARGUMENT,
            "CONTENT_TYPE_UNSUPPORTED",
            f"{said}: send {ACCEPTED} (gRPC itself is served on the gRPC port)",
            metadata={"accepted": ", ".join(ACCEPTED_TYPES)},
        )
    if status == 405:
        verb = str(scope.get("method", ""))
        return DomainError(
            Code.UNIMPLEMENTED,
            "HTTP_METHOD_NOT_ALLOWED",
            f"{service}/{named or 'its methods'} is called with POST, not "
            f"{verb if _METHOD_NAME.fullmatch(verb) else 'this HTTP method'} "
            "(for example curl -H 'Content-Type: application/json' -d '{...}' URL)",
            metadata={"allow": "POST"},
        )
    methods = service_methods(service) if service in services else []
    if methods:
        return DomainError(
            Code.UNIMPLEMENTED,
            "METHOD_NOT_FOUND",
            f"{service} has no method {named or 'of that name'}; its methods: "
            + ", ".join(methods),
            metadata={"service": service, "methods": ", ".join(methods)},
        )
    return DomainError(
        Code.UNIMPLEMENTED,
        "METHOD_NOT_FOUND",
        "no such service on this port (calls are POST /<package>.<Service>/<Method>); it "
        "serves " + ", ".join(sorted(services)),
        metadata={"services": ", ".join(sorted(services))},
    )


async def send_refusal(
    status: int,
    error: DomainError,
    scope: Mapping[str, Any],
    send: Any,
    extra: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
) -> None:
    """Answer `status` with `error` in the form the client reads (see the module)."""
    headers = [(k, v) for k, v in extra if k.lower() not in (b"content-type", b"content-length")]
    if speaks_connect(scope):
        body = ConnectWireError.from_exception(connect_error(error)).to_json_bytes()
        headers.append((b"content-type", b"application/json"))
    else:
        phrase = HTTPStatus(status).phrase
        body = f"{status} {phrase}: {error.message}\n".encode()
        headers.append((b"content-type", b"text/plain; charset=utf-8"))
        if _is_grpc_web(scope):
            message = urllib.parse.quote(error.message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
            headers += [
                (b"grpc-status", _GRPC_STATUS[status].encode()),
                (b"grpc-message", message.encode()),
            ]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class WithRefusalBodies:
    """Gives connectrpc's bodiless 404, 405 and 415 a body (see the module); every other
    response passes as it is."""

    def __init__(self, app: ASGIApp, services: list[str]) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        held: dict[str, Any] | None = None

        async def send_with_body(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if message["status"] in REFUSED and not any(
                    key.lower() == b"content-type" for key, _ in headers
                ):
                    held = message  # answered with its body once the (empty) body comes
                    return
            elif message["type"] == "http.response.body" and held is not None:
                if message.get("body") or message.get("more_body"):
                    # Not the empty refusal after all: pass it on as it was.
                    start, held = held, None
                    await send(start)
                    await send(message)
                    return
                start, held = held, None
                error = refusal_error(start["status"], scope, self.services)
                await send_refusal(start["status"], error, scope, send, start.get("headers", []))
                return
            await send(message)

        await self.app(scope, receive, send_with_body)
