"""The digest chain (AppendEntries' digest, Conversation.head_digest, ListAppends) run
against every TranscriptStore: test_digests_domain.py on the in-memory store,
test_digests_store.py on PostgreSQL (with tampering made directly in its tables).
"""

from __future__ import annotations

import random

import pytest

from services.common.domain import Message, Role, ToolCall
from services.common.errors import DomainError
from services.transcript.digests.model import GENESIS, ChainLink, recompute
from services.transcript.service import TranscriptService
from tests.transcript.support import (
    ServiceCases,
    assistant,
    new_conversation,
    reason_of,
    tool,
    user,
)


async def chain_of(service: TranscriptService, namespace: str, cid: str) -> list[ChainLink]:
    links: list[ChainLink] = []
    token = ""
    while True:
        page = await service.list_appends(namespace, cid, 0, 1000, token)
        links.extend(page.appends)
        token = page.next_page_token
        if not token:
            return links


async def verify(service: TranscriptService, namespace: str, cid: str) -> bytes:
    """The conversation's head recomputed from ListEntries and ListAppends (ChainBroken
    when it does not hold), checked against GetConversation's head_digest."""
    messages: dict[int, Message] = {}
    token = ""
    while True:
        page = await service.list_entries(namespace, cid, 0, 0, 1000, token)
        messages.update((entry.sequence, entry.message) for entry in page.entries)
        token = page.next_page_token
        if not token:
            break
    head = recompute(await chain_of(service, namespace, cid), messages)
    conversation = await service.get_conversation(namespace, cid)
    assert head == (conversation.head_digest or GENESIS)
    return head


class DigestCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_each_append_extends_the_chain(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        assert (await service.get_conversation(namespace, cid)).head_digest == b""
        first = await service.append(namespace, cid, 0, [user("one"), assistant("two")], "r1")
        second = await service.append(
            namespace,
            cid,
            1,
            [Message(Role.USER, "ü ✓", metadata={"b": "2", "a": "1"}, native_json='{"x":1}')],
            "",
        )
        assert len(first.record.digest) == 32 and first.record.digest != second.record.digest
        assert (await service.get_conversation(namespace, cid)).head_digest == second.record.digest
        # A replay returns the digest of the append it repeats.
        again = await service.append(namespace, cid, 0, [user("one"), assistant("two")], "r1")
        assert again.replayed and again.record.digest == first.record.digest
        chain = await chain_of(service, namespace, cid)
        assert [(link.version, link.previous_digest) for link in chain] == [
            (1, GENESIS),
            (2, first.record.digest),
        ]
        assert await verify(service, namespace, cid) == second.record.digest

    async def test_a_long_chain_with_retractions_verifies(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        rng = random.Random(32)
        version = 0
        standing: list[int] = []
        last = 0
        for i in range(1000):
            if standing and i % 7 == 3:
                retract = rng.sample(standing, min(len(standing), rng.randint(1, 3)))
                standing = [s for s in standing if s not in retract]
                result = await service.append(namespace, cid, version, [], "", retract=retract)
            elif i % 11 == 5:
                call = f"c{i}"
                messages = [assistant("", call), tool(call, f"r{i}")]
                result = await service.append(namespace, cid, version, messages, "")
            else:
                result = await service.append(namespace, cid, version, [user(f"m{i}")], "")
                standing.append(last + 1)
            version, last = result.record.version, result.record.last_sequence
        chain = await chain_of(service, namespace, cid)
        assert len(chain) == 1000 and any(link.retracted_sequences for link in chain)
        await verify(service, namespace, cid)
        # Pages of the chain carry the digest their first append follows.
        page = await service.list_appends(namespace, cid, 500, 10, "")
        assert [link.version for link in page.appends] == list(range(501, 511))
        assert page.appends[0].previous_digest == chain[499].digest

    async def test_a_forks_chain_goes_on_from_its_source(
        self, service: TranscriptService, namespace: str
    ) -> None:
        source = await new_conversation(service, namespace)
        await service.append(namespace, source, 0, [user("u1"), assistant("a1")], "")
        await service.append(
            namespace, source, 1, [user("u2"), assistant("", "c1"), tool("c1")], ""
        )
        # Inside the second append, at its tool call.
        fork, _ = await service.fork_conversation(namespace, source, 4)
        fid = str(fork.conversation_id)
        source_chain = await chain_of(service, namespace, source)
        fork_chain = await chain_of(service, namespace, fid)
        assert fork_chain[0] == source_chain[0]
        assert fork_chain[1].previous_digest == source_chain[0].digest
        assert (fork_chain[1].first_sequence, fork_chain[1].last_sequence) == (3, 4)
        assert fork.head_digest == fork_chain[1].digest
        await service.append(
            namespace,
            fid,
            2,
            [tool("c1", "other"), Message(Role.ASSISTANT, "", (ToolCall("c2", "f", "{}"),))],
            "",
        )
        await verify(service, namespace, fid)
        await verify(service, namespace, source)
        deeper, _ = await service.fork_conversation(namespace, fid, 6)
        await service.append(namespace, str(deeper.conversation_id), None, [tool("c2")], "")
        await verify(service, namespace, str(deeper.conversation_id))

    async def test_list_appends_refuses_what_it_cannot_page(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        with pytest.raises(DomainError) as negative:
            await service.list_appends(namespace, cid, -1, 0, "")
        assert reason_of(negative) == "INVALID_VERSION"
        with pytest.raises(DomainError) as elsewhere:
            await service.list_appends(namespace + "-x", cid, 0, 0, "")
        assert reason_of(elsewhere) == "CONVERSATION_NOT_FOUND"
        assert list((await service.list_appends(namespace, cid, 5, 0, "")).appends) == []
