"""The jsonb rules of services/common/jsonb.py on known cases (test_jsonb_rules_on_postgres.py
compares them with PostgreSQL's own on generated documents), and
a logged traceback that names a driver error by its class and SQLSTATE only."""

from __future__ import annotations

import io
import logging
from decimal import Decimal

import psycopg
import pytest

from services.common import jsonb, validation
from services.common.errors import DomainError
from services.common.logs import JsonFormatter, TextFormatter
from services.common.messages import MessageLimits
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import state_change
from tests.common.jsonb.cases import ACCEPTED, REFUSED


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_what_jsonb_refuses_is_refused(text: str) -> None:
    with pytest.raises(jsonb.JsonbRefused):
        jsonb.parse(text)


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_jsonb_accepts_is_accepted(text: str) -> None:
    jsonb.parse(text)


def test_numbers_come_as_json_loads_makes_them() -> None:
    """Beyond 4300 digits, which Python's int() refuses and numeric takes, a Decimal."""
    assert jsonb.parse('{"a": 1e10000, "b": 2, "c": 1.5}') == {"a": float("inf"), "b": 2, "c": 1.5}
    assert jsonb.parse(f'{{"a": {"9" * 5000}}}') == {"a": Decimal("9" * 5000)}
    with pytest.raises(jsonb.JsonbRefused, match="numeric"):
        jsonb.parse(f'{{"a": {"9" * 5000}, "b": 1e-16384}}')


@pytest.mark.parametrize("limit", [1, 2, 64, jsonb.MAX_DEPTH])
def test_depth_is_counted_in_arrays_and_objects_and_not_in_strings(limit: int) -> None:
    deepest = '{"a":' * (limit - 1) + '["]]]{{{"]' + "}" * (limit - 1)
    assert jsonb.depth(deepest) == limit
    jsonb.parse(deepest, max_depth=limit)
    with pytest.raises(jsonb.JsonbRefused) as refused:
        jsonb.parse("[" + deepest + "]", max_depth=limit)
    assert refused.value.max_depth == limit


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ('["\\"[[[[", 1]', 1),  # an escaped quote does not end the string
        ('["\\\\", [1]]', 2),  # an escaped backslash does not escape the quote
        ('{"a]": {"b}": []}}', 3),
        ("1", 0),
    ],
)
def test_depth_skips_strings(text: str, levels: int) -> None:
    assert jsonb.depth(text) == levels


def test_a_document_too_deep_for_python_is_too_deep_not_unparsable() -> None:
    with pytest.raises(jsonb.JsonbRefused) as refused:
        jsonb.parse("[" * 100_000 + "]" * 100_000)
    assert refused.value.max_depth == jsonb.MAX_DEPTH


def test_the_field_is_named_with_its_reason() -> None:
    with pytest.raises(DomainError) as caught:
        validation.json_object('{"a": "\\ud800"}', "state.user_json", "INVALID_STATE")
    assert (caught.value.reason, caught.value.field) == ("INVALID_STATE", "state.user_json")
    assert "ud800" in caught.value.message  # what is wrong, never the document
    with pytest.raises(DomainError) as deep:
        validation.json_document("[[[]]]", "messages[0].native_json", "X", max_depth=2)
    assert deep.value.metadata == {"limit_depth": "2"}


def test_the_depth_limit_is_read_from_the_environment() -> None:
    limits = TranscriptLimits.from_env({"RUNIFOLD_MAX_JSON_DEPTH": "3"})
    assert limits.max_json_depth == limits.messages.max_json_depth == 3
    state_change('{"a": [[1]]}', "", "", 1024, "state_delta", limits.max_json_depth)
    with pytest.raises(DomainError):
        state_change('{"a": [[[1]]]}', "", "", 1024, "state_delta", limits.max_json_depth)
    assert MessageLimits.from_env({}).max_json_depth == jsonb.MAX_DEPTH
    with pytest.raises(ValueError, match="RUNIFOLD_MAX_JSON_DEPTH"):
        MessageLimits.from_env({"RUNIFOLD_MAX_JSON_DEPTH": "100000"})


SECRET = "card-4111-1111-1111-1111"


def _driver_error() -> psycopg.Error:
    """PostgreSQL's error as psycopg raises it: its text quotes the document."""
    return psycopg.errors.InvalidTextRepresentation(
        "invalid input syntax for type json\nDETAIL:  Unicode low surrogate must follow a "
        f'high surrogate.\nCONTEXT:  JSON data, line 1: {{"pan": "{SECRET}"'
    )


def _logged(formatter: logging.Formatter) -> str:
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(formatter)
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            try:
                raise _driver_error()
            except psycopg.Error as exc:
                raise RuntimeError("the append failed") from exc
        except RuntimeError as outer:
            try:
                raise ExceptionGroup("in a task group", [outer, _driver_error()])
            except ExceptionGroup as group:
                logger.error("unhandled error", exc_info=group)
    finally:
        logger.removeHandler(handler)
    return buffer.getvalue()


@pytest.mark.parametrize("formatter", [JsonFormatter("test"), TextFormatter()], ids=str)
def test_a_logged_driver_error_is_its_class_and_sqlstate(formatter: logging.Formatter) -> None:
    text = _logged(formatter)
    assert SECRET not in text and "CONTEXT" not in text
    assert "psycopg.errors.InvalidTextRepresentation" in text
    assert "the append failed" in text  # the rest of the traceback is kept
    assert "direct cause" in text


@pytest.mark.parametrize("text", ['"\ud800"', '"\udc00"', '"a\x00"'], ids=["high", "low", "nul"])
def test_a_raw_surrogate_or_nul_is_refused(text: str) -> None:
    """Never decoded from the wire (protobuf refuses such UTF-8), but a str may hold them."""
    with pytest.raises(jsonb.JsonbRefused):
        jsonb.parse(text)
