"""Authenticators and the exposure rule, without a server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common.auth import (
    AuthSettings,
    Identity,
    InternalCredential,
    JwtAuthenticator,
    MeshAuthenticator,
    XfccError,
    authorize,
    check_exposure,
    parse_xfcc,
)
from services.common.errors import Code, DomainError
from services.common.settings import SettingsError

SECRET = "s" * 40


def hs256(claims: dict[str, object], secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_by_hand(claims: dict[str, object], secret: bytes, *, kid: str) -> str:
    """An HS256 JWT signed with any bytes as the secret, PEM keys included."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = _b64url(json.dumps(claims).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


def settings(**kw: object) -> AuthSettings:
    base: dict[str, object] = {
        "mode": "jwt",
        "jwt_secret": SECRET,
        "jwt_audience": "runifold",
        "jwt_issuer": "https://issuer.example",
    }
    base.update(kw)
    return AuthSettings(**base)  # type: ignore[arg-type]


def good(**kw: object) -> dict[str, object]:
    claims: dict[str, object] = {
        "sub": "app-1",
        "aud": "runifold",
        "iss": "https://issuer.example",
        "exp": time.time() + 60,
        "namespaces": ["tenant-a"],
    }
    claims.update(kw)
    return claims


Headers = tuple[tuple[str, str], ...]


def bearer(token: str) -> Headers:
    return (("authorization", f"Bearer {token}"),)


def test_a_valid_token_grants_its_namespaces() -> None:
    identity = JwtAuthenticator(settings()).authenticate(
        bearer(hs256(good(namespaces=["tenant-a", "tenant-b"]))), "ipv4:10.0.0.1:1"
    )
    assert identity.namespaces == {"tenant-a", "tenant-b"} and identity.subject == "app-1"


@pytest.mark.parametrize(
    ("claim", "granted"),
    [
        (["tenant-a", "tenant-b"], {"tenant-a", "tenant-b"}),
        (["tenant-a", "*"], {"tenant-a", "*"}),
        ([], set()),
        ("tenant-a", {"tenant-a"}),
        ("*", {"*"}),
        ("a" * 128, {"a" * 128}),
    ],
)
def test_namespaces_claim_in_the_documented_shape(claim: object, granted: set[str]) -> None:
    identity = JwtAuthenticator(settings()).authenticate(bearer(hs256(good(namespaces=claim))), "")
    assert identity.namespaces == granted


@pytest.mark.parametrize(
    "claim",
    [
        "tenant-2 *",  # once split on spaces: every namespace
        "tenant-a,tenant-b",
        "tenant-a tenant-b",
        " tenant-a",
        "",
        "a" * 129,
        ["tenant-2 *"],
        ["tenant-a", ""],
        ["tenant-a", 7],
        [["tenant-a"]],
        {"tenant-a": True},
        7,
        None,
        "**",
    ],
)
def test_namespaces_claim_in_any_other_shape_is_unauthenticated(claim: object) -> None:
    with pytest.raises(DomainError) as caught:
        JwtAuthenticator(settings()).authenticate(bearer(hs256(good(namespaces=claim))), "")
    assert caught.value.code is Code.UNAUTHENTICATED


def test_a_token_without_the_namespaces_claim_is_unauthenticated() -> None:
    claims = {k: v for k, v in good().items() if k != "namespaces"}
    with pytest.raises(DomainError) as caught:
        JwtAuthenticator(settings()).authenticate(bearer(hs256(claims)), "")
    assert caught.value.code is Code.UNAUTHENTICATED


def test_two_authorization_headers_are_unauthenticated() -> None:
    mine, other = hs256(good()), hs256(good(namespaces=["tenant-b"]))
    with pytest.raises(DomainError) as caught:
        JwtAuthenticator(settings()).authenticate(bearer(mine) + bearer(other), "")
    assert caught.value.code is Code.UNAUTHENTICATED


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("authorization", "Basic abc"),),
        bearer("not-a-jwt"),
        bearer(hs256(good(exp=time.time() - 3600))),
        bearer(hs256(good(aud="someone-else"))),
        bearer(hs256(good(iss="https://evil.example"))),
        bearer(hs256(good(), secret="x" * 40)),
        bearer(hs256({k: v for k, v in good().items() if k != "exp"})),
        bearer(jwt.encode(good(), "", algorithm="none")),
    ],
)
def test_bad_tokens_are_unauthenticated(headers: Headers) -> None:
    with pytest.raises(DomainError) as caught:
        JwtAuthenticator(settings()).authenticate(headers, "ipv4:10.0.0.1:1")
    assert caught.value.code is Code.UNAUTHENTICATED


