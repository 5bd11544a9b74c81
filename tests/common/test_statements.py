"""SQL statements converted once (services/common/statements.py).

psycopg re-parses a `%(name)s` query on every execution when the query is longer
than its cache limit; a Statement is converted at import instead. These tests pin
the conversion to psycopg's own rules and keep every other statement of the
services inside psycopg's cache.
"""

from __future__ import annotations

import importlib
import pkgutil

import psycopg._queries
import pytest

import services
from services.common.statements import Statement, compact, statement


def test_comments_and_layout_go_and_quoted_text_stays() -> None:
    sql = """
    SELECT 'a -- not a comment',   "odd  -- name"  -- a comment
      FROM t  -- another
     WHERE x = $tag$ keep   -- this $tag$
    """
    assert compact(sql) == (
        "SELECT 'a -- not a comment', \"odd  -- name\" FROM t WHERE x = $tag$ keep   -- this $tag$"
    )


def test_doubled_quotes_stay_inside_the_quoted_text() -> None:
    assert compact("SELECT 'it''s  -- here'  -- gone") == "SELECT 'it''s  -- here'"


def test_dollar_tags_may_hold_digits() -> None:
    assert (
        compact("SELECT $a1$ keep  -- inside $a1$, 1  -- gone")
        == "SELECT $a1$ keep  -- inside $a1$, 1"
    )


def test_a_word_ending_in_e_before_a_string_is_not_an_escape_string() -> None:
    assert compact("SELECT CASE WHEN x THEN 'a' ELSE 'b' END") == (
        "SELECT CASE WHEN x THEN 'a' ELSE 'b' END"
    )


@pytest.mark.parametrize(
    "sql",
    ["SELECT 'open", 'SELECT "open', "SELECT $q$ open", "/* x */ 1", "SELECT E'it\\'s'"],
)
def test_what_cannot_be_stripped_safely_is_refused(sql: str) -> None:
    with pytest.raises(ValueError):
        compact(sql)


def test_placeholders_are_numbered_as_psycopg_numbers_them() -> None:
    converted = statement("SELECT %(b)s, %(a)s::bigint, %(b)s, '100%%' -- %(gone)s\n")
    assert converted == Statement(b"SELECT $1, $2::bigint, $1, '100%'", ("b", "a"))
    assert converted.arguments({"a": 1, "b": 2, "unused": 3}) == (2, 1)


def test_a_lone_percent_sign_is_refused() -> None:
    with pytest.raises(ValueError):
        statement("SELECT 5 % 2")


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(services.__path__, "services."):
        if ".migrations" in info.name or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_every_statement_stays_inside_psycopgs_query_cache() -> None:
    """A str statement longer than psycopg's cache limit would be re-parsed on every
    call; such a statement must be a Statement (converted once) instead."""
    limit = psycopg._queries.MAX_CACHED_STATEMENT_LENGTH
    too_long = []
    for name in _modules():
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if (
                isinstance(value, str)
                and not attribute.startswith("__")
                and any(word in value for word in ("SELECT", "INSERT", "UPDATE", "DELETE"))
                and len(value.encode()) > limit
            ):
                too_long.append(f"{name}.{attribute} ({len(value.encode())} bytes)")
    assert too_long == []
