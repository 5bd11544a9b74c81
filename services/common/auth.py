"""Identity, namespace authorization and transport security, for every service.

Every call to a Runifold service is authenticated from its metadata alone,
before its request is read off the stream (the guard in
services/common/interceptors.py asks `AuthGate` first), and its `namespace` is
checked against what the caller's identity grants:

- `jwt`: a bearer token checked with PyJWT (HS256 shared secret, or RS256 /
  ES256 public keys from a JWKS file, the key chosen by `kid` and by the key
  type the token's `alg` needs; `exp` required, `iss` and `aud` checked when
  configured). The granted namespaces come from a configurable claim.
- `mesh`: the identity a service-mesh sidecar asserts in
  `x-forwarded-client-cert` (the one `URI` of the element the sidecar
  appended), trusted only when configured and only from a loopback peer (the
  sidecar); a JSON file maps identities to namespaces. A header from any
  other peer is ignored.
- `none`: development only; a server refuses to listen on a non-loopback
  address in this mode unless RUNIFOLD_ALLOW_INSECURE=1.

Namespaces are granted in one shape only, wherever they come from (a JWT claim,
the identities file, `x-runifold-on-behalf-of`): a list of namespaces, or one
string that is itself a namespace; "*" grants every namespace. Anything else is
UNAUTHENTICATED (or, in the identities file, a configuration error): a string
such as "tenant-2 *" is never split into grants. A header that counts for
identity and is sent more than once in one call is UNAUTHENTICATED too.

Every request message of the Runifold services has a `namespace` field: when
it is empty it is filled with the caller's single granted namespace; when it
names a namespace the caller is not granted the call is PERMISSION_DENIED
before any handler runs (so nothing about the resource is revealed).

Service-to-service calls carry the caller's identity: the bearer token is
forwarded as is (each service verifies it again); under `mesh` the calling
service asserts the caller's namespaces in `x-runifold-on-behalf-of`, which a
callee accepts only from an identity marked `"delegate": true`. The all-in-one
server under `mesh` calls itself with no sidecar in between, so it mints a
secret at start (`InternalCredential`, held in memory only) that its own peer
channels send and that only this process accepts, as a delegate.
"""

from __future__ import annotations

import contextvars
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import jwt

from services.common.errors import Code, DomainError, invalid_argument
from services.common.settings import (
    Env,
    SettingsError,
    env_bool,
    env_choice,
    env_int,
    env_str,
    is_loopback,
)
from services.common.validation import NAMESPACE_PATTERN

log = logging.getLogger(__name__)

ALL = "*"
ON_BEHALF_HEADER = "x-runifold-on-behalf-of"
XFCC_HEADER = "x-forwarded-client-cert"
INTERNAL_HEADER = "x-runifold-internal"
_LOOPBACK_PEERS = ("ipv4:127.", "ipv6:[::1]", "unix:")

# A call's metadata as grpc gives it: (key, value) pairs, keys lower-case, a key
# possibly more than once; values of "-bin" keys are bytes.
Metadata = Collection[tuple[str, str | bytes]]


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
    # Set by the server bootstrap of an all-in-one server under mesh, never from the
    # environment: the secret with which it authenticates its calls to itself.
    internal: InternalCredential | None = field(default=None, repr=False, compare=False)

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

    def authenticate(self, metadata: Metadata, peer: str) -> Identity:
        """The caller's identity."""


def header(metadata: Metadata, name: str) -> str | None:
    """The value of the header `name` (None when absent). A header that decides identity
    and is sent more than once is UNAUTHENTICATED: which copy counts would be a guess,
    and a proxy that appends to one copy leaves a forged second one beside it."""
    found: str | None = None
    seen = False
    for key, value in metadata:
        if key != name:
            continue
        if seen or not isinstance(value, str):
            raise unauthenticated(f"{name} must be sent once, as text")
        seen, found = True, value
    return found


def granted_namespaces(value: object) -> frozenset[str] | None:
    """The namespaces a grant names, in the documented shape only: a list of strings each
    a namespace (or "*"), or one string that is itself a namespace (or exactly "*").
    None for anything else: a string is never split ("tenant-2 *" grants nothing)."""
    items: list[Any]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        if not isinstance(item, str) or not (item == ALL or NAMESPACE_PATTERN.fullmatch(item)):
            return None
    return frozenset(items)


def _asserted(on_behalf: str | None) -> frozenset[str]:
    """The namespaces of an `x-runifold-on-behalf-of` value: namespaces (or "*")
    separated by commas, as `outbound_identity_metadata` writes them."""
    if on_behalf is None:
        raise unauthenticated(f"{ON_BEHALF_HEADER} is required")
    namespaces = granted_namespaces(on_behalf.split(","))
    if namespaces is None:
        raise unauthenticated(f"{ON_BEHALF_HEADER} is not a list of namespaces")
    return namespaces


