"""JSON texts on either side of PostgreSQL's jsonb rules: test_jsonb_rules.py checks
services/common/jsonb.py against them, test_jsonb_rules_on_postgres.py PostgreSQL itself."""

from __future__ import annotations

# PostgreSQL's ::jsonb refuses each of these (Python's json.loads takes all but one).
REFUSED = {
    "lone high surrogate": '{"a": "\\ud800"}',
    "lone low surrogate": '{"a": "\\udc00"}',
    "high surrogate then another escape": '["\\ud83d\\u0041"]',
    "high surrogate then a character": '["\\ud83dx"]',
    "two high surrogates": '["\\ud83d\\ud83d\\ude00"]',
    "surrogate in a key": '{"\\udfff": 1}',
    "surrogate under a duplicate key": '{"a": "\\ud800", "a": 1}',
    "nul escape": '{"a": "x\\u0000"}',
    "number above numeric": "1e1000000",
    "number below numeric": "-1e1000000",
    "first power of ten above numeric": "1e131072",
    "too many digits": "1" * 131073,
    "scale above numeric": "1e-16384",
    "written scale above numeric": "1.5e-16383",
    "scale above numeric without an exponent": "0." + "0" * 16383 + "1",
    "zero with too large a scale": "0e-16384",
    "zero with too large an exponent": "0e1073741824",
    "exponent beyond int's digits": "1e" + "9" * 5000,
}
ACCEPTED = {
    "surrogate pair": '{"a": "\\ud83d\\ude00"}',
    "surrogate pair in capitals": '"\\uD83D\\uDE00"',
    "escaped backslash before u0000": '"\\\\u0000"',
    "escaped backslash before ud800": '"\\\\ud800"',
    "large number": "1e300",
    "largest power of ten": "1e131071",
    "smallest scale": "1e-16383",
    "largest scale without an exponent": "0." + "0" * 16382 + "1",
    "zero with the largest exponent": "0e1073741823",
    "integer beyond Python's 4300 digits": "9" * 5000,
    "negative zero": "-0",
    "brackets in strings": '"[[[[[[[[[["',
}
