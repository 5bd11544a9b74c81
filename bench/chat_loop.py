"""A chat loop with the defaults (issue 29): summaries that stay ahead of the window.

The all-in-one server runs in its own process with nothing set but its database (the
offline model and summarizer, one summary worker, RUNIFOLD_AGENT_SUMMARY_LEAD's default),
and one conversation is driven through the Python client, one turn after another, each
turn's input a user message, window 16. Loops:

- REQUIRE, paced (one turn a second in the full run, five in the quick one): the seed's
  refusal is asked for, so every turn that found unsummarized entries outside its window
  would be a SUMMARY_REQUIRED; a refused turn waits for the queue and is sent again.
  Goal: 0 refusals (the background queue keeps the summary ahead).
- REQUIRE, back to back: the same with no pause, the queue's hardest case.
- the client's defaults (AUTO), back to back: errors (goal 0), and the turns that had to
  summarize within themselves because the queue had fallen behind.
- the baseline: a server with RUNIFOLD_AGENT_SUMMARY_LEAD=0 (no job ahead: a job only for
  a refused turn, as before issue 29), REQUIRE and AUTO back to back: the refusals, and
  the turns that summarize within themselves, that the jobs ahead take away.

Per loop: refusals; the prompt (the offline model says how many window messages it was
given verbatim and whether a summary came with them: never more than the window plus one
summary block; its input tokens over the loop, flat once the window is full); the summary
queue's lag (before each turn, whether a job of the namespace was still waiting or running,
and the oldest one's age); how far ahead of the window the summary was (entries of the
window it also covered) at each turn; the turn's latency.

`python -m bench chat-loop` is the quick profile (in `make bench`);
`python -m bench chat-loop-full` (`make bench-chat-loop`) is the full one: 200 turns a
loop, the paced one at one turn a second.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from bench.common import Stats, new_database, server_process
from runifold_client import (
    AsyncClient,
    ConversationContextPolicy,
    RunifoldError,
    SummaryRequired,
    TurnResult,
)

NAMESPACE = "bench-chat-loop"
WINDOW = ConversationContextPolicy().window
_VERBATIM = re.compile(r"Context: (\d+) earlier message")
_SUMMARY = re.compile(r"Summary \(through (\d+)\)")


@dataclass
class Loop:
    """What one loop measured."""

    label: str
    turns: int = 0
    refusals: int = 0
    errors: int = 0
    inline_passes: int = 0
    turns_summarizing: int = 0
    longest_verbatim: int = 0
    over_window: int = 0
    summary_blocks: int = 0
    input_tokens: list[int] = field(default_factory=list)
    queue_busy: int = 0
    oldest_job_age_s: float = 0.0
    ahead: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0

    def rows(self) -> list[str]:
        tokens = self.input_tokens
        full = tokens[WINDOW // 2] if len(tokens) > WINDOW // 2 else 0
        half = tokens[len(tokens) // 2 - 1] if len(tokens) >= 2 else 0
        stats = Stats(f"  turn latency ({self.label})", self.latencies, self.elapsed)
        ahead = (
            f"min {min(self.ahead)}, median {statistics.median(self.ahead):.0f}"
            if self.ahead
            else "-"
        )
        return [
            f"{self.label}: {self.turns} turns in {self.elapsed:.0f} s",
            f"  refusals {self.refusals}, errors {self.errors} (goal: 0); "
            f"turns that summarized within themselves {self.turns_summarizing} "
            f"({self.inline_passes} passes)",
            f"  prompt: at most {self.longest_verbatim} window messages verbatim (window "
            f"{WINDOW}; over it: {self.over_window}) + a summary block in "
            f"{self.summary_blocks} turns; the turn's input tokens (a summarizer call within it "
            f"included) at turn {WINDOW // 2 + 1} {full}, "
            f"at turn {len(tokens) // 2} {half}, at the last {tokens[-1] if tokens else 0}, "
            f"max {max(tokens, default=0)}",
            f"  summary queue before a turn: busy in {self.queue_busy} of {self.turns} turns, "
            f"oldest job {self.oldest_job_age_s * 1000:.0f} ms; window entries the summary "
            f"also covered: {ahead}",
            stats.row(),
        ]


async def _queue_idle(client: AsyncClient, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while (await client.backlog()).depth:
        if time.monotonic() > deadline:
            raise RuntimeError("the summary queue did not drain")
        await asyncio.sleep(0.01)  # the queue's progress poll


async def _loop(
    address: str, label: str, turns: int, interval: float, policy: ConversationContextPolicy
) -> Loop:
    loop = Loop(label)
    async with AsyncClient(address, namespace=NAMESPACE) as client:
        conversation_id = (await client.create_conversation()).conversation_id
        start = time.perf_counter()
        for k in range(turns):
            if interval:
                await asyncio.sleep(max(0.0, start + k * interval - time.perf_counter()))
            backlog = await client.backlog()
            if backlog.depth:
                loop.queue_busy += 1
                loop.oldest_job_age_s = max(
                    loop.oldest_job_age_s, backlog.oldest_pending_age.ToTimedelta().total_seconds()
                )
            turn_id = str(uuid.uuid4())
            began = time.perf_counter()
            result: TurnResult | None = None
            while result is None:
                try:
                    result = await client.run_conversation(
                        f"message {k + 1}: a line of the chat",
                        conversation_id=conversation_id,
                        turn_id=turn_id,
                        policy=policy,
                    )
                except SummaryRequired:
                    loop.refusals += 1
                    await _queue_idle(client)  # then the same turn again, as a chat resends
                except RunifoldError:
                    loop.errors += 1  # any other failure: counted, and the loop goes on
                    break
            if result is None:
                continue
            loop.latencies.append(time.perf_counter() - began)
            loop.turns += 1
            verbatim = _VERBATIM.search(result.text)
            count = int(verbatim[1]) if verbatim else 0
            loop.longest_verbatim = max(loop.longest_verbatim, count)
            loop.over_window += count > WINDOW
            loop.summary_blocks += bool(_SUMMARY.search(result.text))
            loop.input_tokens.append(result.outcome.usage.input_tokens)
            context = result.context
            if context is not None:
                loop.inline_passes += context.summary_passes
                loop.turns_summarizing += context.summary_passes > 0
                if context.summary_through_sequence:
                    loop.ahead.append(
                        context.summary_through_sequence - context.window_first_sequence + 1
                    )
        loop.elapsed = time.perf_counter() - start
    return loop


async def _run(postgres_url: str, turns: int, paced: float, title: str) -> list[str]:
    url = new_database(postgres_url)
    lines = [f"## A chat loop with the defaults: summaries ahead of the window ({title})", ""]
    require = ConversationContextPolicy().with_summary_required()
    auto = ConversationContextPolicy()
    with tempfile.TemporaryDirectory(prefix="runifold-bench-chat-") as data:
        async with server_process("services", url, {"RUNIFOLD_DATA_DIR": data}) as address:
            loops = [
                await _loop(address, f"REQUIRE, {1 / paced:.0f} turn(s)/s", turns, paced, require),
                await _loop(address, "REQUIRE, back to back", turns, 0.0, require),
                await _loop(address, "client defaults (AUTO), back to back", turns, 0.0, auto),
            ]
        # The baseline: no job ahead (a job only for a refused turn), as before issue 29.
        off = {"RUNIFOLD_DATA_DIR": data, "RUNIFOLD_AGENT_SUMMARY_LEAD": "0"}
        async with server_process("services", url, off) as address:
            loops += [
                await _loop(
                    address, "baseline, lead 0: REQUIRE, back to back", turns, 0.0, require
                ),
                await _loop(address, "baseline, lead 0: AUTO, back to back", turns, 0.0, auto),
            ]
    for loop in loops:
        lines += loop.rows()
    return lines


async def run(postgres_url: str) -> list[str]:
    """The quick profile (in `make bench`): 40 turns a loop (30 past the tenth, where a
    loop was refused before issue 29), the paced one at five turns a second."""
    return await _run(postgres_url, 40, 0.2, "quick: 40 turns a loop")


async def full(postgres_url: str) -> list[str]:
    """The full profile: 200 turns a loop, the paced one at one turn a second."""
    return await _run(postgres_url, 200, 1.0, "full: 200 turns a loop")
