// TypeScript client of the Runifold conversation services (@grpc/grpc-js).
//
// Every RPC of the four services (AgentService, TranscriptService, SummaryService,
// MemoryService) is a method of RunifoldClient. The package ships the .proto files it
// loads at run time (proto/, copied from the repository's contract when it is built)
// and types generated from them (src/gen/). Errors are typed (errors.ts): the server's
// google.rpc.ErrorInfo reason picks the class, its metadata and the other status
// details (TurnConflict, RetryInfo, BadRequest, ...) are decoded.
//
// Writes are safe to retry: a turn carries a `turn_id`, appends and memory writes a
// `request_id`, createConversation a conversation id, each made here when you pass
// none, so a retry returns the first result. gRPC retries UNAVAILABLE itself (a
// service-config retryPolicy), on every method but Summarize and ProposeMemories.

import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { BY_CODE, BY_REASON, RunifoldError, type Detail } from "./errors.js";
import type { ProtoGrpcType as AgentProto } from "./gen/agent_service.js";
import type { ProtoGrpcType as MemoryProto } from "./gen/memory_service.js";
import type { ProtoGrpcType as SummaryProto } from "./gen/summary_service.js";
import type { ProtoGrpcType as TranscriptProto } from "./gen/transcript_service.js";
import type { AgentServiceClient } from "./gen/runifold/agent/v1/AgentService.js";
import type { ConcurrencyMode } from "./gen/runifold/agent/v1/ConcurrencyMode.js";
import type { ContextPolicy } from "./gen/runifold/agent/v1/ContextPolicy.js";
import type { EraseConversationResponse__Output } from "./gen/runifold/agent/v1/EraseConversationResponse.js";
import type { RunConversationRequest } from "./gen/runifold/agent/v1/RunConversationRequest.js";
import type { RunConversationResponse__Output } from "./gen/runifold/agent/v1/RunConversationResponse.js";
import type { StreamConversationResponse__Output } from "./gen/runifold/agent/v1/StreamConversationResponse.js";
import type { Budget } from "./gen/runifold/common/v1/Budget.js";
import type { Entry__Output } from "./gen/runifold/common/v1/Entry.js";
import type { Message } from "./gen/runifold/common/v1/Message.js";
import type { ToolDefinition } from "./gen/runifold/common/v1/ToolDefinition.js";
import type { Usage } from "./gen/runifold/common/v1/Usage.js";
import type { Memory__Output } from "./gen/runifold/memory/v1/Memory.js";
import type { MemoryServiceClient } from "./gen/runifold/memory/v1/MemoryService.js";
import type { MemoryProposal__Output } from "./gen/runifold/memory/v1/MemoryProposal.js";
import type { MemoryRevision__Output } from "./gen/runifold/memory/v1/MemoryRevision.js";
import type { MemorySource } from "./gen/runifold/memory/v1/MemorySource.js";
import type { ProposeMemoriesResponse__Output } from "./gen/runifold/memory/v1/ProposeMemoriesResponse.js";
import type { SearchMemoriesResponse__Output } from "./gen/runifold/memory/v1/SearchMemoriesResponse.js";
import type { UpsertMemoryResponse__Output } from "./gen/runifold/memory/v1/UpsertMemoryResponse.js";
import type { GetBacklogResponse__Output } from "./gen/runifold/summary/v1/GetBacklogResponse.js";
import type { RequestSummaryResponse__Output } from "./gen/runifold/summary/v1/RequestSummaryResponse.js";
import type { SummarizeResponse__Output } from "./gen/runifold/summary/v1/SummarizeResponse.js";
import type { Summary__Output } from "./gen/runifold/summary/v1/Summary.js";
import type { SummaryServiceClient } from "./gen/runifold/summary/v1/SummaryService.js";
import type { AcquireTurnLeaseResponse__Output } from "./gen/runifold/transcript/v1/AcquireTurnLeaseResponse.js";
import type { AppendEntriesResponse__Output } from "./gen/runifold/transcript/v1/AppendEntriesResponse.js";
import type { Conversation__Output } from "./gen/runifold/transcript/v1/Conversation.js";
import type { DeleteConversationResponse__Output } from "./gen/runifold/transcript/v1/DeleteConversationResponse.js";
import type { EndedTurn } from "./gen/runifold/transcript/v1/EndedTurn.js";
import type { GetStateResponse__Output } from "./gen/runifold/transcript/v1/GetStateResponse.js";
import type { StateDelta } from "./gen/runifold/transcript/v1/StateDelta.js";
import type { LoadViewResponse__Output } from "./gen/runifold/transcript/v1/LoadViewResponse.js";
import type { TranscriptServiceClient } from "./gen/runifold/transcript/v1/TranscriptService.js";
import type { TurnLease__Output } from "./gen/runifold/transcript/v1/TurnLease.js";
import type { TurnLeaseMode } from "./gen/runifold/transcript/v1/TurnLeaseMode.js";
import type { WatchConversationRequest } from "./gen/runifold/transcript/v1/WatchConversationRequest.js";
import type { WatchConversationResponse__Output } from "./gen/runifold/transcript/v1/WatchConversationResponse.js";

