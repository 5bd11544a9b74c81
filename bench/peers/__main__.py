"""`make bench-peers`: Runifold against LangGraph, Google ADK and raw psycopg.

Everything runs on one PostgreSQL (DATABASE_URL, or pgserver in a temporary
folder), each system in a database of its own, one after the other, in this
run. Runifold is measured from this process through gRPC against its servers
(their own processes); the peers run in `.venv-peers` (bench/peers/runner.py),
whose pinned packages would clash with the project's pins (see
bench/peers/requirements.txt). The workloads are in bench/peers/workload.py.

Results: a JSON file and PNG plots under docs/img/ (matplotlib, in
`.venv-peers`), and markdown tables with the ratios printed here.

    python -m bench.peers [--sizes 3000,30000]
        [--only raw,langgraph,adk,ours,search,checkpointers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import new_database, postgres
from bench.peers import checkpointers, ours
from bench.peers.workload import SIZES

ROOT = Path(__file__).resolve().parents[2]
PEERS_PYTHON = os.environ.get("RUNIFOLD_PEERS_PYTHON", str(ROOT / ".venv-peers/bin/python"))
PEERS = ("raw", "langgraph", "adk")


def _peer(kind: str, system: str, url: str, sizes: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [PEERS_PYTHON, "-m", "bench.peers.runner", kind, system, url, sizes],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    print(f"({kind} {system}: {time.perf_counter() - started:.0f} s)", flush=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = next(
            int(line.split()[1]) // (1024 * 1024)
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        memory = 0
    return (
        f"{os.cpu_count()} vCPU ({cpu}), {memory} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, PostgreSQL 16 (pgserver)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--only", default="raw,ours,langgraph,adk,search,checkpointers")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img/bench-peers.json")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    only = set(args.only.split(","))
    report: dict[str, Any] = {
        "machine": _machine(),
        "conversations": [],
        "search": [],
        "checkpointers": [],
    }
    with postgres() as url:
        for system in ("raw", "ours", "langgraph", "adk"):
            if system not in only:
                continue
            database = new_database(url)
            if system == "ours":
                result = asyncio.run(ours.conversations(database, sizes))
            else:
                result = _peer("conversations", system, database, args.sizes)
            report["conversations"].append(result)
        if "search" in only:
            report["search"].append(asyncio.run(ours.search(new_database(url))))
            report["search"].append(_peer("search", "langgraph", new_database(url), args.sizes))
        if "checkpointers" in only:
            # Both savers run here: the project's environment holds LangGraph and PostgresSaver.
            report["checkpointers"].append(
                asyncio.run(checkpointers.postgres_saver(new_database(url)))
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    subprocess.run(
        [PEERS_PYTHON, "-m", "bench.peers.plots", str(args.out), str(args.out.parent)],
        cwd=ROOT,
        check=True,
    )
    for line in tables(report):
        print(line)


def tables(report: dict[str, Any]) -> list[str]:
    """Markdown tables of a report, with every peer's ratio to Runifold."""
    lines = [f"Measured on: {report['machine']}", ""]
    rows = report["conversations"]
    ours_row = next((r for r in rows if r["system"].startswith("Runifold")), None)
    for size in sorted({s for r in rows for s in r["sizes"]}, key=int):
        lines += [
            f"### {int(size):,} events",
            "",
            "| system | append events/s | append p50 ms | p99 ms | load last 16 p50 ms "
            "| load all p50 ms | Runifold's advantage (append / last 16 / all) |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            if size not in r["sizes"]:
                continue
            m = r["sizes"][size]
            ratio = ""
            if ours_row is not None and r is not ours_row and size in ours_row["sizes"]:
                o = ours_row["sizes"][size]
                ratio = (
                    f"{o['append']['rate_per_s'] / m['append']['rate_per_s']:.2f}x / "
                    f"{m['load_last16']['p50_ms'] / o['load_last16']['p50_ms']:.2f}x / "
                    f"{m['load_all']['p50_ms'] / o['load_all']['p50_ms']:.2f}x"
                )
            lines.append(
                f"| {r['system']} | {m['append']['rate_per_s']:,.0f} | "
                f"{m['append']['p50_ms']:.1f} | {m['append']['p99_ms']:.1f} | "
                f"{m['load_last16']['p50_ms']:.2f} | {m['load_all']['p50_ms']:.1f} | {ratio} |"
            )
        lines.append("")
    lines += ["| system | storage after the run (MiB) |", "|---|---:|"]
    lines += [f"| {r['system']} | {r['storage_bytes'] / 2**20:,.1f} |" for r in rows]
    if report["search"]:
        lines += [
            "",
            "| system | facts | ingest facts/s | search p50 ms | p99 ms | searches/s (4 in flight) "
            "| recall@5 | short answers |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["search"]:
            lines.append(
                f"| {r['system']} | {r['facts']:,} | {r['ingest_rate_per_s']:,.0f} | "
                f"{r['search_1']['p50_ms']:.1f} | {r['search_1']['p99_ms']:.1f} | "
                f"{r['search_4']['rate_per_s']:,.0f} | {r['recall_at_5']:.3f} | "
                f"{r['short_answers']} |"
            )
    if report.get("checkpointers"):
        lines += ["", *checkpointers.table(report["checkpointers"])]
    return lines


if __name__ == "__main__":
    main()
