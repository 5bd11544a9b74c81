"""Plots of a `make bench-peers` report (matplotlib, in `.venv-peers`).

    python -m bench.peers.plots docs/img/bench-peers.json docs/img

writes bench-peers-append.png, bench-peers-load.png and bench-peers-search.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# One colour per system, the same in every plot.
_COLOURS = {"Runifold": "#1b6ca8", "raw": "#7f7f7f", "LangGraph": "#e07b39", "Google": "#3a9e5c"}


def _colour(name: str) -> str:
    return next((c for prefix, c in _COLOURS.items() if name.startswith(prefix)), "#9b59b6")


def _short(name: str) -> str:
    return (
        name.replace(" (gRPC)", "\n(gRPC)")
        .replace("Google ADK DatabaseSessionService", "ADK\nDatabaseSessionService")
        .replace("LangGraph PostgresSaver", "LangGraph\nPostgresSaver")
        .replace("Runifold TranscriptService", "Runifold\nTranscriptService")
    )


def _bars(ax: Any, rows: list[dict[str, Any]], value: Any, title: str, unit: str) -> None:
    sizes = sorted({s for r in rows for s in r["sizes"]}, key=int)
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs = [k + i * width for k in range(len(sizes))]
        ys = [value(row["sizes"][s]) if s in row["sizes"] else 0 for s in sizes]
        bars = ax.bar(xs, ys, width, label=_short(row["system"]), color=_colour(row["system"]))
        ax.bar_label(bars, labels=[f"{y:,.1f}" if y < 10 else f"{y:,.0f}" for y in ys], size=7)
    ax.set_xticks([k + width * (len(rows) - 1) / 2 for k in range(len(sizes))])
    ax.set_xticklabels([f"{int(s):,} events" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel(unit)
    ax.set_title(title, size=10)


def _legend(fig: Any, ax: Any) -> None:
    """One legend under the plots, on one row."""
    handles, labels = ax.get_legend_handles_labels()
    labels = [label.replace("\n", " ") for label in labels]
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=len(labels),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.03),
    )


def main(report_path: str, out_dir: str) -> None:
    report = json.loads(Path(report_path).read_text())
    out = Path(out_dir)
    rows = report["conversations"]
    caption = f"measured on {report['machine']}"

    fig, ax = plt.subplots(figsize=(9, 4.8))
    _bars(
        ax,
        rows,
        lambda m: m["append"]["rate_per_s"],
        "Append throughput, 4 writers, one event per call (higher is better)",
        "events/s (log)",
    )
    _legend(fig, ax)
    fig.text(0.01, 0.01, caption, size=6)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out / "bench-peers-append.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    _bars(
        axes[0],
        rows,
        lambda m: m["load_last16"]["p50_ms"],
        "Load the last 16 events, p50 (lower is better)",
        "ms (log)",
    )
    _bars(
        axes[1],
        rows,
        lambda m: m["load_all"]["p50_ms"],
        "Load the whole conversation, p50 (lower is better)",
        "ms (log)",
    )
    _legend(fig, axes[0])
    fig.text(0.01, 0.01, caption, size=6)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out / "bench-peers-load.png", dpi=110)
    plt.close(fig)

    if report["search"]:
        searches = report["search"]
        names = [
            _short(s["system"])
            .replace(" (gRPC, Qdrant Edge)", "\n(gRPC, Qdrant Edge)")
            .replace(" AsyncPostgresStore (pgvector)", "\nAsyncPostgresStore (pgvector)")
            for s in searches
        ]
        fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
        panels: list[tuple[list[float], str]] = [
            ([s["search_1"]["p50_ms"] for s in searches], "Search p50, 1 in flight (ms)"),
            ([s["search_4"]["rate_per_s"] for s in searches], "Searches/s, 4 in flight"),
            ([s["recall_at_5"] for s in searches], "recall@5 vs exact cosine"),
        ]
        for ax, (ys, title) in zip(axes, panels, strict=True):
            bars = ax.bar(names, ys, color=[_colour(s["system"]) for s in searches])
            ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], size=8)
            ax.set_title(title, size=10)
            ax.tick_params(axis="x", labelsize=7)
        facts = searches[0]["facts"]
        fig.suptitle(f"Semantic search, {facts:,} facts in 10 tenants, limit 5", size=11)
        fig.text(0.01, 0.01, caption, size=6)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out / "bench-peers-search.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
