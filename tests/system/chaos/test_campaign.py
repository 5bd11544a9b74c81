"""The chaos campaign's short profile, in `make test`: the split deployment with a
synchronous standby, two minutes of random operations under every kind of fault (a
failover among them), then the checker over the whole history. `make chaos` runs longer
campaigns (docs/reliability.md)."""

from __future__ import annotations

import os

import pytest

from chaos.campaign import run
from chaos.nemesis import KINDS

pytestmark = pytest.mark.slow

# A fixed seed in CI (the same operations and faults in the same order each run: a
# failure can be run again with CHAOS_SEED); `make chaos` draws one.
SEED = int(os.environ.get("CHAOS_SEED", "20261203"))


async def test_a_short_campaign_breaks_no_promise_under_every_fault() -> None:
    outcome = await run(float(os.environ.get("CHAOS_MINUTES", "2")), SEED, failover=True)
    report = "\n".join(outcome.lines)
    assert set(KINDS) | {"failover"} <= set(outcome.report.faults), report
    assert outcome.report.ops["append ok"] > 100, report
    assert outcome.report.ops["turn ok"] > 20, report
    assert outcome.report.violations == [], report