@pytest.mark.parametrize("curve", ["rsa", "ec"])
def test_jwks_public_keys(tmp_path: Path, curve: str) -> None:
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if curve == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        algorithm = "RS256"
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        algorithm = "ES256"
    public["kid"] = "k1"
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public]}))
    auth = JwtAuthenticator(settings(jwt_secret="", jwt_jwks_file=str(jwks)))
    token = jwt.encode(good(), key, algorithm=algorithm, headers={"kid": "k1"})
    assert auth.authenticate(bearer(token), "").namespaces == {"tenant-a"}
    # An HS256 token signed with the public key as a secret must not pass
    # (algorithm confusion). Built by hand: PyJWT refuses a PEM as an HMAC key.
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = hs256_by_hand(good(), pem, kid="k1")
    # The hand-built form is a valid token where HS256 is configured, so the
    # refusal below is about the key and algorithm, not a malformed token.
    well_formed = hs256_by_hand(good(), SECRET.encode(), kid="k1")
    assert JwtAuthenticator(settings()).authenticate(bearer(well_formed), "").subject == "app-1"
    with pytest.raises(DomainError) as caught:
        auth.authenticate(bearer(forged), "")
    assert caught.value.code is Code.UNAUTHENTICATED
    assert caught.value.reason == "UNAUTHENTICATED"


def _jwks(tmp_path: Path, *keys: tuple[str | None, dict[str, object]]) -> JwtAuthenticator:
    """An authenticator over a JWKS file of these (kid, public JWK) pairs."""
    listed = [{**jwk, **({"kid": kid} if kid else {})} for kid, jwk in keys]
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": listed}))
    return JwtAuthenticator(settings(jwt_secret="", jwt_jwks_file=str(path)))


def _public(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> dict[str, object]:
    if isinstance(key, rsa.RSAPrivateKey):
        return json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))  # type: ignore[no-any-return]
    return json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))  # type: ignore[no-any-return]


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


@pytest.mark.parametrize(
    ("algorithm", "signing_key", "jwks", "kid"),
    [
        # An ES256 token naming an RSA key: PyJWT raised TypeError (INTERNAL).
        ("ES256", EC_KEY, [("rsa-1", RSA_KEY)], "rsa-1"),
        # The same without a kid: the first key (RSA) was taken.
        ("ES256", EC_KEY, [("rsa-1", RSA_KEY)], None),
        ("RS256", RSA_KEY, [("ec-1", EC_KEY)], "ec-1"),
        ("RS256", RSA_KEY, [(None, EC_KEY)], None),
        # A kid that names no key, and no kid to choose between two keys of one type.
        ("ES256", EC_KEY, [("ec-1", EC_KEY)], "ec-2"),
        (
            "ES256",
            EC_KEY,
            [("ec-1", EC_KEY), ("ec-2", ec.generate_private_key(ec.SECP256R1()))],
            None,
        ),
    ],
)
def test_a_token_whose_key_does_not_fit_is_unauthenticated(
    tmp_path: Path,
    algorithm: str,
    signing_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    jwks: list[tuple[str | None, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey]],
    kid: str | None,
) -> None:
    auth = _jwks(tmp_path, *((name, _public(key)) for name, key in jwks))
    token = jwt.encode(
        good(), signing_key, algorithm=algorithm, headers={"kid": kid} if kid else None
    )
    with pytest.raises(DomainError) as caught:
        auth.authenticate(bearer(token), "")
    assert caught.value.code is Code.UNAUTHENTICATED


def test_jwks_keys_are_chosen_by_kid_and_key_type(tmp_path: Path) -> None:
    second = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    auth = _jwks(
        tmp_path, ("rsa-1", _public(RSA_KEY)), ("rsa-2", _public(second)), ("ec-1", _public(EC_KEY))
    )
    for key, kid, algorithm in (
        (RSA_KEY, "rsa-1", "RS256"),
        (second, "rsa-2", "RS256"),
        (EC_KEY, "ec-1", "ES256"),
        (EC_KEY, None, "ES256"),  # the only EC key: no kid needed
    ):
        token = jwt.encode(good(), key, algorithm=algorithm, headers={"kid": kid} if kid else None)
        assert auth.authenticate(bearer(token), "").namespaces == {"tenant-a"}


