"""The `runifold` command (issue 15): help on every command, --version, --json with every
field (zero values included), chat keeping a refused message and resending it, slash
commands handled locally, and the errors a person meets first naming what fixes them.

The command runs as a person runs it, its own process, against a real all-in-one server
with the offline model (what `make run` serves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import runifold_client
from runifold_client import AsyncClient
from runifold_client.cli import main, parser
from tests.support.stack import Stack


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNIFOLD_")}
    return {**env, **extra}


async def runifold(
    stack: Stack | None, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run `runifold ARGS` (its own process); the exit status, stdout and stderr."""
    extra = {"RUNIFOLD_TARGET": stack.address} if stack is not None else {}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runifold_client.cli",
        *args,
        env=env or _env(COLUMNS="200", **extra),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# -- help and version (no server) ------------------------------------------------------


def _commands(
    command: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, command
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(parser()))
# The root and the groups: what a command alone prints is its help.
BARE = [
    (p, c)
    for p, c in COMMANDS
    if any(isinstance(a, argparse._SubParsersAction) for a in c._actions)
]


def _ids(commands: list[tuple[tuple[str, ...], argparse.ArgumentParser]]) -> list[str]:
    return [" ".join(path) or "runifold" for path, _ in commands]


def test_the_command_tree_has_the_list_get_show_commands() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {
        "chat",
        "turn",
        "transcript list",
        "transcript get",
        "transcript show",
        "transcript watch",
        "summary show",
        "memory list",
        "memory get",
        "memory search",
        "backlog",
    } <= paths


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=_ids(COMMANDS))
def test_every_command_has_help_with_defaults_and_the_environment(
    path: tuple[str, ...], command: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: runifold {' '.join(path)}".rstrip())
    assert "RUNIFOLD_TARGET" in text and "RUNIFOLD_NAMESPACE" in text
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, f"{path} {choice.dest}: no help"
            continue
        assert action.help, f"{' '.join(path)} {action.option_strings or action.dest}: no help"
        if action.option_strings and action.default not in (None, False, "", argparse.SUPPRESS):
            assert f"(default: {action.default})" in " ".join(text.split()), (
                f"{' '.join(path)} {action.option_strings}: default not shown"
            )


@pytest.mark.parametrize(("path", "command"), BARE, ids=_ids(BARE))
def test_a_bare_command_or_group_prints_its_help(
    path: tuple[str, ...], command: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(list(path)) == 0
    assert capsys.readouterr().out == command.format_help()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"runifold {runifold_client.__version__}\n"


async def test_a_missing_namespace_names_the_flag_and_the_variable() -> None:
    code, out, err = await runifold(None, "backlog")
    assert code == 2 and out == ""
    assert err.strip() == "runifold: no namespace: pass --namespace NAME or set RUNIFOLD_NAMESPACE"


async def test_an_unreachable_server_names_the_target_and_the_variable() -> None:
    code, out, _ = await runifold(None, "backlog", "-n", "x", "--target", "127.0.0.1:1")
    assert code == 1
    assert out.count("cannot reach 127.0.0.1:1") == 1 and "RUNIFOLD_TARGET" in out
    assert "start a server" in out


# -- against the server ------------------------------------------------------------------


async def test_json_prints_every_field_with_zero_values(stack: Stack, namespace: str) -> None:
    code, out, _ = await runifold(stack, "backlog", "-n", namespace, "--json")
    assert code == 0
    assert json.loads(out) == {
        "depth": 0,
        "oldest_pending_age": "0s",
        "failed_count": 0,
        "running_count": 0,
    }

    code, out, _ = await runifold(stack, "memory", "search", "anything", "-n", namespace, "--json")
    assert code == 0 and json.loads(out) == {
        "results": [],
        "degraded": False,
        "mode": "SEARCH_MODE_HYBRID",
    }

    code, out, _ = await runifold(stack, "transcript", "create", "-n", namespace, "--json")
    conversation = json.loads(out)
    assert code == 0
    assert conversation["version"] == 0 and conversation["last_sequence"] == 0
    assert conversation["labels"] == {} and conversation["namespace"] == namespace

    cid = conversation["conversation_id"]
    code, out, _ = await runifold(stack, "summary", "show", cid, "-n", namespace, "--json")
    assert code == 0 and json.loads(out) == {"summary": None}


async def test_turn_and_the_listings_print_one_document_per_line(
    stack: Stack, namespace: str
) -> None:
    code, out, _ = await runifold(stack, "turn", "Hello there", "-n", namespace, "--json")
    assert code == 0, out
    turn = json.loads(out)
    assert turn["conversation_version"] == 1 and turn["replayed"] is False
    assert turn["context"]["memory_degraded"] is False  # a zero value, printed
    assert turn["context"]["summary_through_sequence"] == 0
    cid = turn["conversation_id"]

    code, out, _ = await runifold(stack, "transcript", "show", cid, "-n", namespace, "--json")
    entries = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [e["sequence"] for e in entries] == [1, 2]
    assert entries[0]["message"]["text"] == "Hello there"
    assert entries[0]["message"]["tool_call_id"] == ""

    code, out, _ = await runifold(stack, "transcript", "list", "-n", namespace, "--json")
    assert code == 0 and [json.loads(line)["conversation_id"] for line in out.splitlines()] == [cid]

    code, out, _ = await runifold(stack, "turn", "Hello again", "-n", namespace, "-c", cid)
    assert code == 0
    lines = out.strip().splitlines()
    assert "version 2 · entries 3..4 · window 1..2" in lines[-2], out
    assert lines[-1] == f"conversation {cid}"


async def test_memory_add_get_list_and_a_source_out_of_range(stack: Stack, namespace: str) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        done = await client.run_conversation("We ship on Friday.")
    cid = done.conversation_id
    base = ("-n", namespace, "--json")
    code, out, _ = await runifold(
        stack, "memory", "add", "Ship on Friday.", "-c", cid, "--from", "1", "--through", "1", *base
    )
    assert code == 0, out
    memory = json.loads(out)
    code, out, _ = await runifold(stack, "memory", "get", memory["memory_id"], *base)
    assert code == 0 and json.loads(out)["content"] == "Ship on Friday."
    code, out, _ = await runifold(stack, "memory", "list", "-c", cid, *base)
    assert code == 0 and [json.loads(line)["memory_id"] for line in out.splitlines()] == [
        memory["memory_id"]
    ]

    code, out, _ = await runifold(
        stack, "memory", "add", "Too far.", "-c", cid, "--from", "1", "--through", "9", *base
    )
    error: dict[str, Any] = json.loads(out)["error"]
    assert code == 1 and error["reason"] == "SOURCE_OUT_OF_RANGE"
    assert error["metadata"]["last_sequence"] == "2" and "last sequence is 2" in error["message"]


async def _four_entries(stack: Stack, namespace: str) -> str:
    """A conversation of four entries appended directly: no turn ran, so no summary job
    ran ahead of them (a turn's view with window 2 finds entries 1..2 waiting)."""
    async with AsyncClient(stack.address, namespace=namespace) as client:
        conversation = await client.create_conversation()
        await client.append(conversation.conversation_id, [f"zero {i}" for i in range(1, 5)])
    return conversation.conversation_id


async def test_chat_keeps_a_refused_message_and_resends_it(stack: Stack, namespace: str) -> None:
    """`--auto-summary 0` (the seed's refusal, not the default), window 2, over four
    entries with no summary: the first message is refused with SUMMARY_REQUIRED. It is
    kept; /summarize summarizes and resends it. /help and an unknown slash command never
    reach the model."""
    cid = await _four_entries(stack, namespace)
    script = "\n".join(["first", "/summarize", "/help", "/nonsense", "/id", "/quit", ""])
    code, out, err = await runifold(
        stack,
        "chat",
        "-n",
        namespace,
        "-c",
        cid,
        "--window",
        "2",
        "--memory",
        "0",
        "--auto-summary",
        "0",
        stdin=script,
    )
    assert code == 0, out + err
    assert "not sent" in out and "Your message is kept" in out and "/summarize" in out
    assert "/retry" in out and "resend the message the server refused" in out  # /help
    assert "unknown command: /nonsense" in " ".join(out.split())
    assert "version 2 · entries 5..6" in out, out
    async with AsyncClient(stack.address, namespace=namespace) as client:
        texts = [e.message.text async for e in client.entries(cid)]
        summary = await client.get_summary(cid)
    assert cid in out  # /id
    assert texts[4::2] == ["first"], "the message sent once, not lost"
    assert summary is not None and summary.through_sequence >= 2


async def test_chat_json_prints_one_document_per_event(stack: Stack, namespace: str) -> None:
    cid = await _four_entries(stack, namespace)
    code, out, _ = await runifold(
        stack,
        "chat",
        "-n",
        namespace,
        "-c",
        cid,
        "--window",
        "2",
        "--memory",
        "0",
        "--auto-summary",
        "0",
        "--json",
        stdin="hello\n/summarize\n",
    )
    documents = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    refused, summarized, resent = documents
    assert refused["error"]["reason"] == "SUMMARY_REQUIRED" and refused["kept"] == "hello"
    assert refused["error"]["metadata"]["backlog"] == "2"
    # /summarize ran: its passes, or none when the job the refusal queued got there first.
    assert int(summarized.get("passes", 0)) >= 0 and "error" not in summarized
    assert resent.get("conversation_version") == 2


async def test_chat_by_default_summarizes_within_the_turn_instead_of_refusing(
    stack: Stack, namespace: str
) -> None:
    """The same conversation without `--auto-summary 0`: the client's default policy
    summarizes first when the summary is behind, so the message is answered at once."""
    cid = await _four_entries(stack, namespace)
    code, out, _ = await runifold(
        stack,
        "chat",
        "-n",
        namespace,
        "-c",
        cid,
        "--window",
        "2",
        "--memory",
        "0",
        "--json",
        stdin="hello\n",
    )
    (document,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert document["conversation_version"] == 2
    assert document["context"]["summary_passes"] == 1


async def test_a_missing_conversation_id_says_so_and_names_the_argument(
    stack: Stack, namespace: str
) -> None:
    code, out, _ = await runifold(stack, "transcript", "get", "", "-n", namespace)
    assert code == 1
    assert "INVALID_CONVERSATION_ID: conversation_id is missing" in out
    assert "hint: check the conversation id" in " ".join(out.split())


async def test_transcript_watch_follows_like_tail_and_ends_with_the_erasure(
    stack: Stack, namespace: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        await client.append(cid, ["first", "second"])
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runifold_client.cli",
            "transcript",
            "watch",
            cid,
            "-n",
            namespace,
            "--json",
            env=_env(RUNIFOLD_TARGET=stack.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None

        async def document() -> dict[str, Any]:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=60)  # type: ignore[union-attr]
            assert line, "the command ended early"
            parsed: dict[str, Any] = json.loads(line)
            return parsed

        try:
            replayed = await document()
            assert [e["sequence"] for e in replayed["appended"]["entries"]] == [1, 2]
            assert replayed["appended"]["version"] == 1
            await client.append(cid, ["third"])
            live = await document()
            assert live["appended"]["entries"][0]["message"]["text"] == "third"
            undo = await client.append(cid, [], expected_version=2, retract_sequences=[1])
            retracted = await document()
            assert retracted["retracted"]["sequences"] == [1]
            assert retracted["retracted"]["version"] == undo.version
            await client.delete_conversation(cid)
            erased = await document()
            assert set(erased) == {"erased"}
            assert await asyncio.wait_for(process.wait(), timeout=60) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_memory_from_a_uri_is_listed_with_it_and_forgotten_by_it(
    stack: Stack, namespace: str
) -> None:
    base = ("-n", namespace, "--json")
    note = "mcp://notes.example/42"
    code, out, _ = await runifold(
        stack, "memory", "add", "Prefers green tea.", "--uri", note, *base
    )
    assert code == 0, out
    memory = json.loads(out)
    assert memory["sources"] == [
        {
            "conversation_id": "",
            "from_sequence": 0,
            "through_sequence": 0,
            "incarnation": 0,
            "external_uri": note,
        }
    ]
    code, out, _ = await runifold(stack, "memory", "list", "-n", namespace)
    assert code == 0 and note in out and "Prefers green tea." in out
    code, _, err = await runifold(
        stack, "memory", "forget", "--uri", note, "-c", memory["memory_id"], *base
    )
    assert code == 2 and "--uri" in err
    code, out, _ = await runifold(stack, "memory", "forget", "--uri", note, *base)
    assert code == 0 and json.loads(out) == {"deleted_count": 1}
    code, out, _ = await runifold(stack, "memory", "get", memory["memory_id"], *base)
    assert code == 1 and json.loads(out)["error"]["reason"] == "MEMORY_NOT_FOUND"


async def test_transcript_erase_prints_the_receipt_and_receipt_reads_it_again(
    stack: Stack, namespace: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        done = await client.run_conversation("Erase me, keep the receipt.")
    cid = done.conversation_id
    code, out, _ = await runifold(stack, "transcript", "erase", cid, "-n", namespace)
    assert code == 0, out
    words = out.split()
    assert "erased" in words and "receipt" in words and "memory_revisions" in words, out
    assert "Erase" not in out  # counts, never content
    code, out, _ = await runifold(
        stack, "transcript", "receipt", "--conversation", cid, "-n", namespace, "--json"
    )
    assert code == 0, out
    receipt = json.loads(out)
    assert (receipt["conversation_id"], receipt["entries"], receipt["appends"]) == (cid, 2, 1)
    code, out, _ = await runifold(
        stack, "transcript", "receipt", receipt["receipt_id"], "-n", namespace, "--json"
    )
    assert code == 0 and json.loads(out)["receipt_id"] == receipt["receipt_id"]
    code, out, _ = await runifold(
        stack, "transcript", "receipt", receipt["receipt_id"], "-n", f"{namespace}-b", "--json"
    )
    assert code == 1 and json.loads(out)["error"]["reason"] == "ERASURE_RECEIPT_NOT_FOUND"
    code, _, err = await runifold(stack, "transcript", "receipt", "-n", namespace)
    assert code == 2 and "--conversation" in err
    code, out, _ = await runifold(stack, "erase", cid, "-n", namespace, "--json")
    assert code == 0 and json.loads(out)["receipt"]["receipt_id"] == receipt["receipt_id"]


async def test_memory_watch_follows_every_change_and_ends_quietly_on_ctrl_c(
    stack: Stack, namespace: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        await client.append(cid, ["I drink green tea.", "I moved to Lyon."])
        first = await client.remember(
            "Drinks green tea.", conversation_id=cid, from_sequence=1, through_sequence=1
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runifold_client.cli",
            "memory",
            "watch",
            "-n",
            namespace,
            "--json",
            env=_env(RUNIFOLD_TARGET=stack.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None and process.stderr is not None

        async def document() -> dict[str, Any]:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=60)  # type: ignore[union-attr]
            assert line, "the command ended early"
            parsed: dict[str, Any] = json.loads(line)
            return parsed

        try:
            replayed = (await document())["change"]
            assert (replayed["change_sequence"], replayed["kind"]) == (
                1,
                "MEMORY_EVENT_KIND_CREATED",
            )
            assert replayed["memory"]["content"] == "Drinks green tea."
            second = await client.remember(
                "Lives in Lyon.", conversation_id=cid, from_sequence=2, through_sequence=2
            )
            live = (await document())["change"]
            assert (live["change_sequence"], live["memory_id"]) == (2, second.memory_id)
            await client.delete_memory(first.memory_id)
            deleted = (await document())["change"]
            assert (deleted["change_sequence"], deleted["kind"]) == (3, "MEMORY_EVENT_KIND_DELETED")
            assert deleted["memory_id"] == first.memory_id
            assert "memory" not in deleted
            # Ctrl-C ends it quietly: no traceback, the shell's status for an interrupt.
            process.send_signal(signal.SIGINT)
            status = await asyncio.wait_for(process.wait(), timeout=60)
            err = await process.stderr.read()
            assert (status, err) == (130, b""), err.decode()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
