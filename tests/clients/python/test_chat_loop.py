"""A chat loop that never stumbles (issue 29): a plain loop of turns through the Python
client with its defaults, and `runifold chat` typed into line after line under a
pseudo-terminal, against `python -m services` started with nothing but its database (the
server's defaults, the offline model: what `make run` serves). Before issue 29, the
tenth turn of either was refused with SUMMARY_REQUIRED, and every other turn after it.
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

from runifold_client import AsyncClient, Client, TurnResult
from tests.support.process import ServiceProcess, service_process
from tests.support.tools import ROOT

TURNS = 30
CHAT_LINES = 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


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

    assert [r.last_sequence for r in results] == [2 * k for k in range(1, TURNS + 1)]
    for result in results:
        context = result.context
        assert context is not None
        # The model saw at most the default window verbatim, and the summary covered
        # everything before it.
        assert context.window_last_sequence - context.window_first_sequence + 1 <= 16
        assert context.summary_through_sequence >= context.window_first_sequence - 1
    assert results[-1].context is not None and results[-1].context.summary_through_sequence > 0


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