def test_a_jwks_without_a_usable_key_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="RUNIFOLD_JWT_JWKS_FILE"):
        _jwks(tmp_path, ("hs", {"kty": "oct", "k": "c2VjcmV0"}))


def test_authorize_fills_the_single_namespace_and_refuses_others() -> None:
    one = Identity("app", frozenset({"tenant-a"}))
    request = pb.GetConversationRequest(conversation_id="x")
    authorize(request, one)
    assert request.namespace == "tenant-a"
    with pytest.raises(DomainError) as caught:
        authorize(pb.GetConversationRequest(namespace="tenant-b"), one)
    assert caught.value.code is Code.PERMISSION_DENIED
    two = Identity("app", frozenset({"tenant-a", "tenant-b"}))
    with pytest.raises(DomainError) as caught:
        authorize(pb.GetConversationRequest(), two)
    assert caught.value.code is Code.INVALID_ARGUMENT
    authorize(pb.GetConversationRequest(namespace="anything"), Identity("ops", frozenset({"*"})))


APP = "spiffe://cluster.local/ns/apps/sa/app-1"
AGENT = "spiffe://cluster.local/ns/runifold/sa/agent"
SIDECAR = "By=spiffe://cluster.local/ns/runifold/sa/transcript;Hash=abc"
LOCAL = "ipv4:127.0.0.1:5000"
IDENTITIES = {
    APP: {"namespaces": ["tenant-a"]},
    AGENT: {"namespaces": ["*"], "delegate": True},
}


def _mesh(
    tmp_path: Path,
    trust: bool = True,
    internal: InternalCredential | None = None,
    identities: object = IDENTITIES,
) -> MeshAuthenticator:
    path = tmp_path / "identities.json"
    path.write_text(json.dumps(identities))
    return MeshAuthenticator(
        AuthSettings(
            mode="mesh", mesh_trust_xfcc=trust, mesh_identities_file=str(path), internal=internal
        )
    )


def xfcc(value: str) -> Headers:
    return (("x-forwarded-client-cert", value),)


def element(uri: str, *more: str) -> str:
    """The element a sidecar appends for a client with this URI SAN."""
    return ";".join((SIDECAR, f"URI={uri}", *more))


def test_mesh_identity_from_the_local_sidecar(tmp_path: Path) -> None:
    auth = _mesh(tmp_path)
    assert auth.authenticate(xfcc(element(APP)), LOCAL).namespaces == {"tenant-a"}
    # Envoy's full element: a quoted Subject, DNS SANs, a quoted URL-encoded Cert.
    full = element(APP, 'Subject="CN=app-1,OU=apps"', "DNS=app-1.apps.svc", 'Cert="%3D%3Dab"')
    assert auth.authenticate(xfcc(full), LOCAL).subject == APP
    # Behind a gateway: the immediate client is the last element, the one the sidecar
    # appended; the earlier ones are what the gateway's client presented.
    chain = f"By=spiffe://gw;Hash=def;URI={AGENT},{element(APP)}"
    assert auth.authenticate(xfcc(chain), LOCAL).subject == APP


@pytest.mark.parametrize(
    ("peer", "trust"), [("ipv4:10.1.2.3:5000", True), ("ipv4:127.0.0.1:5000", False)]
)
def test_forged_mesh_header_from_an_untrusted_peer_is_ignored(
    tmp_path: Path, peer: str, trust: bool
) -> None:
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path, trust).authenticate(xfcc(element(APP)), peer)
    assert caught.value.code is Code.UNAUTHENTICATED


def test_mesh_delegation_only_for_delegates(tmp_path: Path) -> None:
    auth = _mesh(tmp_path)
    on_behalf = (("x-runifold-on-behalf-of", "tenant-z"),)
    assert auth.authenticate(xfcc(element(AGENT)) + on_behalf, LOCAL).namespaces == {"tenant-z"}
    both = (("x-runifold-on-behalf-of", "tenant-y,tenant-z"),)
    assert auth.authenticate(xfcc(element(AGENT)) + both, LOCAL).namespaces == {
        "tenant-y",
        "tenant-z",
    }
    # A non-delegate cannot widen its grant by asserting namespaces.
    assert auth.authenticate(xfcc(element(APP)) + on_behalf, LOCAL).namespaces == {"tenant-a"}


