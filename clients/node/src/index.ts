// TypeScript client of the Runifold conversation services.
//
// Built from the same .proto files as every other client (proto/ at the
// repository root), loaded at run time with @grpc/proto-loader: nothing in
// the contract is Python-only. Errors carry the server's google.rpc.ErrorInfo
// reason and metadata, and a TurnConflict detail when a turn lost the race.

import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const require = createRequire(import.meta.url);
// protobufjs comes with @grpc/proto-loader; it decodes the status details.
const protobuf = require("protobufjs") as typeof import("protobufjs");

const here = path.dirname(fileURLToPath(import.meta.url));
const DEFAULT_PROTO_DIR = path.resolve(here, "../../../../proto");

// The status details the server sends (google/rpc/status.proto and the ErrorInfo of
// google/rpc/error_details.proto, same names and numbers), defined here so that the
// client needs no copy of googleapis.
const GOOGLE_RPC = {
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: {
              fields: {
                type_url: { type: "string", id: 1 },
                value: { type: "bytes", id: 2 },
              },
            },
          },
        },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: "int32", id: 1 },
                message: { type: "string", id: 2 },
                details: { rule: "repeated", type: "google.protobuf.Any", id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: "string", id: 1 },
                domain: { type: "string", id: 2 },
                metadata: { keyType: "string", type: "string", id: 3 },
              },
            },
          },
        },
      },
    },
  },
};

const SERVICE_FILES = [
  "runifold/transcript/v1/transcript_service.proto",
  "runifold/summary/v1/summary_service.proto",
  "runifold/memory/v1/memory_service.proto",
  "runifold/agent/v1/agent_service.proto",
];

export type Role = "ROLE_USER" | "ROLE_ASSISTANT" | "ROLE_TOOL" | "ROLE_SYSTEM";

export interface ToolCall {
  id: string;
  name: string;
  arguments_json: string;
}

export interface Message {
  role: Role;
  text?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  metadata?: Record<string, string>;
}

export interface Usage {
  input_tokens: number;
  output_tokens: number;
  model_calls: number;
}

export interface Outcome {
  output: Message[];
  usage: Usage;
}

export interface ContextPolicy {
  window?: number;
  summary_batch?: number;
  memory_limit?: number;
  summary_mode?: "SUMMARY_MODE_REQUIRE" | "SUMMARY_MODE_AUTO";
  max_summary_passes?: number;
}

export interface TurnResult {
  conversation_id: string;
  conversation_version: number;
  first_sequence: number;
  last_sequence: number;
  outcome: Outcome;
  tool_calls: ToolCall[];
  replayed: boolean;
  created: boolean;
}

export interface TurnConflictDetail {
  outcome: Outcome;
  current_version: number;
  expected_version: number;
}

/** A failed call: the gRPC status, the stable ErrorInfo reason and what the server attached. */
export class RunifoldError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly reason: string,
    message: string,
    readonly metadata: Record<string, string>,
    readonly turnConflict?: TurnConflictDetail,
  ) {
    super(`${grpc.status[code]} ${reason}: ${message}`);
    this.name = "RunifoldError";
  }
}

export interface ClientOptions {
  target?: string;
  namespace?: string;
  token?: string;
  credentials?: grpc.ChannelCredentials;
  timeoutMs?: number;
  protoDir?: string;
}

type Stub = grpc.Client & Record<string, Function>;

const user = (text: string): Message => ({ role: "ROLE_USER", text });

function randomId(): string {
  return globalThis.crypto.randomUUID();
}

export class RunifoldClient {
  readonly namespace: string;
  private readonly timeoutMs: number;
  private readonly metadata: grpc.Metadata;
  private readonly stubs: Record<"transcript" | "summary" | "memory" | "agent", Stub>;
  private readonly details: import("protobufjs").Root;

