"""AgentService's metrics: turns and their outcomes (names and labels bounded, as
services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter

TURN_CONFLICTS = Counter(
    "runifold_turn_conflicts_total",
    "Turns whose append lost the race after the model call (TURN_CONFLICT).",
)
SUMMARY_REQUIRED = Counter(
    "runifold_summary_required_total",
    "Turns refused with SUMMARY_REQUIRED or SUMMARY_BACKLOG.",
    ["reason"],
)
SUMMARY_AHEAD = Counter(
    "runifold_summary_ahead_requests_total",
    "Summary jobs asked for after a committed turn to keep the summary ahead of the "
    "window (RUNIFOLD_AGENT_SUMMARY_LEAD), by outcome: requested, or failed (the turn "
    "stands; the next one asks again).",
    ["outcome"],
)
TURNS = Counter(
    "runifold_turns_total",
    "Turns run, by outcome.",
    ["outcome"],
)
MODEL_OUTPUT_INVALID = Counter(
    "runifold_model_output_invalid_total",
    "Turns whose model reply broke the transcript's limits (MODEL_OUTPUT_INVALID).",
)
TURN_WRITE_RETRIES = Counter(
    "runifold_turn_write_retries_total",
    "A turn's commit (what=commit) or the release that keeps its outcome (what=release) "
    "sent again after TranscriptService or its database was unavailable: model work "
    "that completed, kept through a blip.",
    ["what"],
)
CURATION_REQUESTS = Counter(
    "runifold_agent_curation_requests_total",
    "Curation requests sent after committed turns whose policy says CURATION_MODE_AUTO, by "
    "outcome: requested (queued, or joined the conversation's waiting job), refused "
    "(RESOURCE_EXHAUSTED: the namespace's curation queue is full or at its limit), failed "
    "(MemoryService unreachable after the retries, or another error), dropped (too many "
    "requests in flight in this process). A lost request is made up for by the "
    "conversation's next AUTO turn: a job curates every entry after curated_through.",
    ["outcome"],
)