# Envoy's own cases for its XFCC parser (test/extensions/formatter/xfcc_value).
@pytest.mark.parametrize(
    ("value", "uri"),
    [
        ("By=test;URI=abc;DNS=example.com", "abc"),
        (r'By=test;URI="a,b,c;\"e;f;g=x";DNS=example.com', 'a,b,c;"e;f;g=x'),
        (
            r'By=test;DNS=example.com,By=test;URI="a,b,c;\"e;f;g=x";DNS=example.com',
            'a,b,c;"e;f;g=x',
        ),
        (r'By=test;DNS=example.com,By=test;URI="\\";DNS=example.com', "\\"),
        (r'By=test;DNS=example.com,By=test;URI="\\\"";DNS=example.com', '\\"'),
    ],
)
def test_xfcc_follows_envoys_grammar(value: str, uri: str) -> None:
    assert dict(parse_xfcc(value)[-1])["uri"] == uri


@pytest.mark.parametrize(
    "value",
    [
        'By=test;URI="abc;DNS=example.com',  # an unmatched quote
        "By=x;Hash=y;URI=a,,By=x;Hash=y;URI=b",  # an empty element
        "By=x;Hash=y;URI=a;",  # an empty pair
        "By=x;Hash=y;URI",  # a pair without "="
        "=x;Hash=y;URI=a",  # no key
        "By x=1;Hash=y;URI=a",  # a key that is not a token
        'By=x;Hash=y;URI="a"b',  # text after a quoted value
        'By=x;Hash=y;URI=a"b"',  # a quote inside an unquoted value
        "",
    ],
)
def test_xfcc_outside_the_grammar_does_not_parse(value: str) -> None:
    with pytest.raises(XfccError):
        parse_xfcc(value)


@pytest.mark.parametrize(
    "value",
    [
        # A client certificate without a URI SAN whose quoted Subject holds one: the
        # comma-splitting parser took the agent from inside the quotes.
        f'{SIDECAR};Subject="CN=x,URI={AGENT}";URI=',
        f'{SIDECAR};Subject="CN=x,URI={AGENT}"',
        # A DNS SAN with a comma: Envoy copies it unquoted, so its tail looks like an
        # element of its own (one the sidecar did not write: no By, no Hash).
        element(APP, f"DNS=a,URI={AGENT}"),
        element(APP, f"DNS=a,Hash=abc;URI={AGENT}"),
        # A DNS SAN with a semicolon: two URIs in the immediate client's element.
        element(APP, f"DNS=a;URI={AGENT}"),
        # Malformed values are refused whole.
        element(APP, 'Subject="CN=x'),
        f"{element(AGENT)},",
    ],
)
def test_identities_smuggled_into_xfcc_are_refused(tmp_path: Path, value: str) -> None:
    on_behalf = (("x-runifold-on-behalf-of", "tenant-z"),)
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path).authenticate(xfcc(value) + on_behalf, LOCAL)
    assert caught.value.code is Code.UNAUTHENTICATED


def test_an_identity_inside_another_value_is_data(tmp_path: Path) -> None:
    # A DNS SAN "aURI=spiffe://.../agent": the substring search took the agent.
    value = element(APP, f"DNS=aURI={AGENT}")
    assert _mesh(tmp_path).authenticate(xfcc(value), LOCAL).subject == APP


@pytest.mark.parametrize(
    "headers",
    [
        xfcc(element(APP)) + xfcc(element(AGENT)),  # the last header won
        xfcc(element(AGENT)) + xfcc(element(APP)),
        (
            *xfcc(element(AGENT)),
            ("x-runifold-on-behalf-of", "tenant-a"),
            ("x-runifold-on-behalf-of", "*"),
        ),
    ],
)
def test_identity_headers_sent_twice_are_unauthenticated(tmp_path: Path, headers: Headers) -> None:
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path).authenticate(headers, LOCAL)
    assert caught.value.code is Code.UNAUTHENTICATED


@pytest.mark.parametrize("on_behalf", ["tenant-2 *", "tenant-a,,tenant-b", "", ",", "tenant a"])
def test_on_behalf_of_in_any_other_shape_is_unauthenticated(tmp_path: Path, on_behalf: str) -> None:
    headers = (*xfcc(element(AGENT)), ("x-runifold-on-behalf-of", on_behalf))
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path).authenticate(headers, LOCAL)
    assert caught.value.code is Code.UNAUTHENTICATED


