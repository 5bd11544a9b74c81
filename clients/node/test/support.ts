// What the tests start for themselves: a real Runifold server (`python -m services`, the
// all-in-one process) and a fake OpenAI-compatible model for it to call.
//
// The server comes from this repository: its Python is RUNIFOLD_PYTHON, or the virtual
// environment `make run` makes (../../.venv/bin/python). It keeps its data in a temporary
// folder and uses the embedded PostgreSQL, or DATABASE_URL when that is set (the Python
// test suite passes its own database, migrated already).

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

// dist/test/support.js -> the repository's root.
export const REPOSITORY = fileURLToPath(new URL("../../../../", import.meta.url));
export const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));

export interface ChatRequest {
  messages: Array<{ role: string; content?: string | null }>;
  stream?: boolean;
}

/** A fake model: answers every chat completion with `reply`, after `before(request)`. */
export class FakeModel {
  reply = "Here is my answer.";
  before: (request: ChatRequest) => Promise<void> = async () => {};
  readonly requests: ChatRequest[] = [];
  private server?: http.Server;
  baseUrl = "";

  async start(): Promise<void> {
    this.server = http.createServer((request, response) => {
      let body = "";
      request.on("data", (chunk) => (body += chunk));
      request.on("end", () => {
        void this.answer(JSON.parse(body || "{}") as ChatRequest, response);
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    const { port } = this.server.address() as AddressInfo;
    this.baseUrl = `http://127.0.0.1:${port}/v1`;
  }

  private async answer(body: ChatRequest, response: http.ServerResponse): Promise<void> {
    this.requests.push(body);
    await this.before(body);
    const usage = { prompt_tokens: 40, completion_tokens: 5, total_tokens: 45 };
    if (body.stream) {
      response.writeHead(200, { "content-type": "text/event-stream" });
      const chunk = (delta: object, finish: string | null) =>
        `data: ${JSON.stringify({
          id: "chatcmpl-fake",
          object: "chat.completion.chunk",
          model: "fake-model",
          choices: [{ index: 0, delta, finish_reason: finish }],
        })}\n\n`;
      for (const word of this.reply.split(/(?<= )/)) {
        response.write(chunk({ role: "assistant", content: word }, null));
      }
      response.write(chunk({}, "stop"));
      response.write(`data: ${JSON.stringify({ id: "chatcmpl-fake", choices: [], usage })}\n\n`);
      response.end("data: [DONE]\n\n");
      return;
    }
    response.writeHead(200, { "content-type": "application/json" });
    response.end(
      JSON.stringify({
        id: "chatcmpl-fake",
        object: "chat.completion",
        model: "fake-model",
        choices: [
          { index: 0, message: { role: "assistant", content: this.reply }, finish_reason: "stop" },
        ],
        usage,
      }),
    );
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }
}

/** A running all-in-one server. */
export class Server {
  private constructor(
    readonly address: string,
    private readonly process: ChildProcess,
    private readonly dataDir: string,
    readonly output: string[],
  ) {}

  static async start(model: FakeModel, timeoutMs = 180_000): Promise<Server> {
    const python = process.env.RUNIFOLD_PYTHON ?? path.join(REPOSITORY, ".venv", "bin", "python");
    const dataDir = mkdtempSync(path.join(os.tmpdir(), "runifold-node-"));
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      RUNIFOLD_LISTEN: "127.0.0.1:0",
      RUNIFOLD_METRICS_LISTEN: "off",
      // No HTTP port: the tests speak gRPC, and 8080 may be taken (a `make run` beside them).
      RUNIFOLD_HTTP_LISTEN: "off",
      RUNIFOLD_DATA_DIR: dataDir,
      RUNIFOLD_LOG_LEVEL: "WARNING",
      RUNIFOLD_LOG_FORMAT: "json",
      RUNIFOLD_SUMMARY_POLL_INTERVAL_S: "0.05",
      // The memory tests write memories themselves: no automatic curation beside them.
      RUNIFOLD_CURATION: "off",
      RUNIFOLD_AGENT_MODEL_URL: model.baseUrl,
      RUNIFOLD_AGENT_MODEL_NAME: "fake-model",
      RUNIFOLD_AGENT_MODEL_API_KEY: "not-a-real-key",
      HF_HUB_OFFLINE: "1",
      TRANSFORMERS_OFFLINE: "1",
    };
    const child = spawn(python, ["-m", "services"], {
      cwd: REPOSITORY,
      env,
      stdio: ["ignore", "ignore", "pipe"],
    });
    const output: string[] = [];
    const lines = createInterface({ input: child.stderr! });
    const address = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`the server did not start in time:\n${output.join("\n")}`)),
        timeoutMs,
      );
      child.on("error", (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot run ${python} (set RUNIFOLD_PYTHON, or run make run): ${error}`));
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the server exited (${code}) before serving:\n${output.join("\n")}`));
      });
      lines.on("line", (line) => {
        output.push(line);
        const match = / on (\S+?)(?:;|$)/.exec(line);
        if (line.includes("serving") && match) {
          clearTimeout(timer);
          resolve(match[1]);
        }
      });
    });
    return new Server(address, child, dataDir, output);
  }

  async stop(): Promise<void> {
    if (this.process.exitCode === null) {
      const exited = new Promise((resolve) => this.process.once("exit", resolve));
      this.process.kill("SIGTERM");
      await exited;
    }
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

/** Poll `predicate` until it is true, failing after `timeoutMs` (never a bare sleep). */
export async function waitFor(predicate: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error("condition not reached within the deadline");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
