"""TLS for the listener (mutual when a client CA is configured) and for calls to peers."""

from __future__ import annotations

from pathlib import Path

import grpc

from services.common.auth.settings import AuthSettings

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