export * from "./errors.js";
export { ConcurrencyMode } from "./gen/runifold/agent/v1/ConcurrencyMode.js";
export { Role } from "./gen/runifold/common/v1/Role.js";
export { SummaryMode } from "./gen/runifold/agent/v1/SummaryMode.js";
export { TurnLeaseMode } from "./gen/runifold/transcript/v1/TurnLeaseMode.js";
export { TurnStage } from "./gen/runifold/agent/v1/TurnStage.js";
export { TurnFinish } from "./gen/runifold/transcript/v1/TurnFinish.js";
export type {
  AcquireTurnLeaseResponse__Output as AcquireTurnLeaseResponse,
  AppendEntriesResponse__Output as AppendEntriesResponse,
  Budget,
  ContextPolicy,
  Conversation__Output as Conversation,
  DeleteConversationResponse__Output as DeleteConversationResponse,
  EndedTurn,
  Entry__Output as Entry,
  EraseConversationResponse__Output as EraseConversationResponse,
  GetBacklogResponse__Output as GetBacklogResponse,
  LoadViewResponse__Output as LoadViewResponse,
  Memory__Output as Memory,
  MemorySource,
  Message,
  RequestSummaryResponse__Output as RequestSummaryResponse,
  RunConversationResponse__Output as TurnResult,
  SearchMemoriesResponse__Output as SearchMemoriesResponse,
  StreamConversationResponse__Output as StreamEvent,
  SummarizeResponse__Output as SummarizeResponse,
  Summary__Output as Summary,
  ToolDefinition,
  TurnLease__Output as TurnLease,
  UpsertMemoryResponse__Output as UpsertMemoryResponse,
  Usage,
  WatchConversationResponse__Output as WatchEvent,
};

/** The version of this package. */
export const VERSION = "0.1.0";
export const DEFAULT_TARGET = "127.0.0.1:50051";
/** Page size of the listing iterators (the servers allow at most 1000). */
export const PAGE_SIZE = 500;

const require = createRequire(import.meta.url);
// protobufjs comes with @grpc/proto-loader; it decodes the status details.
const protobuf = require("protobufjs") as typeof import("protobufjs");

// dist/src/index.js -> the package's proto/ (copied there by `npm run build`).
const PROTO_DIR = fileURLToPath(new URL("../../proto/", import.meta.url));
const SERVICE_FILES = [
  "runifold/agent/v1/agent_service.proto",
  "runifold/transcript/v1/transcript_service.proto",
  "runifold/summary/v1/summary_service.proto",
  "runifold/memory/v1/memory_service.proto",
];
// The options the types in src/gen were generated with (scripts/gen.mjs).
const LOAD_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

