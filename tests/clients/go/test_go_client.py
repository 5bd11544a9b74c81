"""The Go client (clients/go) built from gen/go and run against the real all-in-one server.

`clients/go/build.sh` builds it as `make go` does: GOPATH mode over Debian's Go packages
(`make tools` installs them), no module proxy. The program creates a conversation,
appends, reads the ErrorInfo of a version conflict, curates a memory and searches for it;
the test reads what it printed and checks it against what the server stored.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from tests.support.stack import Stack

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "clients" / "go" / "build.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("go") is None,
        reason="no Go toolchain: `make tools` installs golang-go and Debian's gRPC packages",
    ),
]


@pytest.fixture(scope="module")
async def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("go-bin") / "runifold-go"
    await _run([str(BUILD), str(binary)], timeout=600)
    return binary


async def test_go_client_appends_reads_a_conflict_and_searches_memory(
    stack: Stack, program: Path, namespace: str
) -> None:
    output = await _run([str(program), "-target", stack.address, "-namespace", namespace])
    print(output)

    created = re.search(r"^created conversation (\S+) version 0$", output, re.M)
    assert created, output
    conversation_id = created[1]
    assert "appended sequences 1..2 version 1\n" in output
    assert "conflict code Aborted reason VERSION_CONFLICT current_version 1\n" in output
    remembered = re.search(
        rf"^memory (\S+) revision 1 from {conversation_id} sequences 1\.\.2$", output, re.M
    )
    assert remembered, output
    memory_id = remembered[1]
    found = re.findall(r"^found (\S+) score [0-9.]+ (.*)$", output, re.M)
    assert (memory_id, '"The team ships on Friday."') in found, output

    # What the program said is what the server holds.
    stored = await stack.transcript.GetConversation(
        transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=conversation_id)
    )
    assert stored.conversation.version == 1
    assert dict(stored.conversation.labels) == {"client": "go"}
    entries = await stack.transcript.ListEntries(
        transcript_pb.ListEntriesRequest(namespace=namespace, conversation_id=conversation_id)
    )
    assert [e.message.text for e in entries.entries] == [
        "We ship on Friday.",
        "Noted: the release is on Friday.",
    ]
    memory = await stack.memory.GetMemory(
        memory_pb.GetMemoryRequest(namespace=namespace, memory_id=memory_id)
    )
    assert memory.memory.content == "The team ships on Friday."
    (source,) = memory.memory.sources
    assert (source.conversation_id, source.from_sequence, source.through_sequence) == (
        conversation_id,
        1,
        2,
    )


async def _run(command: list[str], timeout: float = 120) -> str:
    """Run a command without blocking the event loop (the server shares it); its output."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=timeout)
    text = out.decode(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)} failed:\n{text}"
    return text
