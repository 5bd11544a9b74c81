// The TypeScript client against a real Runifold server it starts itself (test/support.ts):
// every RPC of the four services, the typed errors the server can be led to, and the
// README's examples. The fake model lets a concurrent writer in when a message says
// "[race:<namespace>:<conversation id>]", so that a turn deterministically loses the race.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import {
  Aborted,
  ConversationBusy,
  InvalidArgument,
  NotFound,
  RevisionConflict,
  RunifoldClient,
  RunifoldError,
  SummaryConflict,
  SummaryRequired,
  TurnConflict,
  TurnLeaseLost,
  VersionConflict,
  newConversationId,
} from "../src/index.js";
import { FakeModel, PACKAGE, REPOSITORY, Server, waitFor } from "./support.js";

const RACE = /\[race:([A-Za-z0-9_.-]+):([0-9a-f-]{36})\]/;
let model: FakeModel;
let server: Server;
let client: RunifoldClient;
let namespaceCount = 0;

/** A client on a namespace no other test uses. */
function fresh(): RunifoldClient {
  namespaceCount += 1;
  return new RunifoldClient({
    target: server.address,
    namespace: `node-${process.pid}-${Date.now()}-${namespaceCount}`,
  });
}

before(async () => {
  model = new FakeModel();
  await model.start();
  server = await Server.start(model);
  client = fresh();
  model.before = async (request) => {
    const asked = request.messages.at(-1)?.content ?? "";
    const match = RACE.exec(asked);
    if (match) {
      const writer = new RunifoldClient({ target: server.address, namespace: match[1] });
      await writer.append(match[2], ["a concurrent writer"]);
      writer.close();
    }
  };
});

after(async () => {
  client?.close();
  await server?.stop();
  await model?.close();
});

const collect = async <T>(items: AsyncIterable<T>): Promise<T[]> => {
  const found: T[] = [];
  for await (const item of items) found.push(item);
  return found;
};