# The JWKS algorithms accepted, each tied to the one key type it verifies with
# (PyJWK names a key's algorithm from its "alg", or from "kty" and "crv").
_JWKS_ALGORITHMS = frozenset({"RS256", "ES256"})


@dataclass(frozen=True)
class _VerificationKey:
    kid: str | None
    algorithm: str
    key: Any


class JwtAuthenticator:
    """Bearer JWTs (HS256 secret or RS256/ES256 keys from a JWKS file)."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._keys: list[_VerificationKey] | None = None
        if settings.jwt_jwks_file:
            self._keys = _jwks_keys(settings.jwt_jwks_file)

    def _key(self, token: str) -> tuple[Any, str]:
        """The key and the one algorithm to verify `token` with: the key named by its
        `kid` (or, without a kid, the only key) whose type the token's `alg` needs.
        A token whose alg does not fit the key is refused here, before PyJWT would
        raise on the mismatch (a TypeError, not a PyJWTError)."""
        unverified = jwt.get_unverified_header(token)
        algorithm, kid = unverified.get("alg"), unverified.get("kid")
        if self._keys is None:
            return self.settings.jwt_secret, "HS256"
        if algorithm not in _JWKS_ALGORITHMS:
            raise unauthenticated()
        fitting = [
            key
            for key in self._keys
            if key.algorithm == algorithm and (kid is None or key.kid == kid)
        ]
        if len(fitting) != 1:  # none, or no kid to choose between several
            raise unauthenticated()
        return fitting[0].key, algorithm

    def authenticate(self, metadata: Metadata, peer: str) -> Identity:
        scheme, _, token = (header(metadata, "authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated()
        settings = self.settings
        try:
            key, algorithm = self._key(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
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
        namespaces = granted_namespaces(claims.get(settings.jwt_namespaces_claim))
        if namespaces is None:
            raise unauthenticated(
                f"the {settings.jwt_namespaces_claim} claim is not a namespace list"
            )
        return Identity(subject=str(claims.get("sub", "")), namespaces=namespaces, token=token)


def _jwks_keys(path: str) -> list[_VerificationKey]:
    try:
        keys = jwt.PyJWKSet.from_json(Path(path).read_text()).keys
    except (jwt.PyJWKSetError, jwt.PyJWKError, ValueError) as exc:
        raise SettingsError(f"RUNIFOLD_JWT_JWKS_FILE holds no usable key: {exc}") from None
    usable = [
        _VerificationKey(key.key_id, key.algorithm_name, key.key)
        for key in keys
        if key.algorithm_name in _JWKS_ALGORITHMS
    ]
    if not usable:
        raise SettingsError("RUNIFOLD_JWT_JWKS_FILE holds no RS256 (RSA) or ES256 (P-256) key")
    return usable


# -- x-forwarded-client-cert -------------------------------------------------------
#
# No well-kept Python library parses XFCC (PyPI has nothing beyond a first FastAPI-only
# release), so this follows Envoy's grammar by hand: its header documentation and its
# own parser (source/extensions/formatter/xfcc_value): elements separated by ",", the
# key=value pairs of an element by ";", keys case-insensitive, a value optionally
# double-quoted, with \" and \\ escapes inside the quotes, where "," ";" and "=" are
# data. A value that is not quoted runs to the next "," or ";" and may not hold a quote.

_XFCC_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_OWS = " \t"


class XfccError(ValueError):
    """An x-forwarded-client-cert value outside Envoy's grammar."""


def parse_xfcc(value: str) -> list[list[tuple[str, str]]]:
    """The elements of an XFCC value, oldest first, each a list of (key, value) pairs
    with keys lower-cased and values unquoted and unescaped."""
    elements: list[list[tuple[str, str]]] = []
    pairs: list[tuple[str, str]] = []
    i, end = 0, len(value)
    while True:
        equals = value.find("=", i)
        if equals < 0:
            raise XfccError("a pair without '='")
        key = value[i:equals].strip(_OWS)
        if not _XFCC_KEY.fullmatch(key):
            raise XfccError("an empty or malformed key")
        i = equals + 1
        while i < end and value[i] in _OWS:
            i += 1
        if i < end and value[i] == '"':
            text, i = _quoted(value, i + 1)
            while i < end and value[i] in _OWS:
                i += 1
        else:
            start = i
            while i < end and value[i] not in ',;"':
                i += 1
            if i < end and value[i] == '"':
                raise XfccError("a quote inside an unquoted value")
            text = value[start:i].strip(_OWS)
        pairs.append((key.lower(), text))
        if i == end:
            elements.append(pairs)
            return elements
        if value[i] == ",":
            elements.append(pairs)
            pairs = []
        elif value[i] != ";":
            raise XfccError("text after a quoted value")
        i += 1


