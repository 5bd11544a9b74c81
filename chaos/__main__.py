"""`python -m chaos [--minutes M] [--seed S] [--failover] [--keep]`: one campaign, its
report, and exit status 1 on any violation. CHAOS_MINUTES and CHAOS_SEED are the
defaults of --minutes and --seed."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys

from chaos.campaign import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos")
    parser.add_argument(
        "--minutes", type=float, default=float(os.environ.get("CHAOS_MINUTES", "2"))
    )
    parser.add_argument(
        "--seed", type=int, default=int(os.environ.get("CHAOS_SEED", random.randrange(1 << 30)))
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help="a primary with a synchronous standby, failed over once",
    )
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--keep", action="store_true", help="keep the history and logs")
    args = parser.parse_args()
    # The fake model's web server logs every connection the proxies reset, with a
    # traceback: the faults the campaign injects, not errors of the campaign.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    print(
        f"chaos campaign: {args.minutes:g} min, seed {args.seed}, failover {args.failover}",
        flush=True,
    )
    outcome = asyncio.run(
        run(args.minutes, args.seed, failover=args.failover, workers=args.workers, keep=args.keep)
    )
    for line in outcome.lines:
        print(line)
    sys.exit(1 if outcome.report.violations else 0)


if __name__ == "__main__":
    main()
