// One environment moves every tool: a client given no target, namespace or token reads
// RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE and RUNIFOLD_TOKEN, as the `runifold` command and the
// Python client do; and a call that reaches no server says where it tried, once.

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import net from "node:net";
import { describe, test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { RunifoldClient, Unavailable, fromEnvironment } from "../src/index.js";
import { server } from "./stack.js";

/** Run `body` with the variables set (undefined: unset), then put the environment back. */
async function withEnv(vars: Record<string, string | undefined>, body: () => Promise<void>): Promise<void> {
  const saved = Object.fromEntries(Object.keys(vars).map((key) => [key, process.env[key]]));
  const apply = (values: Record<string, string | undefined>) => {
    for (const [key, value] of Object.entries(values)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  };
  apply(vars);
  try {
    await body();
  } finally {
    apply(saved);
  }
}

/** A gRPC server that answers GetBacklog (an empty reply) and keeps each call's authorization. */
async function recordingServer(): Promise<{ address: string; seen: string[][]; stop: () => void }> {
  const seen: string[][] = [];
  const bytes = (value: Buffer) => value;
  const backend = new grpc.Server();
  backend.addService(
    {
      GetBacklog: {
        path: "/runifold.summary.v1.SummaryService/GetBacklog",
        requestStream: false,
        responseStream: false,
        requestSerialize: bytes,
        requestDeserialize: bytes,
        responseSerialize: bytes,
        responseDeserialize: bytes,
      },
    },
    {
      GetBacklog: (call: grpc.ServerUnaryCall<Buffer, Buffer>, done: grpc.sendUnaryData<Buffer>) => {
        seen.push(call.metadata.get("authorization").map(String));
        done(null, Buffer.alloc(0));
      },
    },
  );
  const port = await new Promise<number>((resolve, reject) =>
    backend.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  return { address: `127.0.0.1:${port}`, seen, stop: () => backend.forceShutdown() };
}

/** A port nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const listener = net.createServer();
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const { port } = listener.address() as AddressInfo;
  await new Promise<void>((resolve) => listener.close(() => resolve()));
  return port;
}

describe("the environment", () => {
  test("a client given nothing reaches the server and namespace the variables name", async () => {
    // The test's server listens on a port of its own, never the default one.
    assert.notEqual(server.address, "127.0.0.1:50051");
    const namespace = `node-env-${process.pid}-${Date.now()}`;
    await withEnv({ RUNIFOLD_TARGET: server.address, RUNIFOLD_NAMESPACE: namespace }, async () => {
      const client = new RunifoldClient();
      try {
        assert.equal(client.target, server.address);
        const conversation = await client.createConversation();
        assert.equal(conversation.namespace, namespace);
      } finally {
        client.close();
      }
    });
  });

  test("what a client is given wins over the environment", () => {
    const env = { RUNIFOLD_TARGET: "a:1", RUNIFOLD_NAMESPACE: "ns-env", RUNIFOLD_TOKEN: "t-env" };
    assert.deepEqual(fromEnvironment({}, env), { target: "a:1", namespace: "ns-env", token: "t-env" });
    assert.deepEqual(fromEnvironment({ target: "b:2", namespace: "", token: "" }, env), {
      target: "b:2",
      namespace: "",
      token: "",
    });
    assert.deepEqual(fromEnvironment({}, {}), { target: "127.0.0.1:50051", namespace: "", token: "" });
  });

  test("RUNIFOLD_TOKEN is sent as the bearer token; token: '' sends none", async () => {
    const backend = await recordingServer();
    try {
      await withEnv({ RUNIFOLD_TARGET: backend.address, RUNIFOLD_TOKEN: "from-the-env" }, async () => {
        const fromEnv = new RunifoldClient({ namespace: "n" });
        const none = new RunifoldClient({ namespace: "n", token: "" });
        try {
          await fromEnv.getBacklog();
          await none.getBacklog();
        } finally {
          fromEnv.close();
          none.close();
        }
      });
      assert.deepEqual(backend.seen, [["Bearer from-the-env"], []]);
    } finally {
      backend.stop();
    }
  });

  test("a call (or a watch) that reaches no server says where it tried to connect, once", async () => {
    const target = `127.0.0.1:${await closedPort()}`;
    const client = new RunifoldClient({ target, namespace: "n", timeoutMs: 10_000 });
    try {
      await assert.rejects(client.getBacklog(), (error: unknown) => {
        assert.ok(error instanceof Unavailable, String(error));
        assert.equal(error.target, target);
        assert.equal(error.reason, "UNAVAILABLE");
        assert.equal(error.message.split(`cannot reach ${target}`).length - 1, 1, error.message);
        return true;
      });
      // A watch, which resumes broken streams, says so too instead of waiting forever.
      const watching = client.watchConversation("0190c2a0-0000-7000-8000-000000000001");
      await assert.rejects(watching.next(), (error: unknown) => error instanceof Unavailable);
    } finally {
      client.close();
    }
  });
});
