"""The README's first screen, as a newcomer meets it: a fresh clone, `make run` in it
(which makes its own environment from nothing), then, in a fresh shell, every command
the first screen shows, each as written.

The clone is of the committed tree (what a newcomer gets). The server's ports are free
ones rather than the documented 50051 and 8080 (a developer's own `make run` may hold
those); the commands are pointed at them as tests/docs/test_docs_examples.py does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.docs.test_docs_examples import DOCUMENTED_HTTP, DOCUMENTED_TARGET, fresh_shell_env
from tests.support.tools import ROOT

pytestmark = pytest.mark.slow

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
_SERVING = re.compile(r"serving .* on (?P<address>127\.0\.0\.1:\d+)")
_HTTP = re.compile(r"console on (?P<url>http://127\.0\.0\.1:\d+)/")
# `make run` from nothing: a virtual environment, the runtime's packages, the ONNX graph.
INSTALL_TIMEOUT_S = 1200


def first_screen() -> list[tuple[str, str]]:
    """The runnable blocks of README.md before its first section: (language, code)."""
    text = (ROOT / "README.md").read_text()
    text = text[: text.index("\n## ")]
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()[-1:] or [""]
        if match[1] in {"sh", "python"} and not _NOT_RUN.search(before[0]):
            blocks.append((match[1], match[2]))
    return blocks


def test_the_first_screen_shows_commands_to_run() -> None:
    languages = [language for language, _ in first_screen()]
    assert "sh" in languages and "python" in languages


@contextlib.asynccontextmanager
async def make_run(clone: Path) -> AsyncIterator[tuple[str, str]]:
    """`make run` in the clone, as a fresh shell runs it; yields (gRPC address, HTTP URL)
    once it serves; SIGTERM to its process group after."""
    env = fresh_shell_env(DOCUMENTED_TARGET)
    env.pop("RUNIFOLD_TARGET")
    env.update(
        RUNIFOLD_LISTEN="127.0.0.1:0",
        RUNIFOLD_HTTP_LISTEN="127.0.0.1:0",
        RUNIFOLD_METRICS_LISTEN="127.0.0.1:0",
    )
    process = await asyncio.create_subprocess_exec(
        "make",
        "run",
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    output: list[str] = []
    address = http = ""
    try:
        async with asyncio.timeout(INSTALL_TIMEOUT_S):
            while not address:
                line = (await process.stdout.readline()).decode(errors="replace")
                if not line:
                    raise AssertionError("make run ended before serving:\n" + "".join(output))
                output.append(line)
                if found := _HTTP.search(line):
                    http = found["url"]
                if found := _SERVING.search(line):
                    address = found["address"]

        async def drain() -> None:
            assert process.stdout is not None
            async for raw in process.stdout:
                output.append(raw.decode(errors="replace"))

        draining = asyncio.create_task(drain())
        yield address, http
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 60)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if address:
            await draining


async def test_a_fresh_clone_runs_the_first_screen(tmp_path: Path) -> None:
    clone = tmp_path / "runifold"
    cloning = await asyncio.create_subprocess_exec(
        "git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)
    )
    assert await cloning.wait() == 0
    async with make_run(clone) as (address, http):
        assert (clone / ".venv" / "bin" / "grpcurl").exists(), "make run installs grpcurl"
        for language, code in first_screen():
            code = code.replace(DOCUMENTED_HTTP, http).replace(DOCUMENTED_TARGET, address)
            env = fresh_shell_env(address)
            command = (
                ["bash", "-euo", "pipefail", "-c", code]
                if language == "sh"
                else [str(clone / ".venv" / "bin" / "python"), "-c", code]
            )
            done = await asyncio.create_subprocess_exec(
                *command, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            out, _ = await asyncio.wait_for(done.communicate(), timeout=120)
            assert done.returncode == 0, f"{language} block failed:\n{code}\n{out.decode()}"
