"""Opaque page tokens (AIP-158), signed so they cannot be forged or moved.

A token binds the cursor to the listing it came from (kind, namespace and the
request's filter fields). A token that was tampered with, comes from another
namespace or another listing, or whose request fields changed, is
INVALID_ARGUMENT / INVALID_PAGE_TOKEN.

Hand-written on purpose: it is an HMAC over a small JSON document with the
standard library; no dependency does exactly this binding.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from services.common.errors import invalid_argument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_MAC_BYTES = 16


def page_size(value: int) -> int:
    """AIP-158: 0 means the default; negative is invalid; large values are capped."""
    if value < 0:
        raise invalid_argument(
            "INVALID_PAGE_SIZE", "page_size must not be negative", field="page_size"
        )
    if value == 0:
        return DEFAULT_PAGE_SIZE
    return min(value, MAX_PAGE_SIZE)


class PageTokens:
    """Signs and checks page tokens with one server secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(
        self, kind: str, namespace: str, request: Mapping[str, Any], cursor: Mapping[str, Any]
    ) -> str:
        """A token for the page after `cursor` of the listing `kind` in `namespace`."""
        body = json.dumps(
            {"k": kind, "n": namespace, "r": dict(request), "c": dict(cursor)},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return base64.urlsafe_b64encode(self._mac(body) + body).decode().rstrip("=")

    def decode(
        self, token: str, kind: str, namespace: str, request: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The cursor of a token, after checking it belongs to this exact listing."""
        invalid = invalid_argument(
            "INVALID_PAGE_TOKEN",
            "page_token is invalid or belongs to another request",
            field="page_token",
        )
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (ValueError, TypeError):
            raise invalid from None
        mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
        if len(mac) != _MAC_BYTES or not hmac.compare_digest(mac, self._mac(body)):
            raise invalid
        try:
            document = json.loads(body)
        except ValueError:
            raise invalid from None
        if (
            document.get("k") != kind
            or document.get("n") != namespace
            or document.get("r") != dict(request)
        ):
            raise invalid
        cursor: dict[str, Any] = document["c"]
        return cursor
