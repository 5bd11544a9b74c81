// The contract (every RPC has a method) and TranscriptService: conversations, appends, leases, watching.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import {
  Aborted,
  InvalidArgument,
  VerificationFailed,
  NotFound,
  RunifoldClient,
  RunifoldError,
  TurnLeaseLost,
  VersionConflict,
  newConversationId,
} from "../src/index.js";
import { REPOSITORY, waitFor } from "./support.js";
import { client, collect, fresh } from "./stack.js";

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
    assert.equal(rpcs.length, 47);
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
  test("fork a conversation and verify its digest chain", async () => {
    const { conversation_id: id } = await client.createConversation();
    const first = await client.append(id, ["What is 2 + 2?", "Say it twice"], { expectedVersion: 0 });
    await client.append(id, ["five"], { expectedVersion: 1 });
    const fork = await client.forkConversation(id, 2, { requestId: "regenerate" });
    assert.equal(fork.fork_origin?.conversation_id, id);
    assert.equal(fork.fork_origin?.through_sequence, 2);
    const again = await client.forkConversation(id, 2, { requestId: "regenerate" });
    assert.equal(again.conversation_id, fork.conversation_id);
    await client.append(fork.conversation_id, ["four"]);
    const texts = (await collect(client.listEntries(fork.conversation_id))).map((e) => e.message?.text);
    assert.deepEqual(texts, ["What is 2 + 2?", "Say it twice", "four"]);
    // Its forks, every page of them (one fork a page here), a fork before its own.
    const nested = await client.forkConversation(fork.conversation_id, 3);
    const later = await client.forkConversation(id, 1);
    const forks = await client.listForks(id, { pageSize: 1 });
    assert.deepEqual(forks, [
      { conversationId: fork.conversation_id, incarnation: Number(fork.incarnation), sourceConversationId: id, throughSequence: 2 },
      { conversationId: nested.conversation_id, incarnation: Number(nested.incarnation), sourceConversationId: fork.conversation_id, throughSequence: 3 },
      { conversationId: later.conversation_id, incarnation: Number(later.incarnation), sourceConversationId: id, throughSequence: 1 },
    ]);

    const verified = await client.verifyConversation(id);
    assert.equal(verified.appends, 2);
    const head = Uint8Array.from((await client.getConversation(id)).head_digest);
    assert.deepEqual(verified.headDigest, head);
    const held = await client.verifyConversation(id, { headDigest: Uint8Array.from(first.digest) });
    assert.equal(held.appends, 2);
    assert.equal((await client.verifyConversation(fork.conversation_id)).appends, 3);
    await assert.rejects(
      client.verifyConversation(id, { headDigest: new Uint8Array(32).fill(7) }),
      (error) => error instanceof VerificationFailed,
    );
  });

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
