"""Summaries that stay ahead: when a committed turn asks the background queue for a
summary, and how far that summary reaches. Pure rules: no I/O.

A view refuses (SUMMARY_REQUIRED) or summarizes within the turn (AUTO) only when
entries outside its window are not summarized. Each turn pushes its own entries' worth
of old ones out of the window, so a queue that summarizes exactly what already left
is always one turn late. Instead, after a turn commits, the agent asks for a job that
summarizes everything outside a window `lead` entries smaller than the turn's: the
summary then also covers the oldest `lead` entries of the next windows, which leave
them over the next turns. The summary only ever covers a prefix of the transcript
(entries are immutable once appended: a summary never races with an append); the
window still gives the model its `window` newest entries verbatim, so the prompt stays
one summary plus one window (docs/summary.md).

A job is asked for once the summary is no more than half the lead ahead: with two
entries a turn and a lead of 8, one job every two turns, each summarizing about four
entries, and a job has three turns to run before a view would find anything
unsummarized outside its window.
"""

from __future__ import annotations


def effective_lead(window: int, lead: int) -> int:
    """The lead a window allows: at most half of it (the newer half of a window is never
    also in the summary: the prompt repeats, summarized, at most half of what it shows
    verbatim), never negative."""
    return max(0, min(lead, window // 2))


def summary_ahead(summarized_through: int, last_sequence: int, window: int) -> int:
    """How many entries of the window a view at `last_sequence` would show that the
    summary already covers; negative: that many entries outside the window are not
    summarized (the view's summary buffer, tool call groups aside)."""
    return summarized_through - (last_sequence - window)


def job_window_ahead(
    window: int, lead: int, summarized_through: int, last_sequence: int
) -> int | None:
    """The window of the job that puts the summary `lead` entries ahead of the turn's
    `window`, when one is due after an append that left the transcript at
    `last_sequence`; None when none is (the lead is off, the summary is more than half
    the lead ahead, or the job would find nothing to summarize)."""
    if lead <= 0:
        return None
    reach = effective_lead(window, lead)
    if summary_ahead(summarized_through, last_sequence, window) > reach // 2:
        return None
    job_window = window - reach
    if last_sequence - job_window <= summarized_through:
        return None  # everything outside the job's window is summarized already
    return job_window
