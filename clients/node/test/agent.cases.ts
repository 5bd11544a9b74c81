// AgentService: turns, their conflicts, the summary a long conversation needs, streaming, erasure.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { ConversationBusy, NotFound, SummaryRequired, TurnConflict } from "../src/index.js";
import { client, collect, model } from "./stack.js";

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
    // With no summary mode the turn would summarize (AUTO, the client's default).
    const required = { ...policy, summary_mode: "SUMMARY_MODE_REQUIRE" as const };
    const refused = client.runConversation("and now?", { conversationId: id, policy: required });
    await assert.rejects(refused, (error) => {
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

  test("a policy without a summary mode summarizes first: AUTO is the default", async () => {
    const { conversation_id: id } = await client.createConversation();
    await client.append(id, Array.from({ length: 30 }, (_, i) => `message ${i + 1}`), {
      expectedVersion: 0,
    });
    const result = await client.runConversation("and now?", { conversationId: id });
    assert.equal(result.first_sequence, 31);
    assert.equal(result.context?.summary_passes, 1);
    assert.equal(result.context?.summary_through_sequence, 14); // window 16
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
    const receipt = erased.receipt!;
    assert.deepEqual([receipt.entries, receipt.appends, receipt.memories], [2, 1, 1]);
    const again = await client.getErasureReceipt("", { conversationId: turn.conversation_id });
    assert.equal(again.receipt_id, receipt.receipt_id);
    assert.equal((await client.getErasureReceipt(receipt.receipt_id)).memory_revisions, 1);
    await assert.rejects(client.getErasureReceipt(receipt.receipt_id, { namespace: `${client.namespace}-b` }), NotFound);
  });
});
