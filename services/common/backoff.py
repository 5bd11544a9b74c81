"""Capped exponential backoff, optionally jittered, for every retry loop of the services."""

from __future__ import annotations

import random

# 2.0 ** 1024 overflows a float; no delay needs more than this many doublings.
_MAX_EXPONENT = 64


def backoff(
    exponent: int,
    *,
    base_s: float,
    max_s: float,
    jitter: float = 0.0,
    max_exponent: int = _MAX_EXPONENT,
) -> float:
    """`base_s * 2**exponent` seconds (exponent clamped to 0..max_exponent), at most `max_s`.

    With `jitter`, the delay is scaled by a random factor in [1 - jitter, 1], so
    that clients which failed together (an outage) do not retry together.
    """
    delay = min(max_s, base_s * 2.0 ** min(max(0, exponent), max_exponent))
    if jitter:
        delay *= random.uniform(1.0 - jitter, 1.0)
    return delay
