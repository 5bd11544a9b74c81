"""Who is calling: the Identity a call carries, how namespaces are granted, and the
identity errors."""

from __future__ import annotations

import contextvars
import hmac
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common.errors import Code, DomainError
from services.common.validation import NAMESPACE_PATTERN

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
