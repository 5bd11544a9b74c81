"""PostgreSQL's jsonb input rules, mirrored: what `::jsonb` accepts, we accept.

A client's JSON that breaks one of these rules must be refused at the boundary
(INVALID_ARGUMENT naming the field, services/common/validation.py), not by the
database: PostgreSQL's error carries the document's text in its CONTEXT, and a
database error looks like a fault of ours (INTERNAL). PostgreSQL 16 parses JSON
text by RFC 8259, as Python's json module does (whitespace, number grammar, string
escapes, raw control characters refused, duplicate keys allowed), and refuses
besides (src/backend/utils/adt/jsonfuncs.c, common/jsonapi.c, numeric.c):

- a `\\u` escape of a lone UTF-16 surrogate: a high one (D800-DBFF) not followed at
  once by the `\\u` escape of a low one (DC00-DFFF), or a low one on its own
  ("Unicode low surrogate must follow a high surrogate"); Python decodes them to
  surrogate code points, which no UTF-8 text can hold;
- the escape `\\u0000` ("unsupported Unicode escape sequence": text cannot hold NUL);
- a number that does not fit `numeric` ("value overflows numeric format"): its
  leading digit at most at 10^131071 (the weight, an int16 count of base-10000
  digits: 131072 digits before the point), at most 16383 digits after the point
  (the display scale, 14 bits: the digits written after the point, trailing zeros
  too, minus the exponent), and an exponent within +-1073741823 (INT32_MAX / 2),
  even for a zero;
- nesting deeper than the server's stack allows (max_stack_depth: at the default
  2 MB, 10,000 levels pass and 100,000 do not). Ours is an explicit, much lower limit
  (RUNIFOLD_MAX_JSON_DEPTH), which also keeps Python's recursive parser and every
  later reader of the document far from their own limits.

Python's json module differs otherwise only where it is more lenient (NaN and
Infinity) or stricter (integers beyond 4300 digits); both are handled here.
tests/common/jsonb/test_jsonb_rules_on_postgres.py compares these rules with PostgreSQL's own
`::jsonb` on generated documents.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from itertools import accumulate
from typing import Any

# The default nesting limit of a client's JSON document (RUNIFOLD_MAX_JSON_DEPTH)
# and the range it may be set in: below Python's recursion limit (1000 frames,
# of which a request's handler uses about a hundred) and PostgreSQL's stack.
MAX_DEPTH = 128
DEPTH_RANGE = (1, 512)

# numeric's limits (PostgreSQL's numeric.c): the leading digit's decimal position
# (the int16 weight counts base-10000 digits: 4 * 32768 - 1), the display scale
# (NUMERIC_DSCALE_MAX, 14 bits) and the exponent numeric_in reads (PG_INT32_MAX / 2).
_LEADING_POSITION_MAX = 4 * 32768 - 1
_DSCALE_MAX = 0x3FFF
_EXPONENT_MAX = (2**31 - 1) // 2

# Escapes, looked for once `\\\\` (an escaped backslash) is blanked out, so that each
# backslash left starts an escape: a high surrogate not followed at once by a low one,
# a low one not preceded at once by a high one, and \u0000.
_HEX = "[0-9A-Fa-f]"
_LOW = rf"[c-fC-F]{_HEX}{{2}}"
_BAD_ESCAPE = re.compile(
    rf"\\u(?:[dD](?:[89abAB]{_HEX}{{2}}(?!\\u[dD]{_LOW})"
    rf"|(?<!\\u[dD][89abAB]{_HEX}{{2}}\\u[dD]){_LOW})|0000)"
)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
# A number token of the JSON grammar this short and without an exponent always fits
# numeric (it is checked otherwise).
_SHORT_NUMBER = 32


class JsonbRefused(ValueError):
    """A JSON text PostgreSQL's jsonb would refuse; the message says why (no content).
    `max_depth` is set when it nests too deep."""

    def __init__(self, message: str, max_depth: int | None = None) -> None:
        super().__init__(message)
        self.max_depth = max_depth


def parse(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON text that jsonb accepts, nested at most `max_depth` levels
    (an array or object counts one, a scalar none); numbers as json.loads makes them
    (an integer beyond the 4300 digits of Python's int() as a Decimal). Raises
    JsonbRefused saying which rule it breaks."""
    if "\x00" in text or _surrogates(text):
        raise JsonbRefused("must not hold NUL characters or UTF-16 surrogates")
    # Counting brackets is cheap; only a text with more of them than the limit is walked.
    if text.count("[") + text.count("{") > max_depth and depth(text) > max_depth:
        raise JsonbRefused(f"nests deeper than {max_depth} levels", max_depth)
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float)
    except JsonbRefused:
        raise
    except RecursionError:
        raise JsonbRefused("must be a JSON document") from None
    except ValueError:
        # Not JSON, or an integer of more than 4300 digits, which int() refuses and
        # numeric takes: once more, every number checked.
        try:
            value = json.loads(
                text, parse_constant=_constant, parse_float=_number, parse_int=_number
            )
        except JsonbRefused:
            raise
        except (ValueError, RecursionError):
            raise JsonbRefused("must be a JSON document") from None
    if ("\\u" in text) and (bad := _BAD_ESCAPE.search(text.replace("\\\\", "__"))):
        if bad[0].endswith("0000"):
            raise JsonbRefused("must not hold the escape \\u0000 (text cannot hold NUL)")
        raise JsonbRefused(
            "must not hold a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair)"
        )
    return value


def depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar). Counted
    on the text, so that a deep document is refused before Python's recursive parser
    meets it; strings are skipped: with escaped backslashes and quotes blanked out,
    every other quote opens or closes one."""
    unquoted = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unquoted.split('"')[::2])
    brackets = _NOT_BRACKET.sub("", outside)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def fits_numeric(token: str) -> bool:
    """Whether PostgreSQL's numeric takes a number of the JSON grammar (`token`)."""
    mantissa, _, exponent_text = token.lower().partition("e")
    negative = exponent_text.startswith("-")
    exponent_digits = exponent_text.lstrip("+-").lstrip("0")
    if len(exponent_digits) > len(str(_EXPONENT_MAX)):  # int() refuses 4300 digits
        return False
    exponent = int(exponent_digits or "0")
    if exponent > _EXPONENT_MAX:
        return False
    exponent = -exponent if negative else exponent
    whole, _, fraction = mantissa.lstrip("-").partition(".")
    if len(fraction) - exponent > _DSCALE_MAX:
        return False
    digits = whole + fraction
    significant = digits.lstrip("0")
    if not significant:
        return True  # a zero: only its scale and exponent are limited
    leading = len(whole) - 1 - (len(digits) - len(significant)) + exponent
    return leading <= _LEADING_POSITION_MAX


def _float(token: str) -> float:
    """A number with a fraction or an exponent (json.loads's parse_float), checked."""
    if len(token) > _SHORT_NUMBER or "e" in token or "E" in token:
        _number(token)
    return float(token)


def _number(token: str) -> Decimal:
    if not fits_numeric(token):
        raise JsonbRefused(
            "holds a number beyond PostgreSQL's numeric (at most 131072 digits before "
            "the point and 16383 after it)"
        )
    return Decimal(token)


def _constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _surrogates(text: str) -> bool:
    """True when a str holds a surrogate code point (never one decoded from UTF-8)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