// The status details the server sends, from google/rpc/status.proto and
// error_details.proto (same names and field numbers): the client needs no googleapis.
const GOOGLE_RPC = {
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: {
              fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } },
            },
            Duration: {
              fields: { seconds: { type: "int64", id: 1 }, nanos: { type: "int32", id: 2 } },
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
            RetryInfo: { fields: { retry_delay: { type: "google.protobuf.Duration", id: 1 } } },
            BadRequest: {
              fields: {
                field_violations: { rule: "repeated", type: "FieldViolation", id: 1 },
              },
              nested: {
                FieldViolation: {
                  fields: {
                    field: { type: "string", id: 1 },
                    description: { type: "string", id: 2 },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
};

// The one method a retry is not safe for: its passes would spend model calls again.
// Calls that spend model calls again when retried (nothing is stored twice either way).
const NOT_RETRIED = new Set([
  "runifold.summary.v1.SummaryService/Summarize",
  "runifold.memory.v1.MemoryService/ProposeMemories",
]);

export interface ClientOptions {
  /** host:port of the server (default 127.0.0.1:50051). */
  target?: string;
  /** The default namespace of every call (each method takes `namespace` too). */
  namespace?: string;
  /** A bearer token, sent as `authorization: Bearer ...`. */
  token?: string;
  /** Channel credentials (default: plaintext, for loopback and development). */
  credentials?: grpc.ChannelCredentials;
  /** Deadline of each call, in milliseconds (default 60 s). */
  timeoutMs?: number;
  /** Attempts in all for a call answered UNAVAILABLE (2..5; 1 turns retries off). */
  maxAttempts?: number;
}

/** Options every call takes. */
export interface CallOptions {
  namespace?: string;
  timeoutMs?: number;
}

export type Input = string | Message | Array<string | Message>;

export interface WatchOptions extends CallOptions {
  /** Deliver the entries after this sequence (0: from the first). */
  afterSequence?: number;
  /**
   * The incarnation followed, when resuming (a string keeps all 64 bits; see
   * `RunifoldClient.watchPosition`). 0: whatever incarnation exists.
   */
  incarnation?: string | number;
  /** How often a quiet stream gets a heartbeat, 1..300 s (default: the server's). */
  heartbeatSeconds?: number;
  /** Watch again after UNAVAILABLE and WATCHER_TOO_SLOW (default true). */
  resume?: boolean;
  /** The longest wait between two attempts (default 5000 ms). */
  maxBackoffMs?: number;
  /** Stop watching (the iteration then ends). */
  signal?: AbortSignal;
}

/** Where a watch stands: what to send back to resume it elsewhere. */
export interface WatchPosition {
  afterSequence: number;
  /** Exact (64 bits) as a decimal string. */
  incarnation: string;
}

export interface TurnOptions extends CallOptions {
  conversationId?: string;
  /** Idempotency key of the turn (default: a new UUID). */
  turnId?: string;
  policy?: ContextPolicy;
  budget?: Budget;
  systemInstructions?: string;
  /** Create the conversation if it does not exist (default true). */
  createIfMissing?: boolean;
  tools?: ToolDefinition[];
  concurrency?: ConcurrencyMode;
}

/** A user message. */
export const user = (text: string, metadata?: Record<string, string>): Message => ({
  role: "ROLE_USER",
  text,
  metadata: metadata ?? {},
});
/** An assistant message (for direct transcript appends). */
export const assistant = (text: string): Message => ({ role: "ROLE_ASSISTANT", text });
/** The result of a tool call the model asked for, to send as the next turn's input. */
export const toolResult = (toolCallId: string, text: string): Message => ({
  role: "ROLE_TOOL",
  text,
  tool_call_id: toolCallId,
});

function messages(input: Input): Message[] {
  const items = Array.isArray(input) ? input : [input];
  return items.map((item) => (typeof item === "string" ? user(item) : item));
}

/** A UUIDv7 (RFC 9562): time-ordered like the server's ids, made here so that a retried
 * CreateConversation names the same conversation. */
export function newConversationId(): string {
  const bytes = globalThis.crypto.getRandomValues(new Uint8Array(16));
  const millis = BigInt(Date.now());
  for (let i = 0; i < 6; i++) bytes[i] = Number((millis >> BigInt(8 * (5 - i))) & 0xffn);
  bytes[6] = (bytes[6] & 0x0f) | 0x70; // version 7
  bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

const randomId = (): string => globalThis.crypto.randomUUID();

const SEARCH_MODES = {
  unspecified: "SEARCH_MODE_UNSPECIFIED",
  dense: "SEARCH_MODE_DENSE",
  lexical: "SEARCH_MODE_LEXICAL",
  hybrid: "SEARCH_MODE_HYBRID",
} as const;

function duration(seconds: number | undefined): { seconds: number; nanos: number } | null {
  if (seconds === undefined) return null;
  const whole = Math.floor(seconds);
  return { seconds: whole, nanos: Math.round((seconds - whole) * 1e9) };
}

function timestamp(moment: Date | undefined): { seconds: number; nanos: number } | null {
  if (moment === undefined) return null;
  const millis = moment.getTime();
  return { seconds: Math.floor(millis / 1000), nanos: (millis % 1000) * 1e6 };
}

// The last overload of each generated stub method: what TypeScript infers the request
// and response types from. It is called with metadata and options too (the first one).
type UnaryMethod<Req, Res> = (
  request: Req,
  callback: grpc.requestCallback<Res>,
) => grpc.ClientUnaryCall;
type FullUnaryMethod<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: grpc.requestCallback<Res>,
) => grpc.ClientUnaryCall;

/** Client of every Runifold service on one channel. */
export class RunifoldClient {
  readonly target: string;
  namespace: string;
  private readonly timeoutMs: number;
  private readonly metadata: grpc.Metadata;
  private readonly agent: AgentServiceClient;
  private readonly transcripts: TranscriptServiceClient;
  private readonly summaries: SummaryServiceClient;
  private readonly memories: MemoryServiceClient;
  private readonly details: import("protobufjs").Root;
  private readonly watchMethod: protoLoader.MethodDefinition<object, object>;
  private readonly watchEvent: import("protobufjs").Type;
  private readonly positions = new WeakMap<object, WatchPosition>();

  constructor(options: ClientOptions = {}) {
    const definition = protoLoader.loadSync(SERVICE_FILES, {
      ...LOAD_OPTIONS,
      includeDirs: [PROTO_DIR],
    });
    const loaded = grpc.loadPackageDefinition(definition) as unknown as AgentProto &
      TranscriptProto &
      SummaryProto &
      MemoryProto;
    this.target = options.target ?? DEFAULT_TARGET;
    const credentials = options.credentials ?? grpc.credentials.createInsecure();
    const channelOptions = serviceConfig(definition, options.maxAttempts ?? 3);
    const v1 = loaded.runifold;
    this.agent = new v1.agent.v1.AgentService(this.target, credentials, channelOptions);
    // The other stubs share the first one's channel.
    const shared = { ...channelOptions, channelOverride: this.agent.getChannel() };
    this.transcripts = new v1.transcript.v1.TranscriptService(this.target, credentials, shared);
    this.summaries = new v1.summary.v1.SummaryService(this.target, credentials, shared);
    this.memories = new v1.memory.v1.MemoryService(this.target, credentials, shared);
    // google.rpc's details (above) and Runifold's own (TurnConflict, ModelOutputInvalid).
    this.details = protobuf.Root.fromJSON(GOOGLE_RPC);
    this.details.resolvePath = (_origin: string, target: string) =>
      target.startsWith("google/protobuf/") ? target : PROTO_DIR + target;
    this.details.loadSync(SERVICE_FILES[0], { keepCase: true });
    // The watch events decoded once more, with exact int64s (the incarnation).
    const transcriptTypes = new protobuf.Root();
    transcriptTypes.resolvePath = this.details.resolvePath;
    transcriptTypes.loadSync(SERVICE_FILES[1], { keepCase: true });
    this.watchEvent = transcriptTypes.lookupType("runifold.transcript.v1.WatchConversationResponse");
    const service = definition["runifold.transcript.v1.TranscriptService"] as protoLoader.ServiceDefinition;
    this.watchMethod = service.WatchConversation as protoLoader.MethodDefinition<object, object>;
    this.namespace = options.namespace ?? "";
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.metadata = new grpc.Metadata();
    if (options.token) this.metadata.set("authorization", `Bearer ${options.token}`);
  }

  /** Close the channel. */
  close(): void {
    this.agent.close();
  }

  /** The typed error of a failed call, ErrorInfo and the other details decoded. */
  toError(error: grpc.ServiceError): RunifoldError {
    let reason = grpc.status[error.code] ?? "UNKNOWN";
    let metadata: Record<string, string> = {};
    const details: Detail[] = [];
    const raw = error.metadata?.get("grpc-status-details-bin")?.[0];
    if (raw instanceof Buffer) {
      const Status = this.details.lookupType("google.rpc.Status");
      const status = Status.toObject(Status.decode(new Uint8Array(raw)), LOAD_OPTIONS) as any;
      for (const packed of status.details ?? []) {
        const typeName = String(packed.type_url).split("/").pop() ?? "";
        let type: import("protobufjs").Type;
        try {
          type = this.details.lookupType(typeName);
        } catch {
          continue; // a detail of a type this client does not know
        }
        const value = type.toObject(type.decode(packed.value), LOAD_OPTIONS) as any;
        if (typeName === "google.rpc.ErrorInfo") {
          reason = value.reason;
          metadata = value.metadata ?? {};
        } else {
          details.push({ typeName, value });
        }
      }
    }
    const Class = BY_REASON[reason] ?? BY_CODE[error.code] ?? RunifoldError;
    return new Class(error.code, reason, error.details, metadata, details);
  }

  private ns(options: CallOptions | undefined): string {
    return options?.namespace ?? this.namespace;
  }

  private unary<Req, Res>(
    method: UnaryMethod<Req, Res>,
    request: Req,
    options?: CallOptions,
  ): Promise<Res> {
    const deadline = new Date(Date.now() + (options?.timeoutMs ?? this.timeoutMs));
    const call = method as unknown as FullUnaryMethod<Req, Res>;
    return new Promise<Res>((resolve, reject) => {
      call(request, this.metadata, { deadline }, (error, reply) => {
        if (error) reject(this.toError(error));
        else resolve(reply as Res);
      });
    });
  }

  private async *pages<Page, Item>(
    fetch: (token: string) => Promise<Page>,
    items: (page: Page) => Item[],
    next: (page: Page) => string,
  ): AsyncGenerator<Item> {
    let token = "";
    do {
      const page = await fetch(token);
      yield* items(page);
      token = next(page);
    } while (token);
  }

  // -- turns (AgentService) ------------------------------------------------------

  private turnRequest(input: Input, options: TurnOptions): RunConversationRequest {
    return {
      namespace: this.ns(options),
      conversation_id: options.conversationId ?? "",
      input: messages(input),
      turn_id: options.turnId ?? randomId(),
      policy: options.policy ?? {},
      budget: options.budget ?? {},
      system_instructions: options.systemInstructions ?? "",
      create_if_missing: options.createIfMissing ?? true,
      tools: options.tools ?? [],
      concurrency: options.concurrency ?? "CONCURRENCY_MODE_RACE",
    };
  }

  /** Run one agent turn. Throws TurnConflict, SummaryRequired, ConversationBusy, ... */
  runConversation(input: Input, options: TurnOptions = {}): Promise<RunConversationResponse__Output> {
    return this.unary(
      this.agent.RunConversation.bind(this.agent),
      this.turnRequest(input, options),
      options,
    );
  }

  /** The same turn as a stream of events: progress, text deltas, then the result. */
  async *streamConversation(
    input: Input,
    options: TurnOptions = {},
  ): AsyncGenerator<StreamConversationResponse__Output> {
    const deadline = new Date(Date.now() + (options.timeoutMs ?? this.timeoutMs));
    const call = this.agent.StreamConversation(this.turnRequest(input, options), this.metadata, {
      deadline,
    });
    try {
      for await (const event of call) yield event as StreamConversationResponse__Output;
    } catch (error) {
      throw this.toError(error as grpc.ServiceError);
    } finally {
      call.cancel();
    }
  }

  /** Erase a conversation everywhere: entries, summaries, jobs, derived memories. */
  eraseConversation(conversationId: string, options?: CallOptions): Promise<EraseConversationResponse__Output> {
    return this.unary(
      this.agent.EraseConversation.bind(this.agent),
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
  }

  // -- transcripts (TranscriptService) -------------------------------------------

  /** Create (or get, when it exists) a conversation; its id is made here when absent. */
  async createConversation(
    options: CallOptions & {
      conversationId?: string;
      labels?: Record<string, string>;
      /** The conversation's user (its user state, ListConversations' filter). */
      userId?: string;
      /** Initial state, as JSON objects of keys (conversation, user, namespace). */
      state?: StateDelta;
    } = {},
  ): Promise<Conversation__Output> {
    const reply = await this.unary(
      this.transcripts.CreateConversation.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: options.conversationId || newConversationId(),
        labels: options.labels ?? {},
        user_id: options.userId ?? "",
        state: options.state ?? null,
      },
      options,
    );
    return reply.conversation!;
  }

  /** A conversation's version and counters. */
  async getConversation(conversationId: string, options?: CallOptions): Promise<Conversation__Output> {
    const reply = await this.unary(
      this.transcripts.GetConversation.bind(this.transcripts),
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
    return reply.conversation!;
  }

  /** Every conversation of a namespace, in id order, page by page. */
  listConversations(
    options: CallOptions & {
      pageSize?: number;
      /** Only this user's conversations. */
      userId?: string;
      /** With each conversation's state (pages of at most 50). */
      withState?: boolean;
    } = {},
  ): AsyncGenerator<Conversation__Output> {
    return this.pages(
      (token) =>
        this.unary(
          this.transcripts.ListConversations.bind(this.transcripts),
          {
            namespace: this.ns(options),
            page_size: options.pageSize ?? (options.withState ? 50 : PAGE_SIZE),
            page_token: token,
            user_id: options.userId ?? "",
            view: options.withState ? "CONVERSATION_VIEW_FULL" : "CONVERSATION_VIEW_BASIC",
          },
          options,
        ),
      (page) => page.conversations,
      (page) => page.next_page_token,
    );
  }

  /** Append messages; with expectedVersion it is a compare-and-swap (VersionConflict).
   * Idempotent by requestId (made here when absent). Also `append`. */
  appendEntries(
    conversationId: string,
    input: Input,
    options: CallOptions & {
      expectedVersion?: number;
      requestId?: string;
      usage?: Usage;
      fencingToken?: number;
      /** State changes committed with the append, under its version. */
      stateDelta?: StateDelta;
      /** Entries to retract (recorded; views and summaries leave them out); needs
       * expectedVersion. */
      retractSequences?: number[];
    } = {},
  ): Promise<AppendEntriesResponse__Output> {
    return this.unary(
      this.transcripts.AppendEntries.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        messages: messages(input),
        request_id: options.requestId ?? randomId(),
        usage: options.usage ?? null,
        expected_version: options.expectedVersion,
        fencing_token: options.fencingToken,
        state_delta: options.stateDelta ?? null,
        retract_sequences: options.retractSequences ?? [],
      },
      options,
    );
  }

  /** The namespace's state and, for each user asked, that user's state (JSON). */
  getState(options: CallOptions & { userIds?: string[] } = {}): Promise<GetStateResponse__Output> {
    return this.unary(
      this.transcripts.GetState.bind(this.transcripts),
      { namespace: this.ns(options), user_ids: options.userIds ?? [] },
      options,
    );
  }

  /** The same as appendEntries. */
  append(...args: Parameters<RunifoldClient["appendEntries"]>): Promise<AppendEntriesResponse__Output> {
    return this.appendEntries(...args);
  }

  /** Every entry after a sequence (up to throughSequence; 0: the end), page by page. */
  listEntries(
    conversationId: string,
    options: CallOptions & { afterSequence?: number; throughSequence?: number } = {},
  ): AsyncGenerator<Entry__Output> {
    return this.pages(
      (token) =>
        this.unary(
          this.transcripts.ListEntries.bind(this.transcripts),
          {
            namespace: this.ns(options),
            conversation_id: conversationId,
            after_sequence: options.afterSequence ?? 0,
            through_sequence: options.throughSequence ?? 0,
            page_size: PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.entries,
      (page) => page.next_page_token,
    );
  }

  /**
   * Follow a conversation (TranscriptService.WatchConversation): the entries after
   * `afterSequence` (`appended` events, each entry once and in order), `retracted` for
   * delivered entries a later write retracted, the turns that run on it (`turn_started`,
   * `turn_finished`), `heartbeat`s while it is quiet, and a final
   * `erased` (then the iteration ends). No deadline: break out of the loop, or abort
   * `signal`, to leave.
   *
   * A stream that breaks (UNAVAILABLE; RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW) is watched
   * again from the last sequence received and its incarnation, with backoff: nothing is
   * missed and nothing repeats (a retraction the resumed stream reports again is dropped
   * here). Running turns are not reported started twice; a turn that
   * finished while the stream was down is reported `turn_finished` with
   * `TURN_FINISH_UNSPECIFIED`. Other errors are thrown (NotFound, ResourceExhausted /
   * WATCHER_LIMIT with its retry delay, ...).
   */
  async *watchConversation(
    conversationId: string,
    options: WatchOptions = {},
  ): AsyncGenerator<WatchConversationResponse__Output> {
    let after = options.afterSequence ?? 0;
    // int64 arrives as a JS number (53 bits): the incarnation is read again, exactly.
    let known = String(options.incarnation ?? 0);
    const running = new Set<string>();
    // The newest version an event showed: every retraction up to it was reported (the
    // server sends them before later entries), so a resumed stream's repeat is dropped.
    let version = 0;
    let announced: Set<string> | null = null;
    let attempt = 0;
    const method = this.watchMethod;
    const exact = this.watchEvent;
    const decode = (buffer: Buffer): [WatchConversationResponse__Output, string | null] => {
      const event = method.responseDeserialize(buffer) as WatchConversationResponse__Output;
      const raw = exact.toObject(exact.decode(new Uint8Array(buffer)), { longs: String }) as {
        appended?: { incarnation?: string };
        heartbeat?: { incarnation?: string };
      };
      return [event, raw.appended?.incarnation ?? raw.heartbeat?.incarnation ?? null];
    };
    const maxBackoffMs = options.maxBackoffMs ?? 5000;
    while (!options.signal?.aborted) {
      const request: WatchConversationRequest = {
        namespace: this.ns(options),
        conversation_id: conversationId,
        after_sequence: after,
        incarnation: known,
        heartbeat_interval: duration(options.heartbeatSeconds),
      };
      const call = this.transcripts.makeServerStreamRequest(
        method.path,
        method.requestSerialize as (value: WatchConversationRequest) => Buffer,
        decode,
        request,
        this.metadata,
        {},
      );
      const stop = () => call.cancel();
      options.signal?.addEventListener("abort", stop);
      try {
        for await (const [event, incarnation] of call as AsyncIterable<
          [WatchConversationResponse__Output, string | null]
        >) {
          if (incarnation !== null && incarnation !== "0") known = incarnation;
          if (event.event === "appended") {
            const entries = event.appended?.entries ?? [];
            if (entries.length) after = Number(entries[entries.length - 1].sequence);
            version = Math.max(version, Number(event.appended?.version ?? 0));
          } else if (event.event === "retracted") {
            const at = Number(event.retracted?.version ?? 0);
            if (at <= version) continue; // reported before the resume
            version = at;
          } else if (event.event === "turn_started") {
            const turnId = event.turn_started!.turn_id;
            announced?.add(turnId);
            if (running.has(turnId)) continue; // reported by the stream before the resume
            running.add(turnId);
          } else if (event.event === "turn_finished") {
            running.delete(event.turn_finished!.turn_id);
          } else if (event.event === "heartbeat") {
            version = Math.max(version, Number(event.heartbeat?.version ?? 0));
            attempt = 0;
            if (announced !== null) {
              for (const turnId of [...running].filter((t) => !announced!.has(t)).sort()) {
                running.delete(turnId);
                yield {
                  event: "turn_finished",
                  turn_finished: { turn_id: turnId, finish: "TURN_FINISH_UNSPECIFIED", version: 0, reason: "" },
                } as WatchConversationResponse__Output;
              }
              announced = null;
            }
          }
          this.positions.set(event, { afterSequence: after, incarnation: known });
          yield event;
          if (event.event === "erased") return;
        }
        return;
      } catch (error) {
        if (options.signal?.aborted) return;
        const failure = this.toError(error as grpc.ServiceError);
        const resumable =
          failure.code === grpc.status.UNAVAILABLE ||
          (failure.code === grpc.status.RESOURCE_EXHAUSTED && failure.reason === "WATCHER_TOO_SLOW");
        if (!(options.resume ?? true) || !resumable) throw failure;
      } finally {
        options.signal?.removeEventListener("abort", stop);
        call.cancel();
      }
      announced = new Set();
      const delay = Math.min(maxBackoffMs, 100 * 2 ** Math.min(attempt, 16)) * (0.5 + Math.random() / 2);
      await new Promise((resolve) => setTimeout(resolve, delay));
      attempt += 1;
    }
  }

  /** Where a watch stood after `event` (one this client's watchConversation yielded). */
  watchPosition(event: WatchConversationResponse__Output): WatchPosition | undefined {
    return this.positions.get(event);
  }

  /** The bounded context of a turn: the recent window, the summary buffer, the backlog. */
  loadView(
    conversationId: string,
    options: CallOptions & {
      window?: number;
      summaryBatch?: number;
      summarizedThrough?: number;
      requestId?: string;
    } = {},
  ): Promise<LoadViewResponse__Output> {
    return this.unary(
      this.transcripts.LoadView.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
        summarized_through: options.summarizedThrough ?? 0,
        request_id: options.requestId ?? "",
      },
      options,
    );
  }

  /** Erase a transcript (only the transcript: see eraseConversation). */
  deleteConversation(
    conversationId: string,
    options: CallOptions & { incarnation?: number } = {},
  ): Promise<DeleteConversationResponse__Output> {
    return this.unary(
      this.transcripts.DeleteConversation.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
  }

  /** Take a turn lease before model work (`lease`), or learn that the turn committed
   * (`committed`) or ended (`ended`) already. */
  acquireTurnLease(
    conversationId: string,
    turnId: string,
    options: CallOptions & {
      mode?: TurnLeaseMode;
      ttlSeconds?: number;
      payloadHash?: Uint8Array;
      createIfMissing?: boolean;
    } = {},
  ): Promise<AcquireTurnLeaseResponse__Output> {
    return this.unary(
      this.transcripts.AcquireTurnLease.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        mode: options.mode ?? "TURN_LEASE_MODE_SHARED",
        ttl: duration(options.ttlSeconds),
        payload_hash: options.payloadHash ? Buffer.from(options.payloadHash) : Buffer.alloc(0),
        create_if_missing: options.createIfMissing ?? false,
      },
      options,
    );
  }

  /** Extend a lease still held (TurnLeaseLost otherwise). */
  async renewTurnLease(
    conversationId: string,
    turnId: string,
    fencingToken: number,
    options: CallOptions & { ttlSeconds?: number } = {},
  ): Promise<TurnLease__Output> {
    const reply = await this.unary(
      this.transcripts.RenewTurnLease.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        fencing_token: fencingToken,
        ttl: duration(options.ttlSeconds),
      },
      options,
    );
    return reply.lease!;
  }

  /** End a turn that will not append (keeping its outcome when `ended` is given);
   * false when the lease was no longer held. */
  async releaseTurnLease(
    conversationId: string,
    turnId: string,
    fencingToken: number,
    options: CallOptions & { ended?: EndedTurn } = {},
  ): Promise<boolean> {
    const reply = await this.unary(
      this.transcripts.ReleaseTurnLease.bind(this.transcripts),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        turn_id: turnId,
        fencing_token: fencingToken,
        ended: options.ended ?? null,
      },
      options,
    );
    return reply.released;
  }

  // -- summaries (SummaryService) ------------------------------------------------

  /** The current summary, or null. */
  async getSummary(conversationId: string, options?: CallOptions): Promise<Summary__Output | null> {
    const reply = await this.unary(
      this.summaries.GetSummary.bind(this.summaries),
      { namespace: this.ns(options), conversation_id: conversationId },
      options,
    );
    return reply.summary ?? null;
  }

  /** Commit a summary of 1..throughSequence (monotonic; a compare-and-swap on
   * expectedThroughSequence when given: SummaryConflict). */
  async commitSummary(
    conversationId: string,
    text: string,
    throughSequence: number,
    options: CallOptions & { expectedThroughSequence?: number } = {},
  ): Promise<Summary__Output> {
    const reply = await this.unary(
      this.summaries.CommitSummary.bind(this.summaries),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        text,
        through_sequence: throughSequence,
        expected_through_sequence: options.expectedThroughSequence,
      },
      options,
    );
    return reply.summary!;
  }

  /** Run the summarizer now (never retried: its passes would spend model calls again). */
  summarize(
    conversationId: string,
    options: CallOptions & {
      window?: number;
      summaryBatch?: number;
      maxSummaryPasses?: number;
      budget?: Budget;
    } = {},
  ): Promise<SummarizeResponse__Output> {
    return this.unary(
      this.summaries.Summarize.bind(this.summaries),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
        max_summary_passes: options.maxSummaryPasses ?? 1,
        budget: options.budget ?? {},
      },
      options,
    );
  }

  /** Enqueue background summarization (one pending job per conversation). */
  requestSummary(
    conversationId: string,
    options: CallOptions & { window?: number; summaryBatch?: number } = {},
  ): Promise<RequestSummaryResponse__Output> {
    return this.unary(
      this.summaries.RequestSummary.bind(this.summaries),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        window: options.window ?? 16,
        summary_batch: options.summaryBatch ?? 64,
      },
      options,
    );
  }

  /** The summary job queue of a namespace. */
  getBacklog(options?: CallOptions): Promise<GetBacklogResponse__Output> {
    return this.unary(
      this.summaries.GetBacklog.bind(this.summaries),
      { namespace: this.ns(options) },
      options,
    );
  }

  /** Erase every summary and summary job of a conversation; the rows erased. */
  async eraseSummaries(
    conversationId: string,
    options: CallOptions & { incarnation?: number } = {},
  ): Promise<number> {
    const reply = await this.unary(
      this.summaries.EraseSummaries.bind(this.summaries),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
    return reply.erased;
  }

  // -- memories (MemoryService) --------------------------------------------------

  /** Create a memory, or replace it by compare-and-swap on expectedRevision
   * (RevisionConflict). Idempotent by requestId (made here when absent). */
  upsertMemory(
    content: string,
    options: CallOptions & {
      sources: MemorySource[];
      memoryId?: string;
      expectedRevision?: number;
      metadata?: Record<string, string>;
      ttlSeconds?: number;
      expireTime?: Date;
      requestId?: string;
      /** When the fact became true (default: the create time of its earliest source entry). */
      validFrom?: Date;
      /** When it stops being true (default: open-ended). */
      validUntil?: Date;
      /** Memories this one replaces: each ends where this one begins, kept in its history. */
      supersedes?: { memoryId: string; expectedRevision?: number }[];
    },
  ): Promise<UpsertMemoryResponse__Output> {
    return this.unary(
      this.memories.UpsertMemory.bind(this.memories),
      {
        namespace: this.ns(options),
        memory_id: options.memoryId ?? "",
        request_id: options.requestId ?? randomId(),
        content,
        sources: options.sources,
        metadata: options.metadata ?? {},
        expected_revision: options.expectedRevision,
        ttl: duration(options.ttlSeconds),
        expire_time: timestamp(options.expireTime),
        valid_from_time: timestamp(options.validFrom),
        valid_until_time: timestamp(options.validUntil),
        supersedes: (options.supersedes ?? []).map((s) => ({
          memory_id: s.memoryId,
          expected_revision: s.expectedRevision,
        })),
      },
      options,
    );
  }

  /** Curate a fact from one transcript range (both ends inclusive). */
  async remember(
    content: string,
    options: CallOptions & {
      conversationId: string;
      fromSequence: number;
      throughSequence: number;
      metadata?: Record<string, string>;
      requestId?: string;
    },
  ): Promise<Memory__Output> {
    const reply = await this.upsertMemory(content, {
      ...options,
      sources: [
        {
          conversation_id: options.conversationId,
          from_sequence: options.fromSequence,
          through_sequence: options.throughSequence,
        },
      ],
    });
    return reply.memory!;
  }

  /** One memory. */
  async getMemory(memoryId: string, options?: CallOptions): Promise<Memory__Output> {
    const reply = await this.unary(
      this.memories.GetMemory.bind(this.memories),
      { namespace: this.ns(options), memory_id: memoryId },
      options,
    );
    return reply.memory!;
  }

  /** Every memory of a namespace (only those from one conversation when given). */
  listMemories(
    options: CallOptions & {
      conversationId?: string;
      pageSize?: number;
      /** The memories valid at this time (default: now). */
      asOf?: Date;
      /** Every memory not deleted or expired, whatever its validity. */
      ignoreValidity?: boolean;
    } = {},
  ): AsyncGenerator<Memory__Output> {
    return this.pages(
      (token) =>
        this.unary(
          this.memories.ListMemories.bind(this.memories),
          {
            namespace: this.ns(options),
            conversation_id: options.conversationId ?? "",
            page_size: options.pageSize ?? PAGE_SIZE,
            page_token: token,
            as_of_time: timestamp(options.asOf),
            ignore_validity: options.ignoreValidity ?? false,
          },
          options,
        ),
      (page) => page.memories,
      (page) => page.next_page_token,
    );
  }

  /** Semantic search inside one namespace (limit 1..256; 0 means the default, 8). */
  searchMemories(
    query: string,
    options: CallOptions & {
      limit?: number;
      metadataFilter?: Record<string, string>;
      minScore?: number;
      /** The facts valid at this time (default: now). */
      asOf?: Date;
      /** How results are ranked: "dense", "lexical" or "hybrid" (default: the server's). */
      mode?: "dense" | "lexical" | "hybrid";
    } = {},
  ): Promise<SearchMemoriesResponse__Output> {
    return this.unary(
      this.memories.SearchMemories.bind(this.memories),
      {
        namespace: this.ns(options),
        query,
        limit: options.limit ?? 8,
        metadata_filter: options.metadataFilter ?? {},
        min_score: options.minScore ?? 0,
        as_of_time: timestamp(options.asOf),
        mode: SEARCH_MODES[options.mode ?? "unspecified"],
      },
      options,
    );
  }

  /** Delete a memory (compare-and-swap on its revision when given); false when it was
   * already gone. */
  async deleteMemory(
    memoryId: string,
    options: CallOptions & { expectedRevision?: number } = {},
  ): Promise<boolean> {
    const reply = await this.unary(
      this.memories.DeleteMemory.bind(this.memories),
      {
        namespace: this.ns(options),
        memory_id: memoryId,
        expected_revision: options.expectedRevision,
      },
      options,
    );
    return reply.deleted;
  }

  /** Delete every memory derived from a conversation (or a range of it); the count. */
  async forgetSource(
    conversationId: string,
    options: CallOptions & { fromSequence?: number; throughSequence?: number; incarnation?: number } = {},
  ): Promise<number> {
    const reply = await this.unary(
      this.memories.ForgetSource.bind(this.memories),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        from_sequence: options.fromSequence ?? 0,
        through_sequence: options.throughSequence ?? 0,
        incarnation: options.incarnation ?? 0,
      },
      options,
    );
    return reply.deleted_count;
  }

  /** Every revision of a memory, oldest first (erased ones keep only number, kind, time). */
  listMemoryRevisions(
    memoryId: string,
    options: CallOptions & { pageSize?: number } = {},
  ): AsyncGenerator<MemoryRevision__Output> {
    return this.pages(
      (token) =>
        this.unary(
          this.memories.ListMemoryRevisions.bind(this.memories),
          {
            namespace: this.ns(options),
            memory_id: memoryId,
            page_size: options.pageSize ?? PAGE_SIZE,
            page_token: token,
          },
          options,
        ),
      (page) => page.revisions,
      (page) => page.next_page_token,
    );
  }

  /** Proposals of memories from a transcript range (both ends inclusive); nothing is
   * stored until you confirm one (`confirmProposal`). Not retried: it spends model calls. */
  proposeMemories(
    conversationId: string,
    options: CallOptions & {
      fromSequence: number;
      throughSequence: number;
      maxProposals?: number;
      budget?: Budget;
      /** Only stored memories with these metadata pairs are matched. */
      metadataFilter?: Record<string, string>;
    },
  ): Promise<ProposeMemoriesResponse__Output> {
    return this.unary(
      this.memories.ProposeMemories.bind(this.memories),
      {
        namespace: this.ns(options),
        conversation_id: conversationId,
        from_sequence: options.fromSequence,
        through_sequence: options.throughSequence,
        max_proposals: options.maxProposals ?? 0,
        budget: options.budget ?? {},
        metadata_filter: options.metadataFilter ?? {},
      },
      options,
    );
  }

  /** Store a proposal: UpsertMemory with its content, sources and valid time (a SUPERSEDE
   * supersedes its related memory). A DUPLICATE is already stored: it throws. */
  confirmProposal(
    proposal: MemoryProposal__Output,
    options: CallOptions & { requestId?: string } = {},
  ): Promise<UpsertMemoryResponse__Output> {
    if (proposal.action === "PROPOSAL_ACTION_DUPLICATE") {
      throw new Error("a DUPLICATE proposal is already stored: there is nothing to confirm");
    }
    const from = proposal.valid_from_time;
    return this.upsertMemory(proposal.content, {
      ...options,
      sources: proposal.sources,
      validFrom: from ? new Date(Number(from.seconds) * 1000 + Math.floor(from.nanos / 1e6)) : undefined,
      supersedes:
        proposal.action === "PROPOSAL_ACTION_SUPERSEDE"
          ? [{ memoryId: proposal.related_memory_ids[0] }]
          : [],
    });
  }
}

/** Channel options: gRPC's retry policy (UNAVAILABLE only) for every method but Summarize and ProposeMemories. */
function serviceConfig(definition: protoLoader.PackageDefinition, maxAttempts: number): grpc.ChannelOptions {
  if (maxAttempts < 2) return { "grpc.enable_retries": 0 };
  const names = Object.values(definition)
    .filter((value): value is protoLoader.ServiceDefinition => !("format" in value) && !("type" in value))
    .flatMap((service) => Object.values(service))
    .map((method) => method.path.slice(1)) // "/pkg.Service/Method" -> "pkg.Service/Method"
    .filter((path) => !NOT_RETRIED.has(path))
    .map((path) => {
      const [service, method] = path.split("/");
      return { service, method };
    });
  const config = {
    methodConfig: [
      {
        name: names,
        retryPolicy: {
          maxAttempts: Math.min(maxAttempts, 5),
          initialBackoff: "0.1s",
          maxBackoff: "2s",
          backoffMultiplier: 2,
          retryableStatusCodes: ["UNAVAILABLE"],
        },
      },
    ],
  };
  return { "grpc.enable_retries": 1, "grpc.service_config": JSON.stringify(config) };
}
