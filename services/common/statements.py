"""SQL statements as the hot path wants them: converted for the server once.

psycopg converts a query's `%(name)s` placeholders into PostgreSQL's `$n` on
every execution and caches that conversion only for queries of at most
`psycopg._queries.MAX_CACHED_STATEMENT_LENGTH` bytes (4096 in psycopg 3.3). A
longer statement is re-parsed in Python on every call: the commented append
statement (6.4 kB) spent 16% of TranscriptService's CPU there. A `Statement`
is converted once, at import: comments and layout stripped (`compact`),
placeholders numbered; it runs through psycopg's raw cursor, which sends the
text as it is (and still prepares it server-side after a few executions).

Written by hand: the only library that strips SQL comments (sqlparse) would be a
dependency for these lines, and they need to know only quotes; the placeholder
rules are psycopg's own (`%(name)s`, `%%`), applied once instead of per call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, AsyncRawCursor
from psycopg.rows import TupleRow

_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")
# psycopg's placeholders: a named one, or `%%` for a literal percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement with `$n` placeholders and the parameter names they stand for."""

    text: bytes
    names: tuple[str, ...]

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The values of `params` in placeholder order (a missing name raises KeyError)."""
        return tuple(params[name] for name in self.names)

    async def execute(
        self, conn: AsyncConnection[TupleRow], params: Mapping[str, Any]
    ) -> AsyncCursor[TupleRow]:
        """Run it on `conn` with `params`; the cursor holds the rows."""
        cursor = AsyncRawCursor(conn)
        await cursor.execute(self.text, self.arguments(params))
        return cursor


def statement(sql: str) -> Statement:
    """`sql` (with `%(name)s` placeholders) converted once for the raw cursor.

    The same name used twice is one parameter, as psycopg does it; `%%` is a
    literal percent sign; any other `%` is refused, as psycopg would.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            raise ValueError("a lone % in a statement; write %% for a percent sign")
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(number, compact(sql))
    return Statement(text.encode(), tuple(names))


def compact(statement: str) -> str:
    """`statement` without `--` comments and with each run of blanks one space.

    Text inside single quotes, double-quoted identifiers and dollar-quoted
    strings is kept byte for byte; block comments (`/* */`) and escape strings
    (`E'...'`) are not used in this code base and are refused, so nothing is
    silently kept half-stripped.
    """
    out: list[str] = []
    i, n = 0, len(statement)
    pending_space = False
    while i < n:
        char = statement[i]
        if char in "'\"":
            prefixed = not pending_space and out and out[-1] in "Ee"
            if char == "'" and prefixed and (len(out) < 2 or not _word(out[-2])):
                # E'...' takes backslash escapes (\' too), which these rules do not read.
                raise ValueError("escape strings (E'...') are not supported")
            end = _quote_end(statement, i, char)
            chunk, i = statement[i:end], end
        elif char == "$" and (tag := _DOLLAR_TAG.match(statement, i)) is not None:
            close = statement.find(tag.group(), tag.end())
            if close < 0:
                raise ValueError("unterminated dollar-quoted string")
            end = close + len(tag.group())
            chunk, i = statement[i:end], end
        elif statement.startswith("--", i):
            newline = statement.find("\n", i)
            i = n if newline < 0 else newline
            pending_space = True
            continue
        elif statement.startswith("/*", i):
            raise ValueError("block comments are not supported; use --")
        elif char.isspace():
            pending_space = True
            i += 1
            continue
        else:
            chunk, i = char, i + 1
        if pending_space and out:
            out.append(" ")
        pending_space = False
        out.append(chunk)
    return "".join(out)


def _word(chunk: str) -> bool:
    """Whether `chunk` ends in a character of an identifier (so an E before it is not a prefix)."""
    return chunk[-1:].isalnum() or chunk[-1:] in "_$"


def _quote_end(statement: str, start: int, quote: str) -> int:
    """The index just past the quoted text opening at `start` (doubled quotes escape)."""
    i = start + 1
    while True:
        close = statement.find(quote, i)
        if close < 0:
            raise ValueError("unterminated quoted text")
        if statement.startswith(quote * 2, close):
            i = close + 2
            continue
        return close + 1
