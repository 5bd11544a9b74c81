"""Every example in README.md and docs/ runs as written.

The fenced `sh` and `python` blocks of each page run in order, against a real
all-in-one server with the offline model (what `make run` starts), with the
documented address 127.0.0.1:50051 (and the HTTP port's http://127.0.0.1:8080) pointed
at the test's server. Each runs as
pasted into a fresh shell in the repository's folder: nothing of the project's
virtual environment is on PATH (a block that needs `runifold` or `grpcurl`
activates `.venv` itself, as the pages tell a person to), and no RUNIFOLD_*
variable is set but RUNIFOLD_TARGET. Python blocks are saved as files and run with
the environment's `python` (what the pages say to use), as a reader who saves one
runs it: each is a complete program (no top-level `await`). A block
preceded by `<!-- not run: reason -->` is skipped, and the reason names what
covers it instead. (operations.md's indented docker/kubectl commands need a
Docker engine or a cluster: the files they use are validated by tests/ops.)
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.stack import HTTP_ON, Stack, full_stack

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "clients").glob("*/README.md")),  # the node one's js blocks: its tests
]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
DOCUMENTED_TARGET = "127.0.0.1:50051"
# The all-in-one server's HTTP port (docs/console.md), pointed at the test's too.
DOCUMENTED_HTTP = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Example:
    page: str
    index: int
    language: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}#{self.index}-{self.language}"


def examples() -> tuple[list[Example], list[tuple[str, str]]]:
    """The runnable blocks, and the skipped ones with their reasons."""
    runnable, skipped = [], []
    for page in PAGES:
        text = page.read_text()
        for index, match in enumerate(_FENCE.finditer(text)):
            language, code = match[1], match[2]
            if language not in {"sh", "python"}:
                continue
            before = text[: match.start()].rstrip().splitlines()[-1:] or [""]
            reason = _NOT_RUN.search(before[0])
            name = str(page.relative_to(ROOT))
            if reason:
                skipped.append((f"{name}#{index}-{language}", reason[1]))
            else:
                runnable.append(Example(name, index, language, code))
    return runnable, skipped


RUNNABLE, SKIPPED = examples()


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url, tmp_path_factory.mktemp("docs"), None, http=HTTP_ON
    ) as s:
        yield s


def test_the_pages_have_examples_and_every_skip_says_why() -> None:
    pages = {example.page for example in RUNNABLE}
    assert {"README.md", "docs/quickstart.md"} <= pages
    assert all(len(reason) > 10 for _, reason in SKIPPED)


def fresh_shell_env(target: str) -> dict[str, str]:
    """The environment of a new terminal: PATH without the virtual environment's bin
    (the Makefile puts it first for `make test`), no VIRTUAL_ENV, no RUNIFOLD_*."""
    venv_bins = {Path(sys.executable).parent.resolve(), (ROOT / ".venv" / "bin").resolve()}
    path = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() not in venv_bins
    ]
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RUNIFOLD_") and key != "VIRTUAL_ENV"
    }
    return {**env, "PATH": os.pathsep.join(path), "RUNIFOLD_TARGET": target}


def test_a_fresh_shell_has_no_project_command_on_path() -> None:
    env = fresh_shell_env(DOCUMENTED_TARGET)
    for command in ("runifold", "grpcurl"):
        assert shutil.which(command, path=env["PATH"]) is None, command


def test_every_integration_snippet_is_a_complete_program_that_runs() -> None:
    """docs/integrations.md: each Python block is run (none skipped), and is a program
    of its own, not lines to paste into a notebook (no top-level await)."""
    page = [e for e in RUNNABLE if e.page == "docs/integrations.md"]
    assert len(page) >= 2 and all(e.language == "python" for e in page)
    assert not [
        s for s, _ in SKIPPED if s.startswith("docs/integrations.md") and s.endswith("-python")
    ]
    for example in page:
        compile(example.code, str(example), "exec")  # a SyntaxError on a top-level await
        assert "asyncio.run(" in example.code, f"{example}: no entry point"


@pytest.mark.parametrize("example", RUNNABLE, ids=str)
async def test_example_runs_as_written(stack: Stack, example: Example, tmp_path: Path) -> None:
    code = example.code.replace(DOCUMENTED_HTTP, stack.http_url)
    code = code.replace(DOCUMENTED_TARGET, stack.address)
    env = fresh_shell_env(stack.address)
    if example.language == "sh":
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:  # saved as a file, as a reader saves it
        program = tmp_path / f"{Path(example.page).stem}_{example.index}.py"
        program.write_text(code)
        command = [sys.executable, str(program)]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, f"{example} failed:\n{output.decode(errors='replace')}"
