"""Identity, namespace authorization and transport security, for every service.

One interceptor authenticates each call to a Runifold service and checks its
`namespace` against what the caller's identity grants:

- `jwt`: a bearer token checked with PyJWT (HS256 shared secret, or RS256 /
  ES256 public keys from a JWKS file; `exp` required, `iss` and `aud` checked
  when configured). The granted namespaces come from a configurable claim (a
  list, or a space/comma separated string; "*" grants every namespace).
- `mesh`: the identity a service-mesh sidecar asserts in
  `x-forwarded-client-cert` (its `URI=spiffe://...` element), trusted only when
  configured and only from a loopback peer (the sidecar); a JSON file maps
  identities to namespaces. A forged header from any other peer is ignored.
- `none`: development only; a server refuses to listen on a non-loopback
  address in this mode unless RUNIFOLD_ALLOW_INSECURE=1.

Every request message of the Runifold services has a `namespace` field: when
it is empty it is filled with the caller's single granted namespace; when it
names a namespace the caller is not granted the call is PERMISSION_DENIED
before any handler runs (so nothing about the resource is revealed).

Service-to-service calls carry the caller's identity: the bearer token is
forwarded as is (each service verifies it again); under `mesh` the calling
service asserts the caller's namespaces in `x-runifold-on-behalf-of`, which a
callee accepts only from an identity marked `"delegate": true`.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import jwt

from services.common.errors import Code, DomainError, invalid_argument
from services.common.settings import Env, SettingsError, env_bool, env_choice, env_int, env_str
from services.common.wrapping import WrappingInterceptor

ALL = "*"
ON_BEHALF_HEADER = "x-runifold-on-behalf-of"
XFCC_HEADER = "x-forwarded-client-cert"
_SPIFFE = re.compile(r"URI=(spiffe://[^;,\"]+)")
_LOOPBACK_PEERS = ("ipv4:127.", "ipv6:[::1]", "unix:")


@dataclass(frozen=True)
class Identity:
    """Who is calling and which namespaces they may use."""

    subject: str
    namespaces: frozenset[str]
    token: str | None = None  # the bearer token, forwarded to peer services
    delegate: bool = False  # may assert namespaces on behalf of its own callers

    def grants(self, namespace: str) -> bool:
        return ALL in self.namespaces or namespace in self.namespaces

    def single_namespace(self) -> str | None:
        if len(self.namespaces) == 1 and ALL not in self.namespaces:
            return next(iter(self.namespaces))
        return None


identity_var: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "identity", default=None
)


def unauthenticated(message: str = "missing or invalid credentials") -> DomainError:
    """UNAUTHENTICATED with a generic reason (the detail goes to the log only)."""
    return DomainError(Code.UNAUTHENTICATED, "UNAUTHENTICATED", message)


def permission_denied() -> DomainError:
    """The caller's identity does not grant the namespace."""
    return DomainError(
        Code.PERMISSION_DENIED,
        "NAMESPACE_NOT_GRANTED",
        "the caller's identity does not grant this namespace",
    )


