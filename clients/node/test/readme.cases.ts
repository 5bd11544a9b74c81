// The README's examples, each run as written against the server.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";

import { PACKAGE } from "./support.js";
import { server } from "./stack.js";

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
