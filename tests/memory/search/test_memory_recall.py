"""Semantic retrieval quality with the real model (all-MiniLM-L6-v2), through gRPC, on a
labelled set written for this test.

Every question is a paraphrase of its answer (few shared content words), and
each answer has a distractor that shares its surface words but not its
meaning ("Peanuts the comic strip" vs "allergic to peanuts"). A lexical
matcher is drawn to the distractors; the embedding model should not be.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as tpb
from services.common import stubs
from services.memory.component import MemoryComponent
from tests.memory.support import memory_config, memory_server, outbox_drained
from tests.support.waiting import wait_for

# key -> (answer fact, distractor sharing its words but not its meaning)
FACTS: dict[str, tuple[str, str]] = {
    "allergy": (
        "The user's daughter Maya is severely allergic to peanuts.",
        "The user's favourite comic strip is Peanuts, especially Snoopy.",
    ),
    "dog": (
        "The user adopted a beagle named Biscuit from a shelter.",
        "The user bakes dog-shaped biscuits for the school fair.",
    ),
    "job": (
        "The user works as a nurse in the cardiology ward at St. Mary's hospital.",
        "The user visited St. Mary's church while on holiday in Cornwall.",
    ),
    "birthday": (
        "The user was born on the fourteenth of March.",
        "The user's March electricity bill was unusually high.",
    ),
    "car": (
        "The user drives a red 2015 Volvo estate.",
        "The user painted the garden shed red last summer.",
    ),
    "language": (
        "The user is learning Japanese and practises kanji every morning.",
        "The user had breakfast at a Japanese restaurant every morning in Kyoto.",
    ),
    "coffee": (
        "The user drinks only decaffeinated coffee after lunch.",
        "The user's coffee table is made of reclaimed oak.",
    ),
    "vegetarian": (
        "The user has not eaten meat for ten years.",
        "The user's cat eats ten small meals a day.",
    ),
    "marathon": (
        "The user is training to run the Berlin marathon in September.",
        "The user's laptop runs slowly since the September update.",
    ),
    "sister": (
        "The user's sister Hannah lives in Toronto and is a dentist.",
        "The user bought a toothbrush in Toronto airport.",
    ),
    "password": (
        "The user wants reminders never to include passwords or PINs.",
        "The user forgot the wifi name at the cabin.",
    ),
    "piano": (
        "The user has played the piano since the age of six.",
        "The user moved the heavy piano out of the flat when they were twenty-six.",
    ),
    "timezone": (
        "The user is based in Singapore, eight hours ahead of UTC.",
        "The user's watch runs eight minutes fast.",
    ),
    "meeting": (
        "The user prefers meetings to be scheduled before 11 am.",
        "The user met an old friend at 11 am on the train.",
    ),
    "medication": (
        "The user takes a blood pressure tablet every evening.",
        "The user checks the tyre pressure of the bike every evening.",
    ),
    "wedding": (
        "The user is getting married in Lisbon next June.",
        "The user watched a film set in Lisbon last June.",
    ),
    "budget": (
        "The user's monthly grocery budget is 400 euros.",
        "The user found a 400-page novel at the grocery store.",
    ),
    "fear": (
        "The user is afraid of flying and prefers trains.",
        "The user trains the office interns on Fridays.",
    ),
    "kids_school": (
        "The user's son starts secondary school in Leeds this autumn.",
        "The user's autumn leaves project won a prize at the art school.",
    ),
    "editor": (
        "The user writes code in Neovim with a dark colour scheme.",
        "The user's colour printer prints in dark grey only.",
    ),
    "diet": (
        "The user avoids gluten because of coeliac disease.",
        "The user glued the broken vase back together.",
    ),
    "house": (
        "The user rents a two-bedroom flat near the river.",
        "The user rowed two kilometres on the river at dawn.",
    ),
    "music": (
        "The user's favourite band is Radiohead.",
        "The user listened to a radio interview about band saws.",
    ),
    "insurance": (
        "The user's car insurance renews on the first of October.",
        "The user renewed the library card on the first of October.",
    ),
}

QUESTIONS: list[tuple[str, str]] = [
    ("Which food could cause my little girl a dangerous reaction?", "allergy"),
    ("What is the name of my pet?", "dog"),
    ("What do I do for a living?", "job"),
    ("When should I get birthday wishes?", "birthday"),
    ("What kind of vehicle do I own?", "car"),
    ("Which foreign language am I studying?", "language"),
    ("Can I have a regular espresso in the afternoon?", "coffee"),
    ("Do I eat steak?", "vegetarian"),
    ("What long-distance race am I preparing for?", "marathon"),
    ("Where does my sibling live and what is her job?", "sister"),
    ("Is it fine to put my login secrets in a reminder?", "password"),
    ("Which musical instrument can I play?", "piano"),
    ("What time zone am I in?", "timezone"),
    ("When do I like appointments to be booked?", "meeting"),
    ("Which medicine do I take at night?", "medication"),
    ("Where is my wedding going to be?", "wedding"),
    ("How much do I spend on food shopping each month?", "budget"),
    ("Why do I avoid aeroplanes?", "fear"),
    ("Where will my boy go to school?", "kids_school"),
    ("Which text editor do I use for programming?", "editor"),
    ("Can I eat normal bread?", "diet"),
    ("Do I own my home?", "house"),
    ("Which group do I like listening to most?", "music"),
    ("When does my vehicle cover need renewing?", "insurance"),
]

# Unrelated facts that fill the namespace (no question points at them).
FILLERS = [
    "The user's grandmother grew up on a farm in Galicia.",
    "The user keeps a sourdough starter called Gerald.",
    "The user volunteers at a food bank twice a month.",
    "The user's laptop is a 14-inch ThinkPad.",
    "The user supports a football club from Porto.",
    "The user dislikes voice messages.",
]


@pytest.fixture
async def memory_stub(
    shared_database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[grpc.aio.Channel, MemoryComponent]]:
    async with (
        memory_server(shared_database_url, memory_config(tmp_path)) as (running, component),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield channel, component


async def test_recall_at_3_on_a_labelled_set(
    memory_stub: tuple[grpc.aio.Channel, MemoryComponent], namespace: str
) -> None:
    channel, component = memory_stub
    memory = stubs.memory(channel)
    transcript = stubs.transcript(channel)
    created = await transcript.CreateConversation(
        tpb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    await transcript.AppendEntries(
        tpb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[common_pb2.Message(role=common_pb2.ROLE_USER, text="facts about me")],
        )
    )
    source = [pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)]
    ids: dict[str, str] = {}
    for key, (answer, distractor) in FACTS.items():
        for text, label in ((answer, key), (distractor, f"{key}/distractor")):
            made = await memory.UpsertMemory(
                pb.UpsertMemoryRequest(namespace=namespace, content=text, sources=source)
            )
            ids[label] = made.memory.memory_id
    for text in FILLERS:
        await memory.UpsertMemory(
            pb.UpsertMemoryRequest(namespace=namespace, content=text, sources=source)
        )
    # The data set: every fact with a distractor, plus fillers (at least 30 memories),
    # asked at least 20 questions.

    await wait_for(lambda: outbox_drained(component), timeout=60)
    hits_at_3 = 0
    distractor_first = 0
    misses = []
    for question, key in QUESTIONS:
        found = await memory.SearchMemories(
            pb.SearchMemoriesRequest(namespace=namespace, query=question, limit=3)
        )
        assert not found.degraded
        top = [r.memory.memory_id for r in found.results]
        if ids[key] in top:
            hits_at_3 += 1
        else:
            misses.append(key)
        if top and top[0] == ids[f"{key}/distractor"]:
            distractor_first += 1
    recall = hits_at_3 / len(QUESTIONS)
    # The lexical baseline on the same data: PostgreSQL full-text search (degraded mode).
    assert component.store is not None
    lexical_hits = 0
    for question, key in QUESTIONS:
        found_text = await component.store.text_search(namespace, question, {}, 3)
        lexical_hits += ids[key] in {str(h.memory.memory_id) for h in found_text}
    lexical = lexical_hits / len(QUESTIONS)
    print(
        f"\nrecall@3 = {recall:.3f} over {len(QUESTIONS)} questions, "
        f"{len(ids) + len(FILLERS)} memories; distractor ranked first {distractor_first} "
        f"times; missed: {misses or 'none'}; full-text baseline recall@3 = {lexical:.3f}"
    )
    # Floor: 0.85 (measured: 1.0). The questions share few content words with
    # their answers and the distractors share many, so lexical matching fails
    # here: the full-text baseline on the same data measured 0.33. 0.85 leaves
    # room for three misses out of 24 (a model update may move a hard pair),
    # while any pipeline fault (unnormalised vectors, wrong namespace, mixed
    # models, stale re-read) falls far below it, toward the lexical baseline.
    assert recall >= 0.85
    assert recall > lexical + 0.3
    assert distractor_first <= 2
