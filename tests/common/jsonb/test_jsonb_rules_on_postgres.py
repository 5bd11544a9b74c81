"""Our jsonb rules (services/common/jsonb.py) and PostgreSQL's `::jsonb` give the same
verdict on every JSON text: the known cases of tests/common/jsonb/cases.py, and generated
documents built to sit on the rules' edges (surrogate escapes lone and paired, \\u0000
and look-alikes behind an escaped backslash, numbers around numeric's limits, and
syntax mutations). Behind the rules, a data exception that reaches the database
anyway is INVALID_ARGUMENT / INVALID_VALUE, and neither the error nor the log holds
the value's text.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common import jsonb
from services.common.errors import Code, DomainError
from services.common.postgres.pool import Database
from tests.common.jsonb.cases import ACCEPTED, REFUSED

SECRET = "card-4111-1111-1111-1111"


@pytest.fixture(scope="module")
def conn(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        yield connection


def postgres_takes(conn: psycopg.Connection[tuple[object, ...]], text: str) -> bool:
    """PostgreSQL's verdict: True when `text::jsonb` is a value, False on a data exception."""
    try:
        conn.execute("SELECT %s::jsonb IS NOT NULL", (text,))
    except psycopg.DataError:
        return False
    return True


def we_take(text: str) -> bool:
    try:
        # The depth limit is ours alone (PostgreSQL's is its stack): at its maximum, the
        # generated documents never reach it.
        jsonb.parse(text, jsonb.DEPTH_RANGE[1])
    except jsonb.JsonbRefused:
        return False
    return True


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_postgres_refuses_the_refused_cases(
    conn: psycopg.Connection[tuple[object, ...]], text: str
) -> None:
    assert not postgres_takes(conn, text)


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_postgres_takes_the_accepted_cases(
    conn: psycopg.Connection[tuple[object, ...]], text: str
) -> None:
    assert postgres_takes(conn, text)


def _escape(code: int) -> str:
    return f"\\u{code:04x}"


escapes = st.one_of(
    st.integers(0xD800, 0xDFFF).map(_escape),
    st.tuples(st.integers(0xD800, 0xDBFF), st.integers(0xDC00, 0xDFFF)).map(
        lambda pair: _escape(pair[0]) + _escape(pair[1])
    ),
    st.integers(0, 0xFFFF).map(_escape),
    st.integers(0xD800, 0xDFFF).map(lambda code: f"\\u{code:04X}"),
    st.sampled_from(["\\u0000", "\\\\", '\\"', "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"]),
    st.sampled_from(["\\\\u0000", "\\\\ud800", "\\\\\\ud83d\\ude00"]),
)
plain = st.characters(min_codepoint=0x20, exclude_categories=["Cs"], exclude_characters='"\\')
strings = st.lists(st.one_of(plain, escapes), max_size=6).map(lambda p: '"' + "".join(p) + '"')

