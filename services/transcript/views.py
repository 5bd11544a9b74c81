"""The cut of a turn's bounded view (TranscriptService.load_view): the entries read
split into window, summary buffer and backlog, keeping tool call groups whole.
Pure rules: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.domain import Entry, Role
from services.transcript.model import AppendRecord, Conversation, View


def _tool_group_start(roles: Mapping[int, Role], position: int, lowest: int) -> int:
    """First sequence of the tool call group a tool result at `position` belongs to.

    Walks back over tool results to the assistant message that made the calls,
    never below `lowest`.
    """
    current = position
    while current > lowest and roles.get(current) == Role.TOOL:
        current -= 1
    return current


def split_view(
    incarnation: int,
    version: int,
    last: int,
    entries: Sequence[Entry],
    roles: Mapping[int, Role],
    window_low: int,
    summary_batch: int,
    summarized_through: int,
    bound: int,
    prior: AppendRecord | None,
    conversation: Conversation | None = None,
) -> View:
    """Cut the entries read into window, buffer and backlog, keeping tool groups whole.

    Retracted entries take part in the cut like any other (they never hold tool
    calls or results), then leave the window; the buffer keeps them, marked, so
    that what a summary covers stays one contiguous range.
    """
    by_sequence = {entry.sequence: entry for entry in entries}
    start = window_low
    if last and roles[start] == Role.TOOL:
        after_results = start
        while after_results <= last and roles[after_results] == Role.TOOL:
            after_results += 1
        start = (
            after_results
            if after_results <= last
            else _tool_group_start(roles, start, max(1, window_low - bound))
        )
    window_entries = (
        [by_sequence[s] for s in range(start, last + 1) if not by_sequence[s].retracted_version]
        if last
        else []
    )

    region_end = start - 1 if last else 0
    buffer: list[Entry] = []
    backlog = 0
    if summarized_through < region_end:
        end = min(summarized_through + summary_batch, region_end)
        if end < region_end and roles[end + 1] == Role.TOOL:
            group_start = _tool_group_start(roles, end + 1, summarized_through + 1)
            if group_start - 1 > summarized_through:
                end = group_start - 1
            else:
                while end + 1 <= region_end and roles[end + 1] == Role.TOOL:
                    end += 1
        buffer = [by_sequence[s] for s in range(summarized_through + 1, end + 1)]
        backlog = region_end - end
    return View(version, last, window_entries, buffer, backlog, prior, incarnation, conversation)


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint, non-empty inclusive ranges covering the given ones."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(r for r in ranges if r[0] <= r[1]):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged
