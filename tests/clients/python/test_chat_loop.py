"""A chat loop that never stumbles (issue 29): a plain loop of turns through the Python
client with its defaults, and `runifold chat` typed into line after line under a
pseudo-terminal, against `python -m services` started with nothing but its database (the
server's defaults, the offline model: what `make run` serves). Before issue 29, the
tenth turn of either was refused with SUMMARY_REQUIRED, and every other turn after it.
The seed's semantics stay available: a turn that asks for REQUIRE is still refused when
the summary is behind its window, and the same turn goes through once the job ran.

The offline model answers with what it was given ("Context: N earlier message(s) in the
window", "Summary (through S)"), so each answer shows the prompt the turn built.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from runifold_client import (
    AsyncClient,
    Client,
    ConversationContextPolicy,
    SummaryRequired,
    TurnResult,
)
from tests.support.process import ServiceProcess, service_process
from tests.support.tools import ROOT
from tests.support.waiting import wait_for

TURNS = 30
CHAT_LINES = 20
WINDOW = ConversationContextPolicy().window
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_VERBATIM = re.compile(r"Context: (\d+) earlier message")
_SUMMARY = re.compile(r"Summary \(through (\d+)\)")


def prompt_of(result: TurnResult) -> tuple[int, int | None]:
    """What the offline model was given: the window messages verbatim before the input,
    and the summary block's through_sequence (None: no summary block)."""
    verbatim = _VERBATIM.search(result.text)
    assert verbatim, result.text
    summary = _SUMMARY.search(result.text)
    return int(verbatim[1]), int(summary[1]) if summary else None


@pytest.fixture(scope="module")
async def server(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServiceProcess]:
    env = {"DATABASE_URL": shared_database_url}
    async with service_process(
        "services", env, tmp_path_factory.mktemp("chat-loop"), timeout=180
    ) as process:
        yield process


async def test_a_chat_loop_with_the_client_defaults_never_stumbles(
    server: ServiceProcess, namespace: str
) -> None:
    def chat() -> list[TurnResult]:
        results: list[TurnResult] = []
        with Client(server.address, namespace=namespace) as client:
            conversation_id = ""
            for k in range(1, TURNS + 1):
                result = client.run_conversation(f"message {k}", conversation_id=conversation_id)
                conversation_id = result.conversation_id
                results.append(result)
        return results

    results = await asyncio.to_thread(chat)  # the blocking client, as a script uses it

    # 0 errors: every turn answered (a SummaryRequired or any other error would have
    # ended the loop), each once.
    assert [r.last_sequence for r in results] == [2 * k for k in range(1, TURNS + 1)]
    for k, result in enumerate(results, start=1):
        context = result.context
        assert context is not None
        verbatim, summary_through = prompt_of(result)
        # The prompt: the default window's newest entries verbatim (never cut for the
        # summary ahead, never more) plus at most one summary block, the one the turn
        # reports, which covers everything before the window.
        assert verbatim == min(2 * (k - 1), WINDOW), f"turn {k}: {result.text}"
        if verbatim:  # turn 1's window is empty (0..0)
            assert context.window_last_sequence - context.window_first_sequence + 1 == verbatim
        assert summary_through == (context.summary_through_sequence or None), f"turn {k}"
        assert context.summary_through_sequence >= context.window_first_sequence - 1
    assert results[-1].context is not None and results[-1].context.summary_through_sequence > 0