def _quoted(value: str, i: int) -> tuple[str, int]:
    """The text of a quoted value whose opening quote is just before `i`, and the
    index after its closing quote."""
    chars: list[str] = []
    end = len(value)
    while i < end:
        char = value[i]
        if char == "\\" and i + 1 < end and value[i + 1] in '"\\':
            chars.append(value[i + 1])
            i += 2
        elif char == '"':
            return "".join(chars), i + 1
        else:
            chars.append(char)
            i += 1
    raise XfccError("an unmatched quote")


def xfcc_client(value: str) -> str:
    """The identity of the immediate client: the one `URI` of the last element, the one
    the local sidecar appended. Envoy writes `By` (its own URI SAN) and `Hash` (the
    client certificate's digest) first in every element it makes, so a last element
    without them (the tail of a value Envoy copied unquoted, such as a DNS SAN
    "a,URI=spiffe://...") was not made by the sidecar; an element with several URIs
    is not one SPIFFE identity."""
    last = parse_xfcc(value)[-1]
    keys = [key for key, _ in last]
    uris = [text for key, text in last if key == "uri"]
    if keys.count("hash") != 1 or "by" not in keys:
        raise XfccError("the last element was not written by a sidecar")
    if len(uris) != 1 or not uris[0]:
        raise XfccError("the last element does not hold exactly one URI")
    return uris[0]


@dataclass(frozen=True)
class InternalCredential:
    """The secret with which an all-in-one server authenticates its calls to itself.

    Minted at start, held in memory only, sent (in `x-runifold-internal`) only on
    the channels to this server's own address, compared in constant time.
    """

    secret: str = field(repr=False)
    address: str = ""

    @classmethod
    def mint(cls) -> InternalCredential:
        return cls(secrets.token_urlsafe(32))

    def accepts(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.secret.encode())

    def metadata(self) -> tuple[str, str]:
        return (INTERNAL_HEADER, self.secret)


@dataclass(frozen=True)
class _MeshGrant:
    namespaces: frozenset[str]
    delegate: bool = False


def _mesh_grants(path: str) -> dict[str, _MeshGrant]:
    """The identities file: {"<spiffe id>": {"namespaces": [...], "delegate": bool}}."""
    name = "RUNIFOLD_MESH_IDENTITIES_FILE"
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{name} is not a readable JSON file: {exc}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"{name} must hold a JSON object of identities")
    grants: dict[str, _MeshGrant] = {}
    for identity, grant in document.items():
        shape = '{"namespaces": [...], "delegate": true|false}'
        if (
            not isinstance(grant, dict)
            or not set(grant) <= {"namespaces", "delegate"}
            or not isinstance(grant.get("delegate", False), bool)
        ):
            raise SettingsError(f"{name}: {identity!r} must be {shape}")
        namespaces = granted_namespaces(grant.get("namespaces"))
        if namespaces is None:
            raise SettingsError(
                f"{name}: the namespaces of {identity!r} must be a list of namespaces "
                '(1..128 characters of [A-Za-z0-9_.-]) or "*"'
            )
        grants[identity] = _MeshGrant(namespaces, grant.get("delegate", False))
    return grants


class MeshAuthenticator:
    """SPIFFE identities asserted by a trusted sidecar in x-forwarded-client-cert."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.grants = _mesh_grants(settings.mesh_identities_file)
        self.internal = settings.internal

    def authenticate(self, metadata: Metadata, peer: str) -> Identity:
        internal = header(metadata, INTERNAL_HEADER)
        if internal is not None:
            return self._internal_caller(internal, metadata)
        xfcc = header(metadata, XFCC_HEADER)
        trusted = self.settings.mesh_trust_xfcc and peer.startswith(_LOOPBACK_PEERS)
        if xfcc is None or not trusted:
            # A header from a peer that is not the local sidecar is ignored.
            raise unauthenticated()
        try:
            subject = xfcc_client(xfcc)
        except XfccError:
            raise unauthenticated() from None
        grant = self.grants.get(subject)
        if grant is None:
            raise unauthenticated()
        namespaces = grant.namespaces
        if grant.delegate:
            on_behalf = header(metadata, ON_BEHALF_HEADER)
            if on_behalf is not None:
                asserted = _asserted(on_behalf)
                if ALL not in namespaces and not asserted <= namespaces:
                    raise permission_denied()
                namespaces = asserted
        return Identity(subject=subject, namespaces=namespaces, delegate=grant.delegate)

    def _internal_caller(self, presented: str, metadata: Metadata) -> Identity:
        """This very process (an all-in-one server) calling itself for its caller."""
        if self.internal is None or not self.internal.accepts(presented):
            raise unauthenticated()
        return Identity(
            subject="runifold-internal",
            namespaces=_asserted(header(metadata, ON_BEHALF_HEADER)),
            delegate=True,
        )


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
        metadata: Metadata = context.invocation_metadata() or ()
        try:
            return self.authenticator.authenticate(metadata, context.peer() or "")
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
