"""Input rules shared by the services. Each breach is INVALID_ARGUMENT with a reason.

Strings that reach PostgreSQL must not hold NUL characters (PostgreSQL text
cannot store them), so every stored string is checked here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from services.common import jsonb
from services.common.errors import invalid_argument

NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
REQUEST_ID_PATTERN = re.compile(r"[\x21-\x7e]{1,128}")

MAX_METADATA_ENTRIES = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_BYTES = 1024

WINDOW_RANGE = (1, 4096)
SUMMARY_BATCH_RANGE = (1, 4096)
SUMMARY_PASSES_RANGE = (1, 64)
MEMORY_LIMIT_RANGE = (1, 256)


def namespace(value: str, field: str = "namespace") -> str:
    """A namespace: 1..128 characters of [A-Za-z0-9_.-]."""
    if value == "":
        raise invalid_argument(
            "INVALID_NAMESPACE",
            f"{field} is missing: every request names its namespace "
            "(1..128 characters of [A-Za-z0-9_.-])",
            field=field,
        )
    if not NAMESPACE_PATTERN.fullmatch(value):
        raise invalid_argument(
            "INVALID_NAMESPACE",
            "namespace must be 1..128 characters of [A-Za-z0-9_.-]",
            field=field,
        )
    return value


def uuid_id(value: str, field: str, reason: str) -> uuid.UUID:
    """A UUID in canonical text form (any version)."""
    if value == "":
        raise invalid_argument(reason, f"{field} is missing (a UUID)", field=field)
    try:
        parsed = uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise invalid_argument(reason, f"{field} must be a UUID", field=field) from None
    if str(parsed) != value.lower():
        raise invalid_argument(reason, f"{field} must be a UUID in canonical form", field=field)
    return parsed


def conversation_id(value: str, field: str = "conversation_id") -> uuid.UUID:
    """A conversation id: a UUID in canonical text form (INVALID_CONVERSATION_ID)."""
    return uuid_id(value, field, "INVALID_CONVERSATION_ID")


def request_id(value: str, field: str = "request_id") -> str | None:
    """An optional idempotency key: empty, or 1..128 printable ASCII characters."""
    if value == "":
        return None
    if not REQUEST_ID_PATTERN.fullmatch(value):
        raise invalid_argument(
            "INVALID_REQUEST_ID",
            f"{field} must be 1..128 printable ASCII characters",
            field=field,
        )
    return value


def in_range(value: int, bounds: tuple[int, int], field: str, reason: str) -> int:
    """An integer within inclusive bounds."""
    low, high = bounds
    if not low <= value <= high:
        raise invalid_argument(
            reason, f"{field} must be in {low}..{high}", field=field, minimum=low, maximum=high
        )
    return value


def view_bounds(window: int, summary_batch: int, prefix: str = "") -> None:
    """A view's window and summary batch within their ranges (fields named after `prefix`)."""
    in_range(window, WINDOW_RANGE, f"{prefix}window", "INVALID_WINDOW")
    in_range(summary_batch, SUMMARY_BATCH_RANGE, f"{prefix}summary_batch", "INVALID_SUMMARY_BATCH")


def text(
    value: str,
    field: str,
    *,
    max_bytes: int | None,
    reason: str = "INVALID_TEXT",
    required: bool = False,
) -> str:
    """A stored string: no NUL character, within a byte limit (None: checked by the
    caller), non-empty if required."""
    if required and not value.strip():
        raise invalid_argument(reason, f"{field} must not be empty", field=field)
    if "\x00" in value:
        raise invalid_argument(reason, f"{field} must not contain NUL characters", field=field)
    if max_bytes is not None and len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise invalid_argument(
            reason, f"{field} exceeds {max_bytes} bytes", field=field, limit_bytes=max_bytes
        )
    return value


def metadata(values: Mapping[str, str], field: str = "metadata") -> dict[str, str]:
    """Key/value annotations within the documented limits."""
    if len(values) > MAX_METADATA_ENTRIES:
        raise invalid_argument(
            "INVALID_METADATA",
            f"{field} holds more than {MAX_METADATA_ENTRIES} entries",
            field=field,
        )
    for key, value in values.items():
        if not 1 <= len(key) <= MAX_METADATA_KEY_CHARS or "\x00" in key:
            raise invalid_argument(
                "INVALID_METADATA",
                f"{field} keys must be 1..{MAX_METADATA_KEY_CHARS} characters without NUL",
                field=field,
            )
        text(
            value, f"{field} values", max_bytes=MAX_METADATA_VALUE_BYTES, reason="INVALID_METADATA"
        )
    return dict(values)


def json_document(value: str, field: str, reason: str, *, max_depth: int = jsonb.MAX_DEPTH) -> Any:
    """A JSON document by the rules of PostgreSQL's jsonb (services/common/jsonb.py:
    RFC 8259 without NaN or Infinity, no NUL character, no lone UTF-16 surrogate
    escape, no \\u0000, numbers within numeric's range), nested at most `max_depth`
    levels (RUNIFOLD_MAX_JSON_DEPTH); its parsed value, numbers as Decimal. Every
    JSON field a client sends passes here, whether it is stored as jsonb or as text:
    one rule for all of them."""
    try:
        return jsonb.parse(value, max_depth)
    except jsonb.JsonbRefused as refused:
        if refused.max_depth is not None:
            raise invalid_argument(
                reason, f"{field} {refused}", field=field, limit_depth=refused.max_depth
            ) from None
        raise invalid_argument(reason, f"{field} {refused}", field=field) from None


def json_object(
    value: str, field: str, reason: str, *, max_depth: int = jsonb.MAX_DEPTH
) -> dict[str, Any]:
    """A JSON object by the rules of `json_document`; its parsed value."""
    parsed = json_document(value, field, reason, max_depth=max_depth)
    if not isinstance(parsed, dict):
        raise invalid_argument(reason, f"{field} must be a JSON object", field=field)
    return parsed
