// SummaryService, and state committed with appends (with retractions).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SummaryConflict } from "../src/index.js";
import { waitFor } from "./support.js";
import { client, collect, fresh } from "./stack.js";

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
