"""Authentication and TLS configuration (RUNIFOLD_AUTH_*, RUNIFOLD_TLS_*), and the refusal
to serve unauthenticated beyond loopback."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from services.common.auth.identity import InternalCredential
from services.common.settings import (
    Env,
    SettingsError,
    env_bool,
    env_choice,
    env_int,
    env_str,
    is_loopback,
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