# -- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class AuthSettings:
    """Authentication and TLS configuration (RUNIFOLD_AUTH_*, RUNIFOLD_TLS_*)."""

    mode: str = "none"
    allow_insecure: bool = False
    jwt_secret: str = ""
    jwt_jwks_file: str = ""
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_namespaces_claim: str = "namespaces"
    jwt_leeway_s: int = 30
    mesh_trust_xfcc: bool = False
    mesh_identities_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    tls_ca_file: str = ""
    tls_client_cert_file: str = ""
    tls_client_key_file: str = ""
    tls_server_name: str = ""
    service_token: str = ""
    service_token_file: str = ""

    @classmethod
    def from_env(cls, env: Env | None = None) -> AuthSettings:
        env = os.environ if env is None else env
        settings = cls(
            mode=env_choice(env, "RUNIFOLD_AUTH", "none", ("none", "jwt", "mesh")),
            allow_insecure=env_bool(env, "RUNIFOLD_ALLOW_INSECURE", False),
            jwt_secret=env.get("RUNIFOLD_JWT_SECRET", ""),
            jwt_jwks_file=env.get("RUNIFOLD_JWT_JWKS_FILE", ""),
            jwt_issuer=env.get("RUNIFOLD_JWT_ISSUER", ""),
            jwt_audience=env.get("RUNIFOLD_JWT_AUDIENCE", ""),
            jwt_namespaces_claim=env_str(env, "RUNIFOLD_JWT_NAMESPACES_CLAIM", "namespaces"),
            jwt_leeway_s=env_int(env, "RUNIFOLD_JWT_LEEWAY_S", 30, minimum=0, maximum=600),
            mesh_trust_xfcc=env_bool(env, "RUNIFOLD_MESH_TRUST_XFCC", False),
            mesh_identities_file=env.get("RUNIFOLD_MESH_IDENTITIES_FILE", ""),
            tls_cert_file=env.get("RUNIFOLD_TLS_CERT_FILE", ""),
            tls_key_file=env.get("RUNIFOLD_TLS_KEY_FILE", ""),
            tls_client_ca_file=env.get("RUNIFOLD_TLS_CLIENT_CA_FILE", ""),
            tls_ca_file=env.get("RUNIFOLD_TLS_CA_FILE", ""),
            tls_client_cert_file=env.get("RUNIFOLD_TLS_CLIENT_CERT_FILE", ""),
            tls_client_key_file=env.get("RUNIFOLD_TLS_CLIENT_KEY_FILE", ""),
            tls_server_name=env.get("RUNIFOLD_TLS_SERVER_NAME", ""),
            service_token=env.get("RUNIFOLD_SERVICE_TOKEN", ""),
            service_token_file=env.get("RUNIFOLD_SERVICE_TOKEN_FILE", ""),
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Fail at start on an incomplete configuration, naming the variable."""
        if self.mode == "jwt" and not (self.jwt_secret or self.jwt_jwks_file):
            raise SettingsError(
                "RUNIFOLD_AUTH=jwt needs RUNIFOLD_JWT_SECRET or RUNIFOLD_JWT_JWKS_FILE"
            )
        if self.jwt_secret and len(self.jwt_secret) < 32:
            raise SettingsError("RUNIFOLD_JWT_SECRET must be at least 32 characters")
        if self.mode == "mesh" and not self.mesh_identities_file:
            raise SettingsError("RUNIFOLD_AUTH=mesh needs RUNIFOLD_MESH_IDENTITIES_FILE")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise SettingsError("RUNIFOLD_TLS_CERT_FILE and RUNIFOLD_TLS_KEY_FILE go together")
        if bool(self.tls_client_cert_file) != bool(self.tls_client_key_file):
            raise SettingsError(
                "RUNIFOLD_TLS_CLIENT_CERT_FILE and RUNIFOLD_TLS_CLIENT_KEY_FILE go together"
            )
        for name, value in (
            ("RUNIFOLD_JWT_JWKS_FILE", self.jwt_jwks_file),
            ("RUNIFOLD_MESH_IDENTITIES_FILE", self.mesh_identities_file),
            ("RUNIFOLD_TLS_CERT_FILE", self.tls_cert_file),
            ("RUNIFOLD_TLS_KEY_FILE", self.tls_key_file),
            ("RUNIFOLD_TLS_CLIENT_CA_FILE", self.tls_client_ca_file),
            ("RUNIFOLD_TLS_CA_FILE", self.tls_ca_file),
            ("RUNIFOLD_TLS_CLIENT_CERT_FILE", self.tls_client_cert_file),
            ("RUNIFOLD_TLS_CLIENT_KEY_FILE", self.tls_client_key_file),
            ("RUNIFOLD_SERVICE_TOKEN_FILE", self.service_token_file),
        ):
            if value and not Path(value).is_file():
                raise SettingsError(f"{name} names a file that does not exist: {value}")


def is_loopback(address: str) -> bool:
    """True for a host:port on the loopback interface."""
    host = address.rpartition(":")[0].strip("[]")
    return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")


def check_exposure(settings: AuthSettings, listen_address: str) -> str | None:
    """Refuse an unauthenticated, non-loopback listener; return a warning when allowed."""
    if settings.mode != "none" or is_loopback(listen_address):
        return None
    if not settings.allow_insecure:
        raise SettingsError(
            f"refusing to listen on {listen_address} with RUNIFOLD_AUTH=none: set RUNIFOLD_AUTH "
            "(jwt or mesh), or RUNIFOLD_ALLOW_INSECURE=1 to accept unauthenticated callers"
        )
    return (
        f"WARNING: listening on {listen_address} WITHOUT authentication "
        "(RUNIFOLD_ALLOW_INSECURE=1): any caller can use any namespace"
    )


# -- authenticators -------------------------------------------------------------


class Authenticator(Protocol):
    """Turns a call's metadata and peer into an Identity (or raises UNAUTHENTICATED)."""

    def authenticate(self, metadata: Mapping[str, str], peer: str) -> Identity:
        """The caller's identity."""


def _namespaces(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(part for part in re.split(r"[\s,]+", value) if part)
    if isinstance(value, Sequence):
        return frozenset(str(part) for part in value if isinstance(part, str) and part)
    return frozenset()


class JwtAuthenticator:
    """Bearer JWTs (HS256 secret or RS256/ES256 keys from a JWKS file)."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._jwks: jwt.PyJWKSet | None = None
        if settings.jwt_jwks_file:
            self._jwks = jwt.PyJWKSet.from_json(Path(settings.jwt_jwks_file).read_text())

    def _key(self, token: str) -> tuple[Any, list[str]]:
        if self._jwks is None:
            return self.settings.jwt_secret, ["HS256"]
        kid = jwt.get_unverified_header(token).get("kid")
        for key in self._jwks.keys:
            if kid is None or key.key_id == kid:
                return key.key, ["RS256", "ES256"]
        raise unauthenticated()

    def authenticate(self, metadata: Mapping[str, str], peer: str) -> Identity:
        header = metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated()
        settings = self.settings
        try:
            key, algorithms = self._key(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience=settings.jwt_audience or None,
                issuer=settings.jwt_issuer or None,
                leeway=settings.jwt_leeway_s,
                options={
                    "require": ["exp"]
                    + (["aud"] if settings.jwt_audience else [])
                    + (["iss"] if settings.jwt_issuer else []),
                    "verify_aud": bool(settings.jwt_audience),
                },
            )
        except (jwt.PyJWTError, ValueError):
            raise unauthenticated() from None
        return Identity(
            subject=str(claims.get("sub", "")),
            namespaces=_namespaces(claims.get(settings.jwt_namespaces_claim)),
            token=token,
        )


@dataclass(frozen=True)
class _MeshGrant:
    namespaces: frozenset[str]
    delegate: bool = False


@dataclass
class MeshAuthenticator:
    """SPIFFE identities asserted by a trusted sidecar in x-forwarded-client-cert."""

    settings: AuthSettings
    grants: dict[str, _MeshGrant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        document = json.loads(Path(self.settings.mesh_identities_file).read_text())
        for spiffe_id, grant in document.items():
            self.grants[spiffe_id] = _MeshGrant(
                _namespaces(grant.get("namespaces", [])), bool(grant.get("delegate", False))
            )

    def authenticate(self, metadata: Mapping[str, str], peer: str) -> Identity:
        header = metadata.get(XFCC_HEADER, "")
        trusted = self.settings.mesh_trust_xfcc and peer.startswith(_LOOPBACK_PEERS)
        if not header or not trusted:
            # A header from a peer that is not the local sidecar is ignored.
            raise unauthenticated()
        found = _SPIFFE.findall(header.split(",")[-1])  # the element for the immediate client
        grant = self.grants.get(found[-1]) if found else None
        if grant is None:
            raise unauthenticated()
        namespaces = grant.namespaces
        on_behalf = metadata.get(ON_BEHALF_HEADER)
        if on_behalf is not None and grant.delegate:
            asserted = _namespaces(on_behalf)
            if ALL not in namespaces and not asserted <= namespaces:
                raise permission_denied()
            namespaces = asserted
        return Identity(subject=found[-1], namespaces=namespaces, delegate=grant.delegate)


def make_authenticator(settings: AuthSettings) -> Authenticator | None:
    """The configured authenticator (None: authentication off)."""
    if settings.mode == "jwt":
        return JwtAuthenticator(settings)
    if settings.mode == "mesh":
        return MeshAuthenticator(settings)
    return None


# -- the interceptor ---------------------------------------------------------------


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


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    return {
        key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)
    }


class AuthInterceptor(WrappingInterceptor):
    """Authenticates and authorizes every call to a `runifold.` service.

    Health and reflection stay open (probes and tooling); errors raised here are
    DomainErrors, mapped to statuses by the outer ServiceInterceptor.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        super().__init__()
        self.authenticator = authenticator

    def _identity(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        return self.authenticator.authenticate(_metadata(context), context.peer() or "")

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if not method.startswith("/runifold."):
            return handler
        guard = self

        if handler.unary_unary is not None:
            inner: Any = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                identity = guard._identity(context)
                authorize(request, identity)
                identity_var.set(identity)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            stream_inner: Any = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                identity = guard._identity(context)
                authorize(request, identity)
                identity_var.set(identity)
                async for item in stream_inner(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


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


# -- TLS ---------------------------------------------------------------------------------


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def server_credentials(settings: AuthSettings) -> grpc.ServerCredentials | None:
    """TLS (mutual when a client CA is configured) for the listener, or None."""
    if not settings.tls_cert_file:
        return None
    key = Path(settings.tls_key_file).read_bytes()
    cert = Path(settings.tls_cert_file).read_bytes()
    client_ca = _read(settings.tls_client_ca_file)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def channel_credentials(settings: AuthSettings) -> grpc.ChannelCredentials | None:
    """TLS for calls to peer services (with a client certificate for mTLS), or None."""
    if not settings.tls_ca_file and not settings.tls_client_cert_file:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(settings.tls_ca_file),
        private_key=_read(settings.tls_client_key_file),
        certificate_chain=_read(settings.tls_client_cert_file),
    )