async def test_require_is_still_refused_when_the_summary_is_behind_its_window(
    server: ServiceProcess, namespace: str
) -> None:
    """The seed's semantics, through the same client and server: a REQUIRE turn whose
    window leaves unsummarized entries outside it is refused with SummaryRequired, nothing
    appended, a job enqueued; the same turn goes through once the queue ran it. The jobs
    ahead follow the window turns use (16 here, so they summarize at most what lies
    outside a window of 8): a turn that narrows its window to 4 finds the summary behind
    whatever the queue's pace, as one the queue has not kept up with would."""
    require = ConversationContextPolicy().with_summary_required()
    async with AsyncClient(server.address, namespace=namespace) as client:
        conversation_id = (await client.create_conversation()).conversation_id
        for k in range(1, 10):  # nothing outside the window yet: never refused
            await client.run_conversation(
                f"message {k}", conversation_id=conversation_id, policy=require
            )
        narrow = ConversationContextPolicy(window=4).with_summary_required()
        with pytest.raises(SummaryRequired) as refused:
            await client.run_conversation(
                "message 10", conversation_id=conversation_id, turn_id="turn-10", policy=narrow
            )
        assert refused.value.backlog > 0 and refused.value.job_id
        assert (await client.get_conversation(conversation_id)).last_sequence == 18

        async def queue_idle() -> bool:
            return (await client.backlog()).depth == 0

        await wait_for(queue_idle, timeout=60)
        result = await client.run_conversation(
            "message 10", conversation_id=conversation_id, turn_id="turn-10", policy=narrow
        )
        assert result.last_sequence == 20 and result.context is not None
        assert result.context.summary_passes == 0
        assert result.context.summary_through_sequence >= result.context.window_first_sequence - 1
        assert prompt_of(result) == (4, result.context.summary_through_sequence)

        # The client's default mode (AUTO) with the summary behind: the turn summarizes
        # within itself instead of refusing. Once the queue is idle the jobs ahead of the
        # window of 4 reached entry 18 (what leaves a window of 2); entry 19 is outside
        # a window of 1.
        await wait_for(queue_idle, timeout=60)
        result = await client.run_conversation(
            "message 11",
            conversation_id=conversation_id,
            policy=ConversationContextPolicy(window=1),
        )
        assert result.context is not None and result.context.summary_passes >= 1
        assert result.context.summary_through_sequence == 19
        assert prompt_of(result) == (1, 19)


def _chat_under_a_pty(target: str, namespace: str, lines: list[str]) -> tuple[int, str]:
    """Run `runifold chat` on a pseudo-terminal (its stdin is a terminal: a person typing),
    send each line once the answer to the one before has arrived, then /quit; the exit
    status and everything the terminal showed (colour codes removed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNIFOLD_")}
    env.update(RUNIFOLD_TARGET=target, COLUMNS="200", NO_COLOR="1")
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "runifold_client.cli", "chat", "-n", namespace],
        cwd=ROOT,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    shown: list[str] = []

    def screen() -> str:
        return _ANSI.sub("", "".join(shown))

    def read_until(done: str, count: int, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while screen().count(done) < count:
            if "not sent" in screen() or process.poll() is not None:
                raise AssertionError(f"the chat stumbled:\n{screen()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {done!r} #{count} in time:\n{screen()}")
            ready, _, _ = select.select([leader], [], [], min(left, 1.0))
            if ready:
                try:
                    shown.append(os.read(leader, 65536).decode(errors="replace"))
                except OSError:  # the terminal closed: the chat ended
                    break

    try:
        for number, line in enumerate(lines, start=1):
            os.write(leader, f"{line}\n".encode())
            read_until("assistant>", number)
        os.write(leader, b"/quit\n")
        code = process.wait(timeout=60)
        while select.select([leader], [], [], 0.1)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown.append(chunk.decode(errors="replace"))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    return code, screen()


async def test_runifold_chat_typed_into_line_after_line_never_stumbles(
    server: ServiceProcess, namespace: str
) -> None:
    lines = [f"line {k}" for k in range(1, CHAT_LINES + 1)]
    code, shown = await asyncio.to_thread(_chat_under_a_pty, server.address, namespace, lines)
    assert code == 0, shown
    assert shown.count("assistant>") == CHAT_LINES
    assert "SUMMARY_REQUIRED" not in shown and "not sent" not in shown
    async with AsyncClient(server.address, namespace=namespace) as client:
        (conversation,) = [c async for c in client.list_conversations()]
        texts = [e.message.text async for e in client.entries(conversation.conversation_id)]
    assert texts[0::2] == lines, "each line sent once, in order"
