"""The Python and TypeScript clients against the real stack: a turn, a conflict, and a
summary-required round trip each (issue 8); each client installed on its own, as an
application installs it (issue 15): the Python distribution into a fresh virtual
environment (no server dependency), the TypeScript package from its packed tarball into
an empty folder. The model is the fake OpenAI server; a message that says
"[race:<namespace>:<conversation id>]" makes it let a concurrent writer in before it
answers, so the turn deterministically loses the race."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import (
    AsyncClient,
    Client,
    ConversationContextPolicy,
    SummaryRequired,
    TurnConflict,
    VersionConflict,
)
from tests.support.fake_openai import FakeReply, fake_openai
from tests.support.stack import Stack, full_stack

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "clients" / "node"
CLIENT = ROOT / "clients" / "python"
GENERATED = ROOT / "gen" / "python"
# What a client of a few tens of MB must stay well under (issue 15's "Done when").
CLIENT_SITE_PACKAGES_LIMIT_MB = 150
needs_node = pytest.mark.skipif(
    shutil.which("node") is None, reason="Node.js is part of this machine kind"
)
RACE = re.compile(r"\[race:([A-Za-z0-9_.-]+):([0-9a-f-]{36})\]")


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with (
        fake_openai() as model,
        full_stack(shared_database_url, tmp_path_factory.mktemp("clients"), model) as running,
    ):
        model.respond_with(racing_responder(running))
        yield running


def racing_responder(stack: Stack) -> Any:
    """Answer; when asked to, first append to the conversation as a concurrent writer."""

    async def respond(body: dict[str, Any]) -> FakeReply:
        asked = body["messages"][-1].get("content") or ""
        match = RACE.search(asked)
        if match:
            await stack.transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=match[1],
                    conversation_id=match[2],
                    messages=[
                        common_pb2.Message(role=common_pb2.ROLE_USER, text="a concurrent writer")
                    ],
                )
            )
        return FakeReply(text="Here is my answer.", usage=(40, 5))

    return respond


async def test_python_async_client_turn_conflict_and_summary_required(
    stack: Stack, namespace: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        result = await client.run_conversation(
            "What did we decide?",
            create_if_missing=True,
            policy=ConversationContextPolicy(window=16).with_semantic_memory(8),
        )
        assert result.text == "Here is my answer." and result.version == 1
        cid = result.conversation_id

        with pytest.raises(VersionConflict) as stale:
            await client.append(cid, "late", expected_version=0)
        assert stale.value.current_version == 1

        with pytest.raises(TurnConflict) as lost:
            await client.run_conversation(f"again [race:{namespace}:{cid}]", conversation_id=cid)
        assert lost.value.current_version == 2 and lost.value.expected_version == 1
        assert lost.value.outcome.text == "Here is my answer."
        assert lost.value.outcome.usage.output_tokens == 5

        await client.append(cid, [f"filler {i}" for i in range(30)])
        # The seed's refusal, asked for (the client's default summarizes first).
        policy = ConversationContextPolicy(window=8, summary_batch=8).with_summary_required()
        with pytest.raises(SummaryRequired) as required:
            await client.run_conversation("and now?", conversation_id=cid, policy=policy)
        assert required.value.backlog == 33 - 8  # 2 + 1 (the racer) + 30 entries, window 8
        done = await client.run_conversation(
            "and now?", conversation_id=cid, policy=policy.with_auto_summary(8)
        )
        assert done.context is not None and done.context.summary_through_sequence == 25


async def test_python_blocking_client(stack: Stack, namespace: str) -> None:
    def use() -> None:  # in a thread: the server shares this test's event loop
        with Client(stack.address, namespace=namespace) as client:
            result = client.run_conversation("hello")
            assert result.created and result.last_sequence == 2
            entries = list(client.entries(result.conversation_id))
            assert [e.message.text for e in entries] == ["hello", "Here is my answer."]

    await asyncio.to_thread(use)


@needs_node
async def test_typescript_client_suite(shared_database_url: str) -> None:
    """`npm test`: the client's own suite, which starts its server and fake model itself
    (here on this suite's database, with this Python)."""
    await _node_modules()
    env = {**os.environ, "RUNIFOLD_PYTHON": sys.executable, "DATABASE_URL": shared_database_url}
    output = await _run(["npm", "test"], NODE, env, timeout=600)
    assert "# fail 0" in output, output
    passed = int(re.search(r"# pass (\d+)", output)[1])  # type: ignore[index]
    assert passed >= 20, output


@needs_node
@pytest.mark.slow
async def test_typescript_package_installs_from_its_tarball(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    await _node_modules()
    await _run(["npm", "pack", "--pack-destination", str(tmp_path)], NODE)
    tarball = _one(tmp_path, "runifold-client-*.tgz")
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True}))
    npm = ["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
    await _run([*npm, str(tarball)], app)
    assert not (app / "node_modules" / "@runifold" / "client" / "src").exists()
    (app / "turn.mjs").write_text(
        """
import { RunifoldClient, VersionConflict } from "@runifold/client";

const [target, namespace] = process.argv.slice(2);
const client = new RunifoldClient({ target, namespace });
const result = await client.runConversation("Hello from an installed package");
let conflict = "";
try {
  await client.append(result.conversation_id, ["late"], { expectedVersion: 0 });
} catch (error) {
  if (error instanceof VersionConflict) conflict = `${error.reason} ${error.currentVersion}`;
}
console.log(JSON.stringify({ version: result.conversation_version,
  text: result.outcome.output[0].text, conflict }));
client.close();
"""
    )
    output = await _run(["node", "turn.mjs", stack.address, namespace], app)
    assert json.loads(output) == {
        "version": 1,
        "text": "Here is my answer.",
        "conflict": "VERSION_CONFLICT 1",
    }
    # The declarations are in the package too: a TypeScript application type-checks.
    (app / "typed.ts").write_text(
        """
import { RunifoldClient, TurnConflict, type TurnResult } from "@runifold/client";

export async function version(client: RunifoldClient): Promise<number> {
  try {
    const result: TurnResult = await client.runConversation("hi", { conversationId: "x" });
    return result.conversation_version;
  } catch (error) {
    if (error instanceof TurnConflict) return error.currentVersion;
    throw error;
  }
}
"""
    )
    tsc = NODE / "node_modules" / "typescript" / "bin" / "tsc"
    await _run(
        [
            "node",
            str(tsc),
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--skipLibCheck",
            "--types",
            "node",
            "--typeRoots",
            str(NODE / "node_modules" / "@types"),
            "typed.ts",
        ],
        app,
    )


@pytest.mark.slow
async def test_python_client_installs_alone_and_talks_to_the_server(
    stack: Stack, namespace: str, tmp_path: Path
) -> None:
    """`pip install ./clients/python` into a fresh virtual environment: no torch, no
    services, a small site-packages; then a turn, a conflict and a memory search."""
    # A copy of the two folders it needs, laid out as in a checkout: the client names the
    # generated code (runifold-proto) by a direct reference to the checkout's gen/python.
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    shutil.copytree(CLIENT, checkout / "clients" / "python", ignore=skip)
    shutil.copytree(GENERATED, checkout / "gen" / "python", ignore=skip)
    source = checkout / "clients" / "python"
    venv = tmp_path / "venv"
    await _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    clean = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    python = str(venv / "bin" / "python")
    await _run(
        [python, "-m", "pip", "install", "--progress-bar", "off", str(source)], tmp_path, clean
    )
    site = Path(
        (
            await _run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                tmp_path,
                clean,
            )
        ).strip()
    )
    installed, size_mb = _contents(site)
    assert not {"torch", "services", "transformers", "psycopg", "qdrant_client"} & installed
    assert not {"pgserver", "onnxruntime", "starlette"} & installed
    assert {"runifold", "runifold_client", "grpc"} <= installed
    assert size_mb < CLIENT_SITE_PACKAGES_LIMIT_MB, f"site-packages holds {size_mb:.0f} MB"
    print(f"runifold-client site-packages: {size_mb:.1f} MB")

    script = tmp_path / "use_client.py"
    script.write_text(
        """
import json, sys, time
from runifold_client import Client, TurnConflict, VersionConflict

target, namespace = sys.argv[1:]
with Client(target, namespace=namespace) as client:
    result = client.run_conversation("We ship on Friday.")
    cid = result.conversation_id
    try:
        client.append(cid, "late", expected_version=0)
        version_conflict = None
    except VersionConflict as conflict:
        version_conflict = conflict.current_version
    try:
        client.run_conversation(f"again [race:{namespace}:{cid}]", conversation_id=cid)
        turn_conflict = None
    except TurnConflict as lost:
        turn_conflict = [lost.current_version, lost.outcome.text]
    memory = client.remember("The team ships on Friday.", conversation_id=cid,
                             from_sequence=1, through_sequence=1)
    deadline = time.monotonic() + 30
    while True:  # searchable once the index caught up
        hits = client.search_memories("when do we ship", limit=3).results
        if any(h.memory.memory_id == memory.memory_id for h in hits) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print(json.dumps({
        "text": result.text,
        "version_conflict": version_conflict,
        "turn_conflict": turn_conflict,
        "found": [h.memory.memory_id for h in hits],
        "memory": memory.memory_id,
        "torch": "torch" in sys.modules,
    }))
"""
    )
    output = await _run([python, str(script), stack.address, namespace], tmp_path, clean)
    seen = json.loads(output)
    assert seen["text"] == "Here is my answer."
    assert seen["version_conflict"] == 1
    assert seen["turn_conflict"] == [2, "Here is my answer."]  # the racer's append
    assert seen["memory"] in seen["found"]
    assert seen["torch"] is False
    version = await _run([str(venv / "bin" / "runifold"), "--version"], tmp_path, clean)
    assert version.strip() == "runifold 0.1.0"


def _one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def _contents(site: Path) -> tuple[set[str], float]:
    """The top-level names in a site-packages folder, and its size in MB."""
    names = {p.name.lower() for p in site.iterdir()}
    return names, sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 2**20


async def _node_modules() -> None:
    if not (NODE / "node_modules").exists():
        await _run(["npm", "ci", "--no-audit", "--no-fund"], NODE)


async def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> str:
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=timeout)
    text = out.decode(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)} failed:\n{text}"
    return text
