"""The `runifold` command as a person meets it at a terminal (issue 29): Ctrl-C and a
closed pipe end it quietly with the shells' statuses (130, 141), never a traceback;
options go before the command; chat edits lines and walks its history with Up; `turn -`
reads stdin; a chat checks the server before the first message; and pointed at the
HTTP port, it says that is the HTTP port.

Each command runs as its own process, the interactive ones under a pseudo-terminal
(tests/support/terminal.py: Ctrl-C typed there is the terminal's SIGINT), against one
real all-in-one server with the offline model and its HTTP port on.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runifold_client import AsyncClient
from tests.support.stack import HTTP_ON, Stack, full_stack
from tests.support.terminal import CTRL_C, UP, Terminal

COMMAND = (sys.executable, "-m", "runifold_client.cli")
INTERRUPTED = 130  # 128 + SIGINT
PIPE_CLOSED = 141  # 128 + SIGPIPE


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url, tmp_path_factory.mktemp("terminal"), None, http=HTTP_ON
    ) as s:
        yield s


def environment(home: Path, **extra: str) -> dict[str, str]:
    """A person's shell: no RUNIFOLD_* but what the test sets, a home of its own (the
    chat history goes to $XDG_DATA_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNIFOLD_")}
    return {**env, "XDG_DATA_HOME": str(home), "TERM": "xterm", **extra}


async def run(*args: str, env: dict[str, str], stdin: bytes = b"") -> tuple[int, str, str]:
    """`runifold ARGS` with pipes: the exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        *args,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_ctrl_c_on_transcript_watch_exits_130_without_a_traceback(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        await client.append(cid, ["watched line"])
    terminal = await Terminal.start(
        [*COMMAND, "transcript", "watch", cid, "-n", namespace],
        environment(tmp_path, RUNIFOLD_TARGET=stack.address),
    )
    try:
        await terminal.expect("watched line")  # the replay: the stream is open, waiting
        terminal.type(CTRL_C)
        assert await terminal.exit_code() == INTERRUPTED, terminal.text
        assert "Traceback" not in terminal.text and "Exception" not in terminal.text, terminal.text
    finally:
        terminal.close()


async def test_chat_edits_lines_walks_history_with_up_and_ctrl_c_exits_130(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    terminal = await Terminal.start(
        [*COMMAND, "chat", "-n", namespace, "--memory", "0"],
        environment(tmp_path, RUNIFOLD_TARGET=stack.address),
    )
    try:
        await terminal.expect("you>")
        # Line editing: the typo is erased with Backspace (readline's, not a raw \x7f).
        terminal.type("we ship on fridax\x7fy\r")
        await terminal.expect(r"You said: we ship on friday\n")
        await terminal.expect("you>")
        terminal.type(UP)  # the line typed before, to edit or send again
        terminal.type("\r")
        await terminal.expect(
            r"Context: 2 earlier message\(s\)[^\n]*\s*You said: we ship on friday"
        )
        await terminal.expect("you>")
        assert "^[[A" not in terminal.text
        terminal.type(CTRL_C)
        assert await terminal.exit_code() == INTERRUPTED, terminal.text
        assert "Traceback" not in terminal.text, terminal.text
    finally:
        terminal.close()
    history = tmp_path / "runifold" / "chat_history"
    assert "we ship on friday" in history.read_text()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600  # they are messages


async def test_chat_checks_the_server_before_the_first_message(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    """The HTTP port, given for the gRPC one: said at once, named as the HTTP port."""
    http_port = stack.http_url.removeprefix("http://")
    terminal = await Terminal.start(
        [*COMMAND, "chat", "-n", namespace, "--target", http_port],
        environment(tmp_path),
    )
    try:
        assert await terminal.exit_code() == 1, terminal.text
    finally:
        terminal.close()
    assert "you>" not in terminal.text
    assert "that is Runifold's HTTP port" in " ".join(terminal.text.split()), terminal.text


async def test_json_into_head_exits_141_without_a_traceback(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    """Far more than a pipe holds (64 KiB), so `head` closes it while the command writes."""
    async with AsyncClient(stack.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        for _ in range(4):
            await client.append(cid, [f"line {i} " + "x" * 200 for i in range(250)])
    shell = (
        f"{' '.join(COMMAND)} transcript show {cid} -n {namespace} --json 2>{tmp_path}/err"
        ' | head -1; echo "status ${PIPESTATUS[0]}"'
    )
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        shell,
        env=environment(tmp_path, RUNIFOLD_TARGET=stack.address),
        stdout=subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    first, status = out.decode().splitlines()
    assert json.loads(first)["sequence"] == 1
    assert status == f"status {PIPE_CLOSED}"
    assert (tmp_path / "err").read_text() == ""


async def test_options_before_the_command_and_turn_dash_reads_stdin(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    env = environment(tmp_path)
    code, out, err = await run(
        "--target",
        stack.address,
        "--namespace",
        namespace,
        "--json",
        "turn",
        "-",
        env=env,
        stdin=b"a message from stdin\n",
    )
    assert code == 0, out + err
    turn = json.loads(out)
    async with AsyncClient(stack.address, namespace=namespace) as client:
        entries = [e async for e in client.entries(turn["conversation_id"])]
    assert entries[0].message.text == "a message from stdin"

    # Between a group and its command, and after it.
    code, out, err = await run(
        "transcript", "--target", stack.address, "list", "-n", namespace, "--json", env=env
    )
    assert code == 0, out + err
    assert [json.loads(line)["conversation_id"] for line in out.splitlines()] == [
        turn["conversation_id"]
    ]


async def test_the_http_port_is_named_as_such(stack: Stack, namespace: str, tmp_path: Path) -> None:
    http_port = stack.http_url.removeprefix("http://")
    code, out, _ = await run(
        "backlog", "-n", namespace, "--target", http_port, env=environment(tmp_path)
    )
    text = " ".join(out.split())
    assert code == 1
    assert "that is Runifold's HTTP port" in text and "RUNIFOLD_TARGET" in text, out
    assert "make run" not in text
