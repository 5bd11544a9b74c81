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

from services.common.auth.bearer import JwtAuthenticator
from services.common.auth.gate import (
    AuthGate,
    authorize,
    make_authenticator,
    outbound_identity_metadata,
    service_identity,
)
from services.common.auth.identity import (
    ALL,
    INTERNAL_HEADER,
    ON_BEHALF_HEADER,
    XFCC_HEADER,
    Authenticator,
    Identity,
    InternalCredential,
    Metadata,
    granted_namespaces,
    header,
    identity_var,
    permission_denied,
    unauthenticated,
)
from services.common.auth.mesh import (
    MeshAuthenticator,
    XfccError,
    parse_xfcc,
    xfcc_client,
)
from services.common.auth.settings import AuthSettings, check_exposure
from services.common.auth.tls import channel_credentials, server_credentials

__all__ = [
    "ALL",
    "INTERNAL_HEADER",
    "ON_BEHALF_HEADER",
    "XFCC_HEADER",
    "AuthGate",
    "AuthSettings",
    "Authenticator",
    "Identity",
    "InternalCredential",
    "JwtAuthenticator",
    "MeshAuthenticator",
    "Metadata",
    "XfccError",
    "authorize",
    "channel_credentials",
    "check_exposure",
    "granted_namespaces",
    "header",
    "identity_var",
    "make_authenticator",
    "outbound_identity_metadata",
    "parse_xfcc",
    "permission_denied",
    "server_credentials",
    "service_identity",
    "unauthenticated",
    "xfcc_client",
]