describe("the contract", () => {
  test("every RPC of the four services has a client method", () => {
    const rpcs = [
      "runifold/agent/v1/agent_service.proto",
      "runifold/transcript/v1/transcript_service.proto",
      "runifold/summary/v1/summary_service.proto",
      "runifold/memory/v1/memory_service.proto",
    ].flatMap((file) => {
      const text = readFileSync(path.join(REPOSITORY, "proto", file), "utf8");
      return [...text.matchAll(/^\s*rpc\s+(\w+)\s*\(/gm)].map((match) => match[1]);
    });
    assert.equal(rpcs.length, 29);
    const methods = new Set(Object.getOwnPropertyNames(RunifoldClient.prototype));
    for (const rpc of rpcs) {
      const name = rpc[0].toLowerCase() + rpc.slice(1);
      assert.ok(methods.has(name), `no method ${name} for ${rpc}`);
    }
  });

  test("conversation ids made here are UUIDv7", () => {
    const id = newConversationId();
    assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  });
});

describe("TranscriptService", () => {
  test("create, get and list conversations", async () => {
    const mine = fresh();
    const id = newConversationId();
    const created = await mine.createConversation({ conversationId: id, labels: { team: "a" } });
    assert.equal(created.conversation_id, id);
    assert.equal(created.version, 0);
    assert.deepEqual(created.labels, { team: "a" });
    const again = await mine.createConversation({ conversationId: id });
    assert.equal(again.create_time?.seconds, created.create_time?.seconds, "idempotent");
    const second = await mine.createConversation();
    const listed = await collect(mine.listConversations({ pageSize: 1 }));
    assert.deepEqual(
      listed.map((c) => c.conversation_id).sort(),
      [id, second.conversation_id].sort(),
    );
    assert.equal((await mine.getConversation(id)).last_sequence, 0);
    mine.close();
  });

  test("append: compare-and-swap, idempotent replay, entries and the view", async () => {
    const { conversation_id: id } = await client.createConversation();
    const first = await client.append(id, ["one", "two"], {
      expectedVersion: 0,
      requestId: "append-1",
    });
    assert.deepEqual([first.version, first.first_sequence, first.last_sequence], [1, 1, 2]);
    const replay = await client.append(id, ["one", "two"], { requestId: "append-1" });
    assert.equal(replay.replayed, true);
    await assert.rejects(client.append(id, ["late"], { expectedVersion: 0 }), (error) => {
      assert.ok(error instanceof VersionConflict && error instanceof Aborted);
      assert.equal(error.code, grpc.status.ABORTED);
      assert.equal(error.reason, "VERSION_CONFLICT");
      assert.equal(error.currentVersion, 1);
      return true;
    });
    await client.append(id, ["three", "four", "five"]);
    const entries = await collect(client.listEntries(id, { afterSequence: 1 }));
    assert.deepEqual(
      entries.map((e) => e.message?.text),
      ["two", "three", "four", "five"],
    );
    const view = await client.loadView(id, { window: 2, summaryBatch: 2 });
    assert.deepEqual(
      view.window.map((e) => e.sequence),
      [4, 5],
    );
    assert.deepEqual(
      view.summary_buffer.map((e) => e.sequence),
      [1, 2],
    );
    assert.equal(view.summary_backlog, 1);
  });

  test("turn leases: acquire, renew, release, and a renewal after release", async () => {
    const { conversation_id: id } = await client.createConversation();
    const held = await client.acquireTurnLease(id, "turn-a", {
      mode: "TURN_LEASE_MODE_EXCLUSIVE",
      ttlSeconds: 30,
    });
    assert.ok(held.lease && held.lease.exclusive);
    const renewed = await client.renewTurnLease(id, "turn-a", held.lease.fencing_token, {
      ttlSeconds: 60,
    });
    assert.ok(renewed.expire_time!.seconds >= held.lease.expire_time!.seconds);
    assert.equal(await client.releaseTurnLease(id, "turn-a", held.lease.fencing_token), true);
    await assert.rejects(
      client.renewTurnLease(id, "turn-a", held.lease.fencing_token),
      (error) => error instanceof TurnLeaseLost && error.reason === "TURN_LEASE_LOST",
    );
  });

  test("watch: replay, live entries once each in order, resume position, erasure", async () => {
    const { conversation_id: id } = await client.createConversation();
    await client.append(id, ["one", "two"]);
    const seen: number[] = [];
    const kinds: string[] = [];
    const retracted: number[][] = [];
    let position: { afterSequence: number; incarnation: string } | undefined;
    const done = (async () => {
      for await (const event of client.watchConversation(id)) {
        kinds.push(event.event!);
        for (const entry of event.appended?.entries ?? []) seen.push(Number(entry.sequence));
        if (event.event === "retracted") retracted.push(event.retracted!.sequences.map(Number));
        position = client.watchPosition(event) ?? position;
      }
    })();
    await waitFor(async () => kinds.includes("heartbeat"));
    const three = await client.append(id, ["three"]);
    await waitFor(async () => seen.includes(3));
    assert.deepEqual(seen, [1, 2, 3]);
    // A retraction of a delivered entry arrives as its own event.
    await client.append(id, [], { expectedVersion: Number(three.version), retractSequences: [2] });
    await waitFor(async () => retracted.length === 1);
    assert.deepEqual(retracted, [[2]]);
    assert.equal(position?.afterSequence, 3);
    assert.equal(BigInt(position!.incarnation) > 0n, true);
    // The exact incarnation resumes elsewhere; a stale one meets the erasure at once.
    const resumed: number[] = [];
    for await (const event of client.watchConversation(id, { ...position! })) {
      if (event.event === "heartbeat") break;
      for (const entry of event.appended?.entries ?? []) resumed.push(Number(entry.sequence));
    }
    assert.deepEqual(resumed, []);
    await client.deleteConversation(id);
    await done;
    assert.equal(kinds.at(-1), "erased");
  });

  test("delete a transcript, then it is not found", async () => {
    const { conversation_id: id } = await client.createConversation();
    await client.append(id, ["bye"]);
    const deleted = await client.deleteConversation(id);
    assert.equal(deleted.deleted, true);
    assert.equal(deleted.entries_deleted, 1);
    await assert.rejects(client.getConversation(id), (error) => {
      assert.ok(error instanceof NotFound);
      assert.equal(error.reason, "CONVERSATION_NOT_FOUND");
      return true;
    });
  });

  test("a request that can never succeed names its field", async () => {
    await assert.rejects(client.getConversation("not-a-uuid"), (error) => {
      assert.ok(error instanceof InvalidArgument && error instanceof RunifoldError);
      assert.equal(error.reason, "INVALID_CONVERSATION_ID");
      assert.equal(error.field, "conversation_id");
      return true;
    });
  });
});

describe("AgentService", () => {
  test("a turn, and its replay by turn id", async () => {
    const result = await client.runConversation("Hello from TypeScript", { turnId: "turn-1" });
    assert.equal(result.conversation_version, 1);
    assert.deepEqual([result.first_sequence, result.last_sequence], [1, 2]);
    assert.equal(result.outcome?.output[0].text, "Here is my answer.");
    assert.equal(result.outcome?.usage?.model_calls, 1);
    assert.equal(result.context?.window_last_sequence, 0);
    const calls = model.requests.length;
    const replay = await client.runConversation("Hello from TypeScript", {
      conversationId: result.conversation_id,
      turnId: "turn-1",
    });
    assert.equal(replay.replayed, true);
    assert.equal(replay.conversation_version, 1);
    assert.equal(model.requests.length, calls, "a replay never calls the model");
  });

  test("a turn that loses the race carries its outcome (TurnConflict)", async () => {
    const { conversation_id: id } = await client.createConversation();
    await assert.rejects(
      client.runConversation(`please answer [race:${client.namespace}:${id}]`, {
        conversationId: id,
      }),
      (error) => {
        assert.ok(error instanceof TurnConflict);
        assert.equal(error.reason, "TURN_CONFLICT");
        assert.equal(error.expectedVersion, 0);
        assert.equal(error.currentVersion, 1);
        assert.equal(error.outcome.output[0].text, "Here is my answer.");
        assert.equal(error.outcome.usage?.output_tokens, 5);
        return true;
      },
    );
  });

  test("REJECT while another turn holds the conversation: ConversationBusy", async () => {
    const { conversation_id: id } = await client.createConversation();
    const held = await client.acquireTurnLease(id, "holder", { mode: "TURN_LEASE_MODE_EXCLUSIVE" });
    const calls = model.requests.length;
    await assert.rejects(
      client.runConversation("me too", { conversationId: id, concurrency: "CONCURRENCY_MODE_REJECT" }),
      (error) => {
        assert.ok(error instanceof ConversationBusy);
        assert.equal(error.runningTurnId, "holder");
        assert.deepEqual(error.outcome.output, []);
        return true;
      },
    );
    assert.equal(model.requests.length, calls, "refused before any model call");
    await client.releaseTurnLease(id, "holder", held.lease!.fencing_token);
  });

  test("a long conversation needs a summary: SummaryRequired, then AUTO", async () => {
    const { conversation_id: id } = await client.createConversation();
    await client.append(id, Array.from({ length: 30 }, (_, i) => `message ${i + 1}`), {
      expectedVersion: 0,
    });
    const policy = { window: 8, summary_batch: 8 };
    await assert.rejects(client.runConversation("and now?", { conversationId: id, policy }), (error) => {
      assert.ok(error instanceof SummaryRequired);
      assert.equal(error.code, grpc.status.FAILED_PRECONDITION);
      assert.equal(error.backlog, 22);
      assert.ok(error.jobId);
      return true;
    });
    const result = await client.runConversation("and now?", {
      conversationId: id,
      policy: { ...policy, summary_mode: "SUMMARY_MODE_AUTO", max_summary_passes: 3 },
    });
    assert.equal(result.first_sequence, 31);
    assert.ok((result.context?.summary_through_sequence ?? 0) >= 22);
  });

  test("the streamed turn ends in the committed result", async () => {
    const events = await collect(client.streamConversation("stream it"));
    const last = events.at(-1)!;
    assert.equal(last.event, "result");
    assert.equal(last.result?.conversation_version, 1);
    assert.ok(events.some((e) => e.event === "progress"));
    const text = events
      .filter((e) => e.event === "text_delta")
      .map((e) => e.text_delta?.text)
      .join("");
    assert.equal(text, "Here is my answer.");
  });

  test("erase a conversation everywhere", async () => {
    const turn = await client.runConversation("to be erased");
    await client.remember("A fact to erase.", {
      conversationId: turn.conversation_id,
      fromSequence: 1,
      throughSequence: 1,
    });
    const erased = await client.eraseConversation(turn.conversation_id);
    assert.equal(erased.complete, true);
    assert.equal(erased.memories_deleted, 1);
    assert.equal(erased.entries_deleted, 2);
    await assert.rejects(client.getConversation(turn.conversation_id), NotFound);
  });
});

describe("SummaryService", () => {
  test("summarize, get, commit (compare-and-swap), request, backlog, erase", async () => {
    const { conversation_id: id } = await client.createConversation();
    await client.append(id, Array.from({ length: 12 }, (_, i) => `line ${i + 1}`));
    assert.equal(await client.getSummary(id), null);
    const done = await client.summarize(id, { window: 4, summaryBatch: 4, maxSummaryPasses: 2 });
    assert.equal(done.passes, 2);
    assert.equal(done.summary?.through_sequence, 8);
    assert.equal(done.backlog, 0);
    assert.equal((await client.getSummary(id))?.through_sequence, 8);
    await assert.rejects(
      client.commitSummary(id, "a summary", 10, { expectedThroughSequence: 4 }),
      (error) => error instanceof SummaryConflict && error.currentThroughSequence === 8,
    );
    const committed = await client.commitSummary(id, "a summary of ten", 10, {
      expectedThroughSequence: 8,
    });
    assert.equal(committed.through_sequence, 10);
    const job = await client.requestSummary(id, { window: 1, summaryBatch: 4 });
    assert.ok(job.job?.job_id);
    const backlog = await client.getBacklog();
    assert.ok(backlog.depth >= 0 && backlog.failed_count === 0);
    await waitFor(async () => (await client.getBacklog()).depth === 0);
    assert.ok((await client.eraseSummaries(id)) > 0);
    assert.equal(await client.getSummary(id), null);
  });
});

describe("state and retractions", () => {
  test("state committed with appends, read back; a retracted entry stays listed", async () => {
    const mine = fresh();
    const conversation = await mine.createConversation({
      userId: "user-1",
      state: { conversation_json: '{"step": 1}', user_json: '{"lang": "pt"}' },
    });
    const id = conversation.conversation_id;
    const first = await mine.append(id, "Hello", {
      expectedVersion: 0,
      stateDelta: { conversation_json: '{"step": 2}', namespace_json: '{"plan": "pro"}' },
    });
    const state = await mine.getState({ userIds: ["user-1"] });
    assert.deepEqual(JSON.parse(state.namespace_state!.state_json), { plan: "pro" });
    assert.deepEqual(
      state.user_states.map((u) => [u.user_id, JSON.parse(u.state_json)]),
      [["user-1", { lang: "pt" }]],
    );
    const listed = await collect(mine.listConversations({ userId: "user-1", withState: true }));
    assert.deepEqual(
      listed.map((c) => [c.conversation_id, JSON.parse(c.state_json)]),
      [[id, { step: 2 }]],
    );
    assert.deepEqual(await collect(mine.listConversations({ userId: "someone-else" })), []);
    await mine.append(id, "Second", { expectedVersion: first.version, retractSequences: [1] });
    const entries = await collect(mine.listEntries(id));
    assert.deepEqual(
      entries.map((e) => [e.sequence, Number(e.retracted_version) > 0]),
      [
        [1, true],
        [2, false],
      ],
    );
    mine.close();
  });
});

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
});

describe("README.md", () => {
  const readme = readFileSync(path.join(PACKAGE, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/^```js\n([\s\S]*?)^```/gm)].map((m) => m[1]);

  test("has examples", () => assert.ok(blocks.length >= 3));

  for (const [index, code] of blocks.entries()) {
    test(`example ${index + 1} runs as written`, async () => {
      // In this folder `@runifold/client` resolves to this package (its own name).
      const program = code.replaceAll("127.0.0.1:50051", server.address);
      const child = spawn(process.execPath, ["--input-type=module", "-e", program], {
        cwd: PACKAGE,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let output = "";
      child.stdout.on("data", (chunk) => (output += chunk));
      child.stderr.on("data", (chunk) => (output += chunk));
      const code_ = await new Promise((resolve) => child.on("exit", resolve));
      assert.equal(code_, 0, `example ${index + 1} failed:\n${output}`);
    });
  }
});
