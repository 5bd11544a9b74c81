"""The bounded view of a turn (LoadView): the ranges a view reads, and the cut of the
entries read into window, summary buffer and backlog, keeping tool call groups whole.
Pure rules: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.domain import Entry, Role
from services.transcript.conversations.model import AppendRecord, Conversation, Segment


@dataclass(frozen=True, slots=True)
class ViewRead:
    """What the store reads for a view in one round trip (see ViewStore.read_view)."""

    version: int
    last_sequence: int
    entries: Sequence[Entry]
    prior_append: AppendRecord | None
    incarnation: int = 0
    conversation: Conversation | None = None


@dataclass(frozen=True, slots=True)
class View:
    """The bounded context of a turn, consistent with `version`."""

    version: int
    last_sequence: int
    window: Sequence[Entry]
    summary_buffer: Sequence[Entry]
    summary_backlog: int
    prior_append: AppendRecord | None
    incarnation: int = 0
    conversation: Conversation | None = None


def view_ranges(
    last: int, window: int, summary_batch: int, summarized_through: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two sequence ranges a view reads at a transcript's `last` sequence: the window
    [low, last] with low = max(1, last - window + 1), and the naive summary buffer
    [summarized_through + 1, min(summarized_through + summary_batch + 1, low - 1)] (one
    entry past the batch, to see whether its end cuts a tool group). An empty range has
    low > high. The PostgreSQL store computes the same in SQL (statements.VIEW_SQL),
    inside the statement that reads `last`, so that a view stays one round trip."""
    low = max(1, last - window + 1)
    return (low, last), (
        summarized_through + 1,
        min(summarized_through + summary_batch + 1, low - 1),
    )


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


@dataclass(frozen=True, slots=True)
class PrefixPiece:
    """A range of a fork's shared prefix and where it lies: the conversation `key` holds
    entries low..high of it; a retraction counts when its version is at most `cap`; that
    conversation's appends for the segment end at sequence `end`; `next_key` holds the next
    segment (or is the fork itself), whose fork append wrote the entries a fork point cut
    from an append."""

    key: int
    low: int
    high: int
    cap: int
    end: int
    next_key: int


def prefix_pieces(
    prefix: Sequence[Segment], own_key: int, ranges: Sequence[tuple[int, int]]
) -> list[PrefixPiece]:
    """The pieces of the inclusive ranges that lie in a fork's shared prefix, in sequence
    order (one per segment each range crosses: at most the lineage's depth)."""
    pieces: list[PrefixPiece] = []
    for low, high in merge_ranges(list(ranges)):
        start = 0
        for index, segment in enumerate(prefix):
            piece_low, piece_high = max(low, start + 1), min(high, segment.through_sequence)
            if piece_low <= piece_high:
                following = prefix[index + 1].key if index + 1 < len(prefix) else own_key
                pieces.append(
                    PrefixPiece(
                        segment.key,
                        piece_low,
                        piece_high,
                        segment.through_version,
                        segment.through_sequence,
                        following,
                    )
                )
            start = segment.through_sequence
    return pieces
