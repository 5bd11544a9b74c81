"""SummaryService's metrics: the job queue and the summarizer's passes (names and labels
bounded, as services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SUMMARY_JOBS_DEPTH = Gauge(
    "runifold_summary_jobs_depth",
    "Summary jobs waiting or running.",
)
SUMMARY_JOBS_OLDEST_AGE = Gauge(
    "runifold_summary_jobs_oldest_age_seconds",
    "Age of the oldest waiting or running summary job.",
)
SUMMARY_JOBS_FAILED = Gauge(
    "runifold_summary_jobs_failed",
    "Summary jobs parked after too many failed attempts.",
)
SUMMARY_JOB_FAILURES = Counter(
    "runifold_summary_job_failures_total",
    "Failed summary job attempts (retried, or parked after the last attempt).",
    ["outcome"],
)
SUMMARY_JOBS_COMPLETED = Counter(
    "runifold_summary_jobs_completed_total",
    "Summary jobs completed by the background workers.",
)
SUMMARY_PASSES = Counter(
    "runifold_summary_passes_total",
    "Summarizer passes that committed a summary.",
)
