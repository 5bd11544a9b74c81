"""The gate every call passes: authenticate from metadata, authorize the namespace, and
carry the identity to peer services."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc

from services.common.auth.bearer import JwtAuthenticator
from services.common.auth.identity import (
    ON_BEHALF_HEADER,
    Authenticator,
    Identity,
    Metadata,
    identity_var,
    permission_denied,
    unauthenticated,
)
from services.common.auth.mesh import MeshAuthenticator
from services.common.auth.settings import AuthSettings
from services.common.errors import DomainError, invalid_argument
from services.common.settings import (
    SettingsError,
)

log = logging.getLogger("services.common.auth")


def make_authenticator(settings: AuthSettings) -> Authenticator | None:
    """The configured authenticator (None: authentication off)."""
    if settings.mode == "jwt":
        return JwtAuthenticator(settings)
    if settings.mode == "mesh":
        return MeshAuthenticator(settings)
    return None


# -- the gate ----------------------------------------------------------------------


def authorize(request: Any, identity: Identity) -> None:
    """Fill an empty namespace from the identity, refuse one it does not grant."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None or "namespace" not in descriptor.fields_by_name:
        return
    namespace = request.namespace
    if not namespace:
        single = identity.single_namespace()
        if single is None:
            raise invalid_argument(
                "INVALID_NAMESPACE",
                "namespace is required (the caller's identity grants more than one)",
                field="namespace",
            )
        request.namespace = single
    elif not identity.grants(namespace):
        raise permission_denied()


class AuthGate:
    """Authenticates and authorizes every call to a `runifold.` service.

    The guard (services/common/interceptors.py) asks `authenticate` with the
    call's metadata before it reads the request, so an unauthenticated caller
    never costs a read or a parse, then `admit` with the parsed request. Health and
    reflection stay open (probes and tooling). Errors are DomainErrors, mapped
    to statuses by the guard.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    def applies(self, method: str) -> bool:
        return method.startswith("/runifold.")

    def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        return self.authenticate_metadata(context.invocation_metadata() or (), context.peer())

    def authenticate_metadata(self, metadata: Metadata, peer: str | None) -> Identity:
        """The caller's identity from a call's metadata and peer (gRPC's, or the HTTP
        port's headers and client address in gRPC's peer form)."""
        try:
            return self.authenticator.authenticate(metadata, peer or "")
        except DomainError:
            raise
        except Exception as exc:
            # Credentials are hostile input: a library that raises on one it cannot
            # handle must not turn it into INTERNAL (anyone could push the server-error
            # alert over its threshold). Logged, so that a bug here is still seen.
            log.warning("authentication failed unexpectedly", exc_info=exc)
            raise unauthenticated() from None

    def admit(self, request: Any, identity: Identity) -> None:
        authorize(request, identity)
        identity_var.set(identity)


def service_identity(settings: AuthSettings, namespace: str) -> Identity | None:
    """The identity a service uses for work no caller asked for in the moment (a
    background summary job), acting for one namespace.

    jwt: the service's own token (RUNIFOLD_SERVICE_TOKEN or, re-read on every use so
    that a rotated, mounted token is picked up, RUNIFOLD_SERVICE_TOKEN_FILE); it must
    grant the namespace (usually "*"). mesh: the service's own sidecar identity,
    asserting the namespace on behalf of the job (the callee must mark it delegate).
    none: no identity.
    """
    if settings.mode == "none":
        return None
    token = settings.service_token
    if settings.service_token_file:
        token = Path(settings.service_token_file).read_text().strip()
    if settings.mode == "jwt" and not token:
        raise SettingsError(
            "background work under RUNIFOLD_AUTH=jwt needs a service token: set "
            "RUNIFOLD_SERVICE_TOKEN_FILE (or RUNIFOLD_SERVICE_TOKEN)"
        )
    return Identity(
        subject="runifold-service",
        namespaces=frozenset({namespace}),
        token=token or None,
        delegate=True,
    )


def outbound_identity_metadata() -> tuple[tuple[str, str], ...]:
    """Metadata that carries the current caller's identity to a peer service."""
    identity = identity_var.get()
    if identity is None:
        return ()
    if identity.token is not None:
        return (("authorization", f"Bearer {identity.token}"),)
    return ((ON_BEHALF_HEADER, ",".join(sorted(identity.namespaces))),)
