"""Measurement helpers that need nothing but the standard library.

bench/peers/workload.py runs in `.venv-peers` as well as in the project's virtual
environment, and bench/edge_rss.py measures its own process: both use these
without importing gRPC, psycopg or the services.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path


def percentile_ms(latencies: Sequence[float], q: float) -> float:
    """The q-quantile (0..1, nearest rank below) of latencies in seconds, in ms; 0 if none."""
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def median_ms(latencies: Sequence[float]) -> float:
    """The median of latencies in seconds, in ms; 0 if none."""
    return statistics.median(latencies) * 1000 if latencies else 0.0


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process in MiB (Linux /proc), None when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
