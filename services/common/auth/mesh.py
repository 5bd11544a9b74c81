"""Service-mesh identities: x-forwarded-client-cert parsed per Envoy's grammar, the
identities file, and the all-in-one server's internal credential."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from services.common.auth.identity import (
    _LOOPBACK_PEERS,
    ALL,
    INTERNAL_HEADER,
    ON_BEHALF_HEADER,
    XFCC_HEADER,
    Identity,
    Metadata,
    _asserted,
    granted_namespaces,
    header,
    permission_denied,
    unauthenticated,
)
from services.common.auth.settings import AuthSettings
from services.common.settings import (
    SettingsError,
)

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
