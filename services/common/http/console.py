"""The web console on the HTTP port: static files, and two small JSON endpoints.

The console (services/console/static, plain ES modules, no build step) calls the
services themselves over Connect JSON, with the caller's own credentials, so it
can do exactly what its user may do. Beside them it reads:

- `GET /console/api/session`: what the console needs before its first call (whether
  authentication is on, whether its write actions are enabled, which services and
  RPCs this port serves) and, when the request carries credentials that
  authenticate, the caller's identity: the namespaces it grants, which the console
  lists. Answered to anyone: it says nothing a caller could not learn by calling.
- `GET /console/api/metrics`: a few of this process's own metrics (the summary job
  backlog, conflict, busy and shed counters), for the console's small charts. The
  values are process-wide, with no namespace in them; with authentication on, only
  an authenticated caller may read them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from services.common.auth import ALL, AuthGate, Identity
from services.common.errors import DomainError
from services.common.http.bridge import ASGIApp, grpc_peer
from services.common.http.errors import CONNECT_CODES
from services.common.http.settings import HttpSettings

STATIC = Path(__file__).resolve().parents[2] / "console" / "static"

# The series the console charts: its name for each, and the series (summed over labels).
# Read from the process's registry by name: the floor imports no service's metrics, and
# a series of a service this process does not host reads 0.
CHARTED: dict[str, str] = {
    "summary_jobs_depth": "runifold_summary_jobs_depth",
    "summary_jobs_oldest_age_seconds": "runifold_summary_jobs_oldest_age_seconds",
    "summary_jobs_failed": "runifold_summary_jobs_failed",
    "append_conflicts_total": "runifold_append_conflicts_total",
    "turn_conflicts_total": "runifold_turn_conflicts_total",
    "turn_busy_refusals_total": "runifold_turn_busy_refusals_total",
    "summary_required_total": "runifold_summary_required_total",
    "requests_shed_total": "runifold_requests_shed_total",
    "memory_outbox_depth": "runifold_memory_outbox_depth",
}


def charted_values(registry: CollectorRegistry = REGISTRY) -> dict[str, float]:
    """The charted series' current values, each summed over its label values."""
    wanted = {series: name for name, series in CHARTED.items()}
    values = dict.fromkeys(CHARTED, 0.0)
    for family in registry.collect():
        for sample in family.samples:
            name = wanted.get(sample.name)
            if name is not None:
                values[name] += sample.value
    return values


def _error(error: DomainError, status: int) -> JSONResponse:
    # The Connect error shape, as the RPCs answer (the console reads one kind of error).
    return JSONResponse(
        {
            "code": CONNECT_CODES[error.code].value,
            "message": error.message,
            "reason": error.reason,
        },
        status_code=status,
    )


class Console:
    """The console's routes, over the process's gate and the RPCs its port serves."""

    def __init__(
        self,
        settings: HttpSettings,
        *,
        gate: AuthGate | None,
        auth_mode: str,
        methods: Sequence[str],
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.auth_mode = auth_mode
        self.methods = sorted(methods)

    def _identity(self, request: Request) -> Identity:
        assert self.gate is not None
        metadata = [(key.lower(), value) for key, value in request.headers.items()]
        client = request.client
        peer = grpc_peer(f"{client.host}:{client.port}" if client else None)
        return self.gate.authenticate_metadata(metadata, peer)

    async def session(self, request: Request) -> Response:
        body: dict[str, Any] = {
            "auth": self.auth_mode,
            "actions": self.settings.console_actions,
            "services": sorted({m.split("/")[1] for m in self.methods}),
            "methods": self.methods,
        }
        if self.gate is None:
            body["identity"] = {"subject": "", "namespaces": [], "all": True}
            return JSONResponse(body)
        try:
            identity = self._identity(request)
        except DomainError as error:
            body["identity"] = None
            body["identity_error"] = {"reason": error.reason, "message": error.message}
            return JSONResponse(body)
        body["identity"] = {
            "subject": identity.subject,
            "namespaces": sorted(n for n in identity.namespaces if n != ALL),
            "all": ALL in identity.namespaces,
        }
        return JSONResponse(body)

    async def metrics(self, request: Request) -> Response:
        if self.gate is not None:
            try:
                self._identity(request)
            except DomainError as error:
                return _error(error, 401)
        return JSONResponse(
            {
                "time": time.time(),
                "values": charted_values(),
            },
            headers={"cache-control": "no-store"},
        )

    def app(self) -> ASGIApp:
        return SecurityHeaders(
            Starlette(
                routes=[
                    Route("/console/api/session", self.session, methods=["GET"]),
                    Route("/console/api/metrics", self.metrics, methods=["GET"]),
                    Mount("/", app=StaticFiles(directory=STATIC, html=True)),
                ]
            )
        )


# The console's pages run only the console's own scripts and styles, fetch only from
# this origin, and load in no frame: injected markup (transcripts and memories are
# untrusted text) could run no script and send nothing anywhere even if it got in.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response of the console (pages, scripts, JSON)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + SECURITY_HEADERS}
            await send(message)

        await self.app(scope, receive, send_with_headers)
