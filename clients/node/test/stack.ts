// The server, the fake model and the client the cases share (one of each for the whole
// run: client.test.ts imports every case file), and what the cases use of them.

import { after, before } from "node:test";

import { RunifoldClient } from "../src/index.js";
import { FakeModel, Server } from "./support.js";

const RACE = /\[race:([A-Za-z0-9_.-]+):([0-9a-f-]{36})\]/;
export let model: FakeModel;
export let server: Server;
export let client: RunifoldClient;
let namespaceCount = 0;

/** A client on a namespace no other test uses. */
export function fresh(): RunifoldClient {
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

export const collect = async <T>(items: AsyncIterable<T>): Promise<T[]> => {
  const found: T[] = [];
  for await (const item of items) found.push(item);
  return found;
};
