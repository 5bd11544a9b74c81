// End-to-end test of the TypeScript client against a real Runifold server.
// tests/e2e/test_node_client.py starts the server (all four services, a fake
// OpenAI-compatible model that lets a concurrent writer in when a message says
// "[race:<namespace>:<conversation id>]") and runs this file with RUNIFOLD_TARGET set.

import assert from "node:assert/strict";
import { test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { RunifoldClient, RunifoldError } from "../src/index.js";

const target = process.env.RUNIFOLD_TARGET;
if (!target) throw new Error("RUNIFOLD_TARGET is not set");
const namespace = `node-${Date.now()}`;

// No googleapis directory: the client defines the status details it decodes.
const client = new RunifoldClient({ target, namespace });

test.after(() => client.close());

test("create a conversation and run a turn", async () => {
  const conversation = await client.createConversation();
  assert.equal(conversation.namespace, namespace);
  const result = await client.runConversation("Hello from TypeScript", {
    conversationId: conversation.conversation_id,
  });
  assert.equal(result.conversation_version, 1);
  assert.equal(result.first_sequence, 1);
  assert.equal(result.last_sequence, 2);
  assert.ok(result.outcome.output[0].text!.length > 0);
  assert.equal(result.outcome.usage.model_calls, 1);
});

test("a stale append is ABORTED with reason VERSION_CONFLICT and the current version", async () => {
  const conversation = await client.createConversation();
  await client.append(conversation.conversation_id, ["first"], { expectedVersion: 0 });
  await assert.rejects(
    client.append(conversation.conversation_id, ["late"], { expectedVersion: 0 }),
    (error: RunifoldError) => {
      assert.equal(error.code, grpc.status.ABORTED);
      assert.equal(error.reason, "VERSION_CONFLICT");
      assert.equal(error.metadata.current_version, "1");
      return true;
    },
  );
});

test("a turn that loses the race carries its outcome in a TurnConflict detail", async () => {
  const conversation = await client.createConversation();
  const id = conversation.conversation_id;
  await assert.rejects(
    client.runConversation(`please answer [race:${namespace}:${id}]`, { conversationId: id }),
    (error: RunifoldError) => {
      assert.equal(error.code, grpc.status.ABORTED);
      assert.equal(error.reason, "TURN_CONFLICT");
      assert.ok(error.turnConflict, "the TurnConflict detail is decoded");
      assert.equal(error.turnConflict!.expected_version, 0);
      assert.equal(error.turnConflict!.current_version, 1);
      assert.ok(error.turnConflict!.outcome.output[0].text!.length > 0);
      assert.equal(error.turnConflict!.outcome.usage.model_calls, 1);
      return true;
    },
  );
});

test("a long conversation needs a summary first: SUMMARY_REQUIRED with the backlog", async () => {
  const conversation = await client.createConversation();
  const id = conversation.conversation_id;
  const messages = Array.from({ length: 30 }, (_, i) => `message ${i + 1}`);
  await client.append(id, messages, { expectedVersion: 0 });
  await assert.rejects(
    client.runConversation("and now?", {
      conversationId: id,
      policy: { window: 8, summary_batch: 8 },
    }),
    (error: RunifoldError) => {
      assert.equal(error.code, grpc.status.FAILED_PRECONDITION);
      assert.equal(error.reason, "SUMMARY_REQUIRED");
      assert.equal(error.metadata.backlog, "22");
      return true;
    },
  );
  const result = await client.runConversation("and now?", {
    conversationId: id,
    policy: { window: 8, summary_batch: 8, summary_mode: "SUMMARY_MODE_AUTO", max_summary_passes: 3 },
  });
  assert.equal(result.first_sequence, 31);
});