@pytest.mark.parametrize(
    "identities",
    [
        {APP: {"namespaces": "tenant-2 *"}},
        {APP: {"namespaces": ["tenant-a", "tenant b"]}},
        {APP: {"namespaces": "tenant-a", "delegate": "yes"}},
        {APP: {"namespace": ["tenant-a"]}},
        {APP: ["tenant-a"]},
        [APP],
    ],
)
def test_an_identities_file_in_any_other_shape_fails_at_start(
    tmp_path: Path, identities: object
) -> None:
    with pytest.raises(SettingsError, match="RUNIFOLD_MESH_IDENTITIES_FILE"):
        _mesh(tmp_path, identities=identities)


def test_the_internal_credential_is_this_process_acting_for_its_caller(tmp_path: Path) -> None:
    credential = InternalCredential.mint()
    auth = _mesh(tmp_path, internal=credential)
    on_behalf = (("x-runifold-on-behalf-of", "tenant-z"),)
    internal = (credential.metadata(),)
    identity = auth.authenticate(internal + on_behalf, "ipv4:10.1.2.3:5000")
    assert identity.namespaces == {"tenant-z"} and identity.delegate
    assert "secret" not in repr(credential) and credential.secret not in repr(credential)
    for headers in (
        internal,  # it always acts for someone
        (("x-runifold-internal", "forged"), *on_behalf),
        (("x-runifold-internal", "forged"), *xfcc(element(APP))),  # refused, not ignored
        internal + internal + on_behalf,
        (*internal, ("x-runifold-on-behalf-of", "tenant-2 *")),
    ):
        with pytest.raises(DomainError) as caught:
            auth.authenticate(headers, LOCAL)
        assert caught.value.code is Code.UNAUTHENTICATED
    # A server that minted no credential (not all-in-one) accepts none.
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path).authenticate(internal + on_behalf, LOCAL)
    assert caught.value.code is Code.UNAUTHENTICATED


def test_unauthenticated_servers_stay_on_loopback() -> None:
    assert check_exposure(AuthSettings(), "127.0.0.1:50051") is None
    with pytest.raises(SettingsError, match="RUNIFOLD_ALLOW_INSECURE"):
        check_exposure(AuthSettings(), "0.0.0.0:50051")
    warning = check_exposure(AuthSettings(allow_insecure=True), "0.0.0.0:50051")
    assert warning is not None and "WITHOUT authentication" in warning
    assert check_exposure(settings(), "0.0.0.0:50051") is None


def test_incomplete_configuration_fails_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="RUNIFOLD_JWT_SECRET"):
        AuthSettings.from_env({"RUNIFOLD_AUTH": "jwt"})
    with pytest.raises(SettingsError, match="RUNIFOLD_TLS_KEY_FILE"):
        AuthSettings.from_env({"RUNIFOLD_TLS_CERT_FILE": str(tmp_path)})
    with pytest.raises(SettingsError, match="does not exist"):
        AuthSettings.from_env(
            {"RUNIFOLD_AUTH": "mesh", "RUNIFOLD_MESH_IDENTITIES_FILE": str(tmp_path / "none.json")}
        )


def test_service_identity_acts_for_one_namespace(tmp_path: Path) -> None:
    from services.common.auth import identity_var, outbound_identity_metadata, service_identity

    assert service_identity(AuthSettings(), "tenant-a") is None
    with pytest.raises(SettingsError, match="RUNIFOLD_SERVICE_TOKEN"):
        service_identity(settings(), "tenant-a")
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    jwt_settings = settings(service_token_file=str(token_file))
    identity = service_identity(jwt_settings, "tenant-a")
    assert identity is not None and identity.token == "first-token"
    token_file.write_text("rotated-token")  # a mounted token is re-read on every use
    rotated = service_identity(jwt_settings, "tenant-a")
    assert rotated is not None and rotated.token == "rotated-token"
    identity_var.set(rotated)
    assert outbound_identity_metadata() == (("authorization", "Bearer rotated-token"),)
    mesh = service_identity(
        AuthSettings(mode="mesh", mesh_identities_file=str(token_file)), "tenant-a"
    )
    identity_var.set(mesh)
    assert outbound_identity_metadata() == (("x-runifold-on-behalf-of", "tenant-a"),)
    identity_var.set(None)