  constructor(options: ClientOptions = {}) {
    const protoDir = options.protoDir ?? DEFAULT_PROTO_DIR;
    const definition = protoLoader.loadSync(SERVICE_FILES, {
      includeDirs: [protoDir],
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const loaded = grpc.loadPackageDefinition(definition) as any;
    const target = options.target ?? "127.0.0.1:50051";
    const credentials = options.credentials ?? grpc.credentials.createInsecure();
    const make = (ctor: any): Stub => new ctor(target, credentials) as Stub;
    this.stubs = {
      transcript: make(loaded.runifold.transcript.v1.TranscriptService),
      summary: make(loaded.runifold.summary.v1.SummaryService),
      memory: make(loaded.runifold.memory.v1.MemoryService),
      agent: make(loaded.runifold.agent.v1.AgentService),
    };
    // google.rpc.Status and ErrorInfo (above), and runifold.agent.v1.TurnConflict from
    // protoDir (its imports resolve against protoDir; google/protobuf/* are bundled).
    this.details = protobuf.Root.fromJSON(GOOGLE_RPC);
    this.details.resolvePath = (_origin: string, target: string) =>
      target.startsWith("google/protobuf/") ? target : path.join(protoDir, target);
    this.details.loadSync(SERVICE_FILES[3], { keepCase: true });
    this.namespace = options.namespace ?? "";
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.metadata = new grpc.Metadata();
    if (options.token) this.metadata.set("authorization", `Bearer ${options.token}`);
  }

  close(): void {
    for (const stub of Object.values(this.stubs)) stub.close();
  }

  /** Turn a gRPC error into a RunifoldError with ErrorInfo and TurnConflict decoded. */
  toError(error: grpc.ServiceError): RunifoldError {
    let reason = grpc.status[error.code] ?? "UNKNOWN";
    let metadata: Record<string, string> = {};
    let turnConflict: TurnConflictDetail | undefined;
    const raw = error.metadata?.get("grpc-status-details-bin")?.[0];
    if (raw instanceof Buffer) {
      const Status = this.details.lookupType("google.rpc.Status");
      const status = Status.toObject(Status.decode(new Uint8Array(raw)), {
        longs: Number,
        enums: String,
      }) as any;
      for (const detail of status.details ?? []) {
        const typeName = String(detail.type_url).split("/").pop() ?? "";
        const type = this.details.lookupType(typeName);
        const value = type.toObject(type.decode(detail.value), {
          longs: Number,
          enums: String,
          defaults: true,
        }) as any;
        if (typeName === "google.rpc.ErrorInfo") {
          reason = value.reason;
          metadata = value.metadata ?? {};
        } else if (typeName === "runifold.agent.v1.TurnConflict") {
          turnConflict = value as TurnConflictDetail;
        }
      }
    }
    return new RunifoldError(error.code, reason, error.details, metadata, turnConflict);
  }

  private call<T>(service: keyof RunifoldClient["stubs"], method: string, request: object): Promise<T> {
    const stub = this.stubs[service];
    const deadline = new Date(Date.now() + this.timeoutMs);
    return new Promise<T>((resolve, reject) => {
      stub[method](request, this.metadata, { deadline }, (error: grpc.ServiceError | null, reply: T) => {
        if (error) reject(this.toError(error));
        else resolve(reply);
      });
    });
  }

  async createConversation(options: { namespace?: string; conversationId?: string } = {}): Promise<any> {
    const reply = await this.call<any>("transcript", "CreateConversation", {
      namespace: options.namespace ?? this.namespace,
      conversation_id: options.conversationId ?? "",
    });
    return reply.conversation;
  }

  async getConversation(conversationId: string, namespace = this.namespace): Promise<any> {
    const reply = await this.call<any>("transcript", "GetConversation", {
      namespace,
      conversation_id: conversationId,
    });
    return reply.conversation;
  }

  /** Append messages; with expectedVersion it is a compare-and-swap (VERSION_CONFLICT). */
  append(
    conversationId: string,
    messages: Array<Message | string>,
    options: { namespace?: string; expectedVersion?: number; requestId?: string } = {},
  ): Promise<{ version: number; first_sequence: number; last_sequence: number; replayed: boolean }> {
    const request: Record<string, unknown> = {
      namespace: options.namespace ?? this.namespace,
      conversation_id: conversationId,
      messages: messages.map((m) => (typeof m === "string" ? user(m) : m)),
      request_id: options.requestId ?? randomId(),
    };
    if (options.expectedVersion !== undefined) request.expected_version = options.expectedVersion;
    return this.call("transcript", "AppendEntries", request);
  }

  /** Run one agent turn. A turn id is always sent, so a retry returns the first outcome. */
  runConversation(
    input: string | Message[],
    options: {
      conversationId?: string;
      namespace?: string;
      turnId?: string;
      policy?: ContextPolicy;
      systemInstructions?: string;
      createIfMissing?: boolean;
    } = {},
  ): Promise<TurnResult> {
    return this.call("agent", "RunConversation", {
      namespace: options.namespace ?? this.namespace,
      conversation_id: options.conversationId ?? "",
      input: typeof input === "string" ? [user(input)] : input,
      turn_id: options.turnId ?? randomId(),
      policy: options.policy ?? {},
      system_instructions: options.systemInstructions ?? "",
      create_if_missing: options.createIfMissing ?? true,
    });
  }
}
