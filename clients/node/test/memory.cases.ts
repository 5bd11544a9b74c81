// MemoryService: curated memories, proposals, supersession, search modes.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { InvalidArgument, NotFound, RevisionConflict } from "../src/index.js";
import { waitFor } from "./support.js";
import { client, collect, fresh } from "./stack.js";

describe("MemoryService", () => {
  test("remember, get, list, search, replace by revision, delete, forget", async () => {
    const turn = await client.runConversation("We ship on Friday.");
    const id = turn.conversation_id;
    const memory = await client.remember("The team ships on Friday.", {
      conversationId: id,
      fromSequence: 1,
      throughSequence: 1,
      metadata: { topic: "release" },
    });
    assert.equal(memory.revision, 1);
    assert.equal((await client.getMemory(memory.memory_id)).content, "The team ships on Friday.");
    const listed = await collect(client.listMemories({ conversationId: id }));
    assert.deepEqual(
      listed.map((m) => m.memory_id),
      [memory.memory_id],
    );
    await waitFor(async () => {
      const found = await client.searchMemories("when do we ship", { limit: 3 });
      return found.results.some((hit) => hit.memory?.memory_id === memory.memory_id);
    });
    const replaced = await client.upsertMemory("The team ships on Saturday.", {
      memoryId: memory.memory_id,
      expectedRevision: 1,
      sources: [{ conversation_id: id, from_sequence: 1, through_sequence: 2 }],
    });
    assert.equal(replaced.memory?.revision, 2);
    await assert.rejects(
      client.deleteMemory(memory.memory_id, { expectedRevision: 1 }),
      (error) => error instanceof RevisionConflict && error.currentRevision === 2,
    );
    assert.equal(await client.deleteMemory(memory.memory_id, { expectedRevision: 2 }), true);
    await assert.rejects(client.getMemory(memory.memory_id), NotFound);
    await client.remember("Another fact.", { conversationId: id, fromSequence: 2, throughSequence: 2 });
    assert.equal(await client.forgetSource(id), 1);
    const note = "mcp://notes.example/7";
    const external = await client.upsertMemory("A fact from a note.", { sources: [{ external_uri: note }] });
    assert.equal(external.memory!.sources[0].external_uri, note);
    assert.equal(await client.forgetSource("", { externalUri: note }), 1);
    await assert.rejects(client.getMemory(external.memory!.memory_id), NotFound);
  });

  test("propose, confirm, supersede with history, search as of a time", async () => {
    const turn = await client.runConversation("I live in Lisbon.");
    const id = turn.conversation_id;
    const proposed = await client.proposeMemories(id, { fromSequence: 1, throughSequence: 1 });
    const add = proposed.proposals.find((p) => p.action === "PROPOSAL_ACTION_ADD");
    assert.ok(add, `an ADD proposal among ${JSON.stringify(proposed.proposals)}`);
    assert.match(add.content, /Lisbon/);
    assert.deepEqual(await collect(client.listMemories({ conversationId: id })), [], "nothing stored yet");
    const lisbon = (await client.confirmProposal(add)).memory!;
    assert.deepEqual(
      lisbon.sources.map((s) => [s.from_sequence, s.through_sequence]),
      [[1, 1]],
    );
    const porto = await client.upsertMemory("The user lives in Porto.", {
      sources: [{ conversation_id: id, from_sequence: 1, through_sequence: 1 }],
      validFrom: new Date(Date.now() + 3_600_000),
      supersedes: [{ memoryId: lisbon.memory_id, expectedRevision: 1 }],
    });
    assert.deepEqual(
      porto.superseded.map((m) => m.memory_id),
      [lisbon.memory_id],
    );
    const history = await collect(client.listMemoryRevisions(lisbon.memory_id));
    assert.deepEqual(
      history.map((r) => [r.revision, r.superseded_by]),
      [
        [1, ""],
        [2, porto.memory!.memory_id],
      ],
    );
    // Now (before Porto's valid time) only Lisbon's fact holds; later, only Porto's.
    const now = await collect(client.listMemories({ conversationId: id }));
    assert.deepEqual(
      now.map((m) => m.memory_id),
      [lisbon.memory_id],
    );
    const later = await collect(
      client.listMemories({ conversationId: id, asOf: new Date(Date.now() + 7_200_000) }),
    );
    assert.deepEqual(
      later.map((m) => m.memory_id),
      [porto.memory!.memory_id],
    );
    assert.throws(() => client.confirmProposal({ ...add, action: "PROPOSAL_ACTION_DUPLICATE" }));
    await client.forgetSource(id);
  });

  test("search modes: each result says the scores it was ranked by", async () => {
    const turn = await client.runConversation("Invoice INV-20931 was paid.");
    const memory = await client.remember("Invoice INV-20931 was paid by bank transfer.", {
      conversationId: turn.conversation_id,
      fromSequence: 1,
      throughSequence: 1,
    });
    const hit = async (mode: "dense" | "lexical" | "hybrid") => {
      const found = await client.searchMemories("INV-20931", { mode });
      return { found, hit: found.results.find((h) => h.memory?.memory_id === memory.memory_id) };
    };
    await waitFor(async () => (await hit("hybrid")).hit !== undefined);
    const hybrid = await hit("hybrid");
    assert.equal(hybrid.found.mode, "SEARCH_MODE_HYBRID");
    assert.ok((hybrid.hit!.lexical_score ?? 0) > 0, JSON.stringify(hybrid.hit));
    assert.equal((await hit("dense")).found.mode, "SEARCH_MODE_DENSE");
    assert.equal((await hit("lexical")).found.mode, "SEARCH_MODE_LEXICAL");
    await client.forgetSource(turn.conversation_id);
  });

  test("limit 0 means the default", async () => {
    const found = await client.searchMemories("anything at all", { limit: 0 });
    assert.deepEqual(found.results, []);
  });
  test("watch the namespace's memories: every change once, in order, resumed after any", async () => {
    const own = fresh();
    try {
      const { conversation_id: id } = await own.createConversation();
      await own.append(id, ["I drink green tea.", "I moved to Lyon."]);
      const tea = await own.remember("Drinks green tea.", { conversationId: id, fromSequence: 1, throughSequence: 1 });
      const seen: [number, string, string][] = [];
      const stop = new AbortController();
      const done = (async () => {
        for await (const event of own.watchMemories({ signal: stop.signal })) {
          if (event.event === "change") {
            const change = event.change!;
            seen.push([Number(change.change_sequence), change.kind, change.memory?.content ?? ""]);
          } else seen.push([Number(event.heartbeat!.change_sequence), "heartbeat", ""]);
        }
      })();
      await waitFor(async () => seen.some(([, kind]) => kind === "heartbeat"));
      const lyon = await own.remember("Lives in Lyon.", { conversationId: id, fromSequence: 2, throughSequence: 2 });
      await own.deleteMemory(tea.memory_id);
      await waitFor(async () => seen.length === 4);
      stop.abort();
      await done;
      assert.deepEqual(seen, [
        [1, "MEMORY_EVENT_KIND_CREATED", "Drinks green tea."],
        [1, "heartbeat", ""],
        [2, "MEMORY_EVENT_KIND_CREATED", "Lives in Lyon."],
        [3, "MEMORY_EVENT_KIND_DELETED", ""],
      ]);
      // Resumed after the first change: the rest, once, then caught up.
      const resumed: string[] = [];
      for await (const event of own.watchMemories({ afterChangeSequence: 1 })) {
        if (event.event === "heartbeat") break;
        resumed.push(`${event.change!.change_sequence} ${event.change!.memory_id}`);
      }
      assert.deepEqual(resumed, [`2 ${lyon.memory_id}`, `3 ${tea.memory_id}`]);
      // A sequence the namespace never reached is refused, not waited for.
      await assert.rejects(
        (async () => {
          for await (const _ of own.watchMemories({ afterChangeSequence: 99 })) break;
        })(),
        (error) => error instanceof InvalidArgument && error.reason === "SEQUENCE_OUT_OF_RANGE",
      );
    } finally {
      own.close();
    }
  });
});
