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
    JwtAuthenticator,
    MeshAuthenticator,
    authorize,
    check_exposure,
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


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_a_valid_token_grants_its_namespaces() -> None:
    identity = JwtAuthenticator(settings()).authenticate(
        bearer(hs256(good(namespaces="tenant-a tenant-b"))), "ipv4:10.0.0.1:1"
    )
    assert identity.namespaces == {"tenant-a", "tenant-b"} and identity.subject == "app-1"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Basic abc"},
        bearer("not-a-jwt"),
        bearer(hs256(good(exp=time.time() - 3600))),
        bearer(hs256(good(aud="someone-else"))),
        bearer(hs256(good(iss="https://evil.example"))),
        bearer(hs256(good(), secret="x" * 40)),
        bearer(hs256({k: v for k, v in good().items() if k != "exp"})),
        bearer(jwt.encode(good(), "", algorithm="none")),
    ],
)
def test_bad_tokens_are_unauthenticated(headers: dict[str, str]) -> None:
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


def _mesh(tmp_path: Path, trust: bool = True) -> MeshAuthenticator:
    identities = tmp_path / "identities.json"
    identities.write_text(
        json.dumps(
            {
                "spiffe://cluster.local/ns/apps/sa/app-1": {"namespaces": ["tenant-a"]},
                "spiffe://cluster.local/ns/runifold/sa/agent": {
                    "namespaces": ["*"],
                    "delegate": True,
                },
            }
        )
    )
    return MeshAuthenticator(
        AuthSettings(mode="mesh", mesh_trust_xfcc=trust, mesh_identities_file=str(identities))
    )


XFCC = "By=spiffe://cluster.local/ns/runifold/sa/transcript;Hash=abc;URI={}"


def test_mesh_identity_from_the_local_sidecar(tmp_path: Path) -> None:
    auth = _mesh(tmp_path)
    header = {"x-forwarded-client-cert": XFCC.format("spiffe://cluster.local/ns/apps/sa/app-1")}
    assert auth.authenticate(header, "ipv4:127.0.0.1:5000").namespaces == {"tenant-a"}


@pytest.mark.parametrize(
    ("peer", "trust"), [("ipv4:10.1.2.3:5000", True), ("ipv4:127.0.0.1:5000", False)]
)
def test_forged_mesh_header_from_an_untrusted_peer_is_ignored(
    tmp_path: Path, peer: str, trust: bool
) -> None:
    header = {"x-forwarded-client-cert": XFCC.format("spiffe://cluster.local/ns/apps/sa/app-1")}
    with pytest.raises(DomainError) as caught:
        _mesh(tmp_path, trust).authenticate(header, peer)
    assert caught.value.code is Code.UNAUTHENTICATED


def test_mesh_delegation_only_for_delegates(tmp_path: Path) -> None:
    auth = _mesh(tmp_path)
    agent = XFCC.format("spiffe://cluster.local/ns/runifold/sa/agent")
    app = XFCC.format("spiffe://cluster.local/ns/apps/sa/app-1")
    on_behalf = {"x-runifold-on-behalf-of": "tenant-z"}
    assert auth.authenticate(
        {"x-forwarded-client-cert": agent, **on_behalf}, "ipv4:127.0.0.1:1"
    ).namespaces == {"tenant-z"}
    # A non-delegate cannot widen its grant by asserting namespaces.
    assert auth.authenticate(
        {"x-forwarded-client-cert": app, **on_behalf}, "ipv4:127.0.0.1:1"
    ).namespaces == {"tenant-a"}


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
