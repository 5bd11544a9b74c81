"""Bearer JWTs: HS256 with a shared secret, or RS256 / ES256 keys from a JWKS file (the key
chosen by `kid` and by the key type the token's `alg` needs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from services.common.auth.identity import (
    Identity,
    Metadata,
    granted_namespaces,
    header,
    unauthenticated,
)
from services.common.auth.settings import AuthSettings
from services.common.settings import (
    SettingsError,
)

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