# Exponents around each of numeric's limits: the display scale (16383), the weight of
# the leading digit (131071) and the exponent numeric_in reads (1073741823).
EDGES = [0, 1, 300, 16383, 131071, 1073741823, 2**31, 10**12]
exponents = st.one_of(
    st.builds(lambda edge, delta: max(0, edge + delta), st.sampled_from(EDGES), st.integers(-3, 3)),
    st.integers(0, 2_000_000),
)
wholes = st.one_of(
    st.just("0"),
    st.from_regex(r"[1-9][0-9]{0,24}", fullmatch=True),
    st.integers(1, 6).map(lambda n: "1" + "0" * n),
    st.sampled_from([131070, 131071, 131072]).map(lambda n: "1" + "0" * (n - 1)),
)
fractions = st.one_of(
    st.just(""),
    st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    st.builds(
        lambda n, last: "0" * (n - 1) + last,
        st.sampled_from([16382, 16383, 16384]),
        st.sampled_from(["0", "1"]),
    ),
)
numbers = st.builds(
    lambda sign, whole, fraction, marker, exp_sign, zeros, exponent: (
        sign
        + whole
        + (f".{fraction}" if fraction else "")
        + (f"{marker}{exp_sign}{'0' * zeros}{exponent}" if marker else "")
    ),
    st.sampled_from(["", "-"]),
    wholes,
    fractions,
    st.sampled_from(["", "e", "E"]),
    st.sampled_from(["", "+", "-"]),
    st.integers(0, 2),
    exponents,
)
# Numbers exactly at a limit or one past it, written in several ways.
edge_numbers = st.one_of(
    # The leading digit at 10^131071 or 10^131072, with digits before the point...
    st.builds(
        lambda sign, digits, position: f"{sign}1{'0' * (digits - 1)}e{position - digits + 1}",
        st.sampled_from(["", "-"]),
        st.integers(1, 5),
        st.sampled_from([131071, 131072]),
    ),
    # ... or after it, behind zeros.
    st.builds(
        lambda zeros, position: f"0.{'0' * zeros}1e{position + zeros + 1}",
        st.integers(0, 3),
        st.sampled_from([131071, 131072]),
    ),
    # The digits written after the point, minus the exponent, at 16383 or 16384.
    st.builds(
        lambda written, scale, last: f"1.{'0' * (written - 1)}{last}e{written - scale}",
        st.integers(1, 5),
        st.sampled_from([16383, 16384]),
        st.sampled_from(["0", "1"]),
    ),
    # ... or without an exponent.
    st.builds(lambda scale: f"0.{'0' * (scale - 1)}1", st.sampled_from([16383, 16384])),
    # The exponent at numeric_in's bound, for a zero and for others.
    st.builds(
        lambda mantissa, sign, exponent: f"{mantissa}e{sign}{exponent}",
        st.sampled_from(["0", "0.0", "1", "-0"]),
        st.sampled_from(["", "+", "-"]),
        st.sampled_from([1073741823, 1073741824]),
    ),
)
scalars = st.one_of(strings, numbers, edge_numbers, st.sampled_from(["true", "false", "null"]))
spaces = st.sampled_from(["", "", "", " ", "\n", "\t", "\r"])


def _array(items: list[str], space: str) -> str:
    return "[" + space + ("," + space).join(items) + "]"


def _object(pairs: list[tuple[str, str]], space: str) -> str:
    return "{" + ",".join(f"{space}{key}{space}:{value}" for key, value in pairs) + "}"


documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.builds(_array, st.lists(children, max_size=4), spaces),
        st.builds(_object, st.lists(st.tuples(strings, children), max_size=4), spaces),
    ),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A document with one edit: a character removed, or a significant one inserted."""
    text = draw(documents)
    at = draw(st.integers(0, len(text)))
    if draw(st.booleans()) and text:
        return text[: max(0, at - 1)] + text[at:]
    return text[:at] + draw(st.sampled_from(list(',[]{}:"\\0-+.eEu\f '))) + text[at:]


@settings(
    max_examples=600,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=st.one_of(documents, mutated()))
def test_the_same_verdict_as_postgres(
    conn: psycopg.Connection[tuple[object, ...]], text: str
) -> None:
    assert we_take(text) == postgres_takes(conn, text), text[:300]


@pytest.mark.parametrize(
    ("statement", "value"),
    [
        ("SELECT %s::jsonb", f'{{"pan": "{SECRET}", "x": "\\ud800"}}'),
        ("SELECT %s::jsonb", f'{{"pan": "{SECRET}", "x": 1e1000000}}'),
        ("SELECT %s::uuid", SECRET),
        ("SELECT %s::text", f"{SECRET}\x00"),  # refused by psycopg itself
    ],
    ids=["json", "numeric", "uuid", "nul"],
)
async def test_a_data_exception_is_invalid_value_without_its_text(
    database: Database, captured: io.StringIO, statement: str, value: str
) -> None:
    with pytest.raises(DomainError) as caught:
        async with database.connection() as conn:
            await conn.execute(statement, (value,))
    error = caught.value
    assert (error.code, error.reason) == (Code.INVALID_ARGUMENT, "INVALID_VALUE")
    assert error.__cause__ is None and error.__suppress_context__
    assert SECRET not in error.message
    logged = captured.getvalue()
    assert "the database refused a value" in logged and "psycopg" in logged
    assert SECRET not in logged
    async with database.connection() as conn:  # the connection went back usable
        await conn.execute("SELECT 1")
